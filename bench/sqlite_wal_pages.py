"""What a commit writes to SQLite's WAL in W1's loop: pages per commit, and whose pages.

    PYTHONPATH=src .venv/bin/python bench/sqlite_wal_pages.py 300 10    # 300 runs of 10 steps
    PYTHONPATH=src .venv/bin/python bench/sqlite_wal_pages.py 20 100    # mostly step commits

Runs N workflows of S no-op steps one by one with an in-process worker on a
fresh SQLite file whose connections never checkpoint (``PRAGMA
wal_autocheckpoint = 0``, set from outside the store; measuring only), then
reads the WAL's frame headers: the pages each commit wrote, counted per
commit and per step, and the most common sets of tables and indexes those
pages belong to (SQLite's ``dbstat`` table, when the library has it).
"""

from __future__ import annotations

import os
import sys

# bench/profile.py would shadow the standard library's profile, which cProfile
# imports: this folder goes after the standard library on the path (see loops.py).
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    sys.path.append(sys.path.pop(0))

import collections
import sqlite3
import struct
import tempfile
from typing import Any

import loops

from perdure.store.sqlite import connection

_WAL_HEADER, _FRAME_HEADER = 32, 24


def _never_checkpoint() -> None:
    connect = connection.Connections._connect

    def patched(self: Any) -> sqlite3.Connection:
        conn = connect(self)
        conn.execute("PRAGMA wal_autocheckpoint = 0")
        return conn

    connection.Connections._connect = patched  # type: ignore[method-assign]


def _commits(wal: bytes) -> list[list[int]]:
    """The page numbers of each committed transaction in a WAL file, in order."""
    (page_size,) = struct.unpack(">I", wal[8:12])
    commits: list[list[int]] = []
    pages: list[int] = []
    offset = _WAL_HEADER
    while offset + _FRAME_HEADER + page_size <= len(wal):
        page, size_after = struct.unpack(">II", wal[offset : offset + 8])
        pages.append(page)
        if size_after:  # the commit's last frame records the file's size
            commits.append(pages)
            pages = []
        offset += _FRAME_HEADER + page_size
    return commits


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    path = os.path.join(tempfile.mkdtemp(), "bench.db")
    _never_checkpoint()
    app = loops.ten_step_app(f"sqlite:///{path}")
    with app.worker():
        for _ in range(10):
            app.start("ten_steps", steps).result(timeout=60)
        # Start the WAL afresh: everything in it from here on is the measured loop.
        with sqlite3.connect(path) as db:
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        for _ in range(runs):
            app.start("ten_steps", steps).result(timeout=60)
    with open(path + "-wal", "rb") as f:
        commits = _commits(f.read())
    app.close()
    frames = sum(len(c) for c in commits)
    print(
        f"{len(commits)} commits for {runs * steps} steps ({len(commits) / (runs * steps):.2f}"
        f" per step); WAL pages per commit {frames / len(commits):.2f}, per step"
        f" {frames / (runs * steps):.2f}"
    )
    db = sqlite3.connect(path)
    try:
        owner = dict(db.execute("SELECT pageno, name FROM dbstat").fetchall())
    except sqlite3.OperationalError:
        return  # no dbstat in this SQLite
    shapes = collections.Counter(
        " + ".join(sorted(owner.get(p, f"page {p}") for p in c)) for c in commits
    )
    for shape, n in shapes.most_common(6):
        print(f"  {n / len(commits):4.0%}  {shape}")


if __name__ == "__main__":
    main()
