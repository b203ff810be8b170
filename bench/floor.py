"""The floor: one-row INSERT + COMMIT per second on the same store, 1 and 8 connections.

SQLite: WAL, synchronous=FULL, each commit its own ``BEGIN IMMEDIATE; INSERT;
COMMIT`` (what perdure's store does per transaction). PostgreSQL: autocommit
INSERTs with the server's default fsync/synchronous_commit. Eight connections
are eight threads (both drivers release the GIL while waiting on the disk or
the server).

Run by run.py in a fresh subprocess: ``python bench/floor.py FLOOR`` with
BENCH_DB and BENCH_RESULT in the environment.
"""

from __future__ import annotations

import os
import sqlite3
import sys
import threading
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common


def _sqlite_conn(path: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    return conn


def _connect(db: common.Database) -> Any:
    if db.kind == "sqlite":
        return _sqlite_conn(db.path)
    import psycopg

    return psycopg.connect(common.pg_url(db.name), autocommit=True)


def _insert_fn(db: common.Database, conn: Any):
    if db.kind == "sqlite":
        def insert() -> None:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO floor (v) VALUES ('x')")
            conn.execute("COMMIT")
    else:
        def insert() -> None:
            conn.execute("INSERT INTO floor (v) VALUES ('x')")
    return insert


def measure(db: common.Database, connections: int, seconds: float) -> dict[str, Any]:
    conns = [_connect(db) for _ in range(connections)]
    counts = [0] * connections
    stop = threading.Event()
    start = threading.Barrier(connections + 1)

    def loop(i: int) -> None:
        insert = _insert_fn(db, conns[i])
        for _ in range(20):  # warm-up, not counted
            insert()
        start.wait()
        n = 0
        while not stop.is_set():
            insert()
            n += 1
        counts[i] = n

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(connections)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    for c in conns:
        c.close()
    total = sum(counts)
    per_s = total / elapsed
    return {"commits_per_s": per_s, "us_per_commit": 1e6 / per_s,
            "commits": total, "seconds": elapsed}


def main() -> None:
    db = common.database_from_env()
    quick = os.environ.get("BENCH_QUICK") == "1"
    seconds = float(os.environ.get("BENCH_FLOOR_SECONDS", "1.5" if quick else "4"))
    conn = _connect(db)
    if db.kind == "sqlite":
        conn.execute("CREATE TABLE floor (id INTEGER PRIMARY KEY, v TEXT NOT NULL)")
        mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
        sync = conn.execute("PRAGMA synchronous").fetchone()[0]
        settings = {"journal_mode": mode, "synchronous": sync}
    else:
        conn.execute("CREATE TABLE floor (id bigserial PRIMARY KEY, v text NOT NULL)")
        settings = {k: conn.execute(f"SHOW {k}").fetchone()[0]
                    for k in ("fsync", "synchronous_commit", "wal_sync_method", "full_page_writes")}
    conn.close()
    one = measure(db, 1, seconds)
    eight = measure(db, 8, seconds)
    common.write_result({
        "metrics": {
            "commit_us_1conn": one["us_per_commit"],
            "commits_per_s_1conn": one["commits_per_s"],
            "commits_per_s_8conn": eight["commits_per_s"],
            # the time per commit as seen by one of the 8 writers
            "commit_us_8conn_each": 8e6 / eight["commits_per_s"],
        },
        "detail": {"one": one, "eight": eight, "settings": settings},
    })


if __name__ == "__main__":
    main()
