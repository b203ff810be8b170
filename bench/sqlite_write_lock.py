"""W3's shape in one process on SQLite: how long the write transaction is open.

    PYTHONPATH=src .venv/bin/python bench/sqlite_write_lock.py 1500

Starts N ten-step no-op runs, drains them with one in-process worker, and
prints the share of the drain's wall time during which the store's write
transaction (``BEGIN IMMEDIATE`` to the end of its ``COMMIT``) was open, the
share spent in ``COMMIT``, and the writes each commit carried. SQLite has
one writer per file: while one process holds the transaction open, no other
process writes, so this share bounds what a second worker process can add.
It times the adapter's group commit from outside (wrapping two of its
methods); measuring only.
"""

from __future__ import annotations

import os
import sys

# bench/profile.py would shadow the standard library's profile, which cProfile
# imports: this folder goes after the standard library on the path (see loops.py).
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    sys.path.append(sys.path.pop(0))

import sqlite3
import tempfile
import time
from typing import Any

import loops

from perdure.store.sqlite import connection

_held = {"open": 0.0, "commit": 0.0, "groups": 0.0, "began": 0.0}
_join, _commit = connection.Connections._join_group, connection.Connections._commit


def _timed_join(self: connection.Connections) -> Any:
    if self._group is None:
        _held["began"] = time.perf_counter()
    return _join(self)


def _timed_commit(self: connection.Connections, group: Any, *, abandon: bool = False) -> None:
    t = time.perf_counter()
    try:
        _commit(self, group, abandon=abandon)
    finally:
        end = time.perf_counter()
        _held["commit"] += end - t
        _held["open"] += end - _held["began"]
        _held["groups"] += 1


def main() -> None:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 1500
    path = os.path.join(tempfile.mkdtemp(), "bench.db")
    app = loops.ten_step_app(f"sqlite:///{path}")

    for _ in range(count):
        app.start("ten_steps", 10)
    db = sqlite3.connect(path)
    connection.Connections._join_group = _timed_join  # type: ignore[method-assign]
    connection.Connections._commit = _timed_commit  # type: ignore[method-assign]
    wall = time.perf_counter()
    with app.worker():
        while (
            db.execute("SELECT count(*) FROM runs WHERE state = 'succeeded'").fetchone()[0] < count
        ):
            time.sleep(0.05)
        wall = time.perf_counter() - wall
    app.close()
    steps = count * 10
    print(
        f"steps/s {steps / wall:,.0f}; write transaction open {_held['open'] / wall:.0%} of the"
        f" drain (in COMMIT {_held['commit'] / wall:.0%}); {_held['open'] / steps * 1e6:.0f} us"
        f" open per step; {_held['commit'] / _held['groups'] * 1e6:.0f} us per COMMIT;"
        f" {steps / _held['groups']:.1f} steps per commit"
    )


if __name__ == "__main__":
    main()
