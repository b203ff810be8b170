"""Time two PostgreSQL store calls on their own: an update's delivery and a claim.

    PYTHONPATH=src bench/.venv/bin/python bench/store_calls.py [N]

A fresh database on 127.0.0.1:5432 is created and dropped after. ``deliver``
times ``deliver_update`` of N updates to one queued run (each a new id);
``claim`` starts N runs, then times N claims of one run each by a worker
that serves their workflow. Prints the median and the tenth percentile of
each, in microseconds. Nothing else runs: no worker, no second process.
"""

from __future__ import annotations

import statistics
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

import perdure
import psycopg
from perdure.store import liveport

SERVER = "postgresql://postgres@127.0.0.1:5432/postgres"


def _timed(call: Callable[[int], Any], n: int) -> str:
    took = []
    for i in range(n):
        started = time.perf_counter_ns()
        call(i)
        took.append((time.perf_counter_ns() - started) / 1e3)
    took.sort()
    return f"median {statistics.median(took):.0f} us, p10 {took[len(took) // 10]:.0f} us"


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    db = f"perdure_store_calls_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(SERVER, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {db}")
    try:
        app = perdure.App(SERVER.rsplit("/", 1)[0] + "/" + db, name="calls")

        @app.workflow(name="idle")
        def idle(ctx: perdure.Context) -> int:
            return 1

        store: Any = app.store
        target = app.start("idle").run_id
        live = liveport.require(store)
        deliver = _timed(
            lambda i: live.deliver_update(liveport.NewUpdate(target, f"u{i}", "ask", "1")), n
        )
        runs = [app.start("idle").run_id for _ in range(n)]
        run = store.get_run(runs[0])
        wanted = [(run.workflow, run.version)]
        claim = _timed(lambda i: store.claim("calls", "w-1", wanted, lease_ttl=30), n)
        app.close()
        print(f"deliver_update  {deliver}")
        print(f"claim (1 run)   {claim}")
    finally:
        with psycopg.connect(SERVER, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")


if __name__ == "__main__":
    main()
