"""W1's loop in one process: where a step's wall time goes, store calls against the rest.

    PYTHONPATH=src .venv/bin/python bench/w1_split.py 300                      # SQLite
    PYTHONPATH=src .venv/bin/python bench/w1_split.py 300 postgresql://...     # PostgreSQL

Starts and awaits N ten-step no-op workflows one by one with an in-process
worker (after 10 warm-up runs), as W1 does, and prints per step: the wall
time; this process's CPU; the store's calls (``_transact``: every write and
read the engine makes), their wall time and the client CPU spent in them.
On SQLite it also splits out the named statements, ``BEGIN IMMEDIATE`` and
``COMMIT`` (wall and CPU: the WAL's pages written and synced). The rest of
the wall time is the engine's Python outside the store and the thread
handovers. It wraps the adapters' methods from outside; measuring only.

With ``--profile`` it runs the same loop under cProfile instead (every
thread, timed by thread CPU, so Python is inflated against C) and prints the
CPU's split between the driver (psycopg's Python), perdure's store code,
perdure's engine and the rest.
"""

from __future__ import annotations

import os
import sys

# bench/profile.py would shadow the standard library's profile, which cProfile
# imports: this folder goes after the standard library on the path (see loops.py).
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    sys.path.append(sys.path.pop(0))

import collections
import cProfile
import pstats
import tempfile
import time
from collections.abc import Callable
from typing import Any

import loops

_acc: dict[str, float] = {}


def _timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        cpu, wall = time.thread_time(), time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            _acc[f"{name}_cpu"] = _acc.get(f"{name}_cpu", 0.0) + time.thread_time() - cpu
            _acc[f"{name}_wall"] = _acc.get(f"{name}_wall", 0.0) + time.perf_counter() - wall
            _acc[f"{name}_calls"] = _acc.get(f"{name}_calls", 0.0) + 1

    return wrapper


def _instrument(url: str) -> None:
    if url.startswith("sqlite"):
        from perdure.store.sqlite import connection as sqlite_conn

        cls: Any = sqlite_conn.Connections
        sqlite_conn._execute = _timed("statements", sqlite_conn._execute)  # type: ignore[assignment]
        cls._join_group = _timed("begin", cls._join_group)
        cls._commit = _timed("commit", cls._commit)
    else:
        from perdure.store.postgres import connection as pg_conn

        cls = next(
            v for v in vars(pg_conn).values() if isinstance(v, type) and "_transact" in vars(v)
        )
    cls._transact = _timed("store", cls._transact)


def _split(profiles: list[cProfile.Profile]) -> str:
    stats = pstats.Stats(profiles[0])
    for profile in profiles[1:]:
        stats.add(profile)
    shares: collections.Counter[str] = collections.Counter()
    for (path, _, _), row in stats.stats.items():  # type: ignore[attr-defined]
        if "/psycopg" in path:
            shares["psycopg"] += row[2]
        elif "/perdure/store/" in path:
            shares["perdure store"] += row[2]
        elif "/perdure/" in path:
            shares["perdure engine"] += row[2]
        else:
            shares["C calls, stdlib, waits"] += row[2]
    total = sum(shares.values())
    return "; ".join(f"{name} {cpu / total:.0%}" for name, cpu in shares.most_common())


def main() -> None:
    argv = [a for a in sys.argv[1:] if a != "--profile"]
    profiling = len(argv) < len(sys.argv) - 1
    count = int(argv[0]) if argv else 300
    url = argv[1] if len(argv) > 1 else f"sqlite:///{tempfile.mkdtemp()}/bench.db"
    profiles: list[cProfile.Profile] = []
    if profiling:
        profiles = loops.profile_threads(cpu=True)
    else:
        _instrument(url)
    app = loops.ten_step_app(url)

    with app.worker():
        for _ in range(10):
            app.start("ten_steps", 10).result(timeout=30)
        _acc.clear()
        main_profile = cProfile.Profile(time.thread_time)
        if profiling:
            profiles.append(main_profile)
            main_profile.enable()
        cpu, wall = time.process_time(), time.perf_counter()
        for _ in range(count):
            app.start("ten_steps", 10).result(timeout=30)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        main_profile.disable()
    app.close()
    if profiling:
        print(_split(profiles))
        return
    steps = count * 10

    def us(x: float) -> str:
        return f"{x / steps * 1e6:.0f}"

    line = (
        f"wall {us(wall)} us/step; process CPU {us(cpu)}; store calls"
        f" {_acc['store_calls'] / steps:.2f}/step: wall {us(_acc['store_wall'])},"
        f" client CPU {us(_acc['store_cpu'])}"
    )
    if "commit_calls" in _acc:
        line += (
            f"; of which statements {us(_acc['statements_wall'])} (CPU"
            f" {us(_acc['statements_cpu'])}), BEGIN {us(_acc['begin_wall'])}, COMMIT"
            f" {us(_acc['commit_wall'])} (CPU {us(_acc['commit_cpu'])},"
            f" {_acc['commit_calls'] / steps:.2f}/step)"
        )
    print(line)


if __name__ == "__main__":
    main()
