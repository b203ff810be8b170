"""Count the statements perdure runs per 0-step workflow, start to result, with a worker in-process.

    PYTHONPATH=src bench/.venv/bin/python bench/claim_statements.py [RUNS] [STORE_URL]

Without a store URL, a fresh PostgreSQL database ``perdure_claim_statements``
on 127.0.0.1:5432 is created (and dropped after). Prints, per named query, how
many times one workflow ran it and its median time in milliseconds, then the
round trips per workflow: every statement sent (named or not, the claim's
transaction statements included) and each BEGIN and COMMIT psycopg sends for
a transaction block.
"""

from __future__ import annotations

import collections
import statistics
import sys
import time
from typing import Any

import perdure
import psycopg

SERVER = "postgresql://postgres@127.0.0.1:5432/postgres"
DB = "perdure_claim_statements"


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    url = sys.argv[2] if len(sys.argv) > 2 else None
    if url is None:
        with psycopg.connect(SERVER, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {DB}")
            conn.execute(f"CREATE DATABASE {DB}")
        url = SERVER.rsplit("/", 1)[0] + "/" + DB
    app = perdure.App(url, name="statements")

    @app.workflow(name="zero")
    def zero(ctx: perdure.Context) -> int:
        return 1

    store: Any = app.store
    seen: list[tuple[str, float]] = []
    execute = store._exec

    def counted(cur: Any, query: str, **params: Any) -> Any:
        started = time.perf_counter()
        try:
            return execute(cur, query, **params)
        finally:
            seen.append((query, time.perf_counter() - started))

    store._exec = counted
    trips = collections.Counter()
    cursor_execute = psycopg.Cursor.execute
    enter, leave = psycopg.Transaction.__enter__, psycopg.Transaction.__exit__

    def sent(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        trips["statements"] += 1
        return cursor_execute(self, query, *args, **kwargs)

    def begun(self: Any) -> Any:
        trips["BEGIN"] += 1
        return enter(self)

    def ended(self: Any, *args: Any) -> Any:
        trips["COMMIT or ROLLBACK"] += 1
        return leave(self, *args)

    psycopg.Cursor.execute = sent  # type: ignore[method-assign]
    psycopg.Transaction.__enter__ = begun  # type: ignore[method-assign]
    psycopg.Transaction.__exit__ = ended  # type: ignore[method-assign]
    with app.worker():
        for _ in range(20):  # warm up: prepared statements, connections
            app.start("zero").result(timeout=30)
        seen.clear()
        trips.clear()
        for _ in range(runs):
            app.start("zero").result(timeout=30)
    app.close()
    counts = collections.Counter(query for query, _ in seen)
    for query, n in counts.most_common():
        ms = statistics.median(d for q, d in seen if q == query) * 1e3
        print(f"{query:28s} {n / runs:5.2f} per run   {ms:6.3f} ms median")
    for what, n in trips.items():
        print(f"round trips: {what:15s} {n / runs:5.2f} per run")
    print(f"round trips: {'all':15s} {sum(trips.values()) / runs:5.2f} per run")
    if len(sys.argv) <= 2:
        with psycopg.connect(SERVER, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {DB}")


if __name__ == "__main__":
    main()
