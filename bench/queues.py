"""Queues: W3 through a queue of concurrency 50 against the default path, and claim cost.

Part 1 (W3 variant): 2,000 runs of 10 steps started up front, then one
in-process worker (concurrency 64, thread liveness) runs them all; steps per
second from the worker's start to the last run's end, once with every run in
a queue with ``concurrency=50`` and once with no queue.

Part 2 (W7-style claim cost): ``store.claim(limit=1)`` of one ready run in no
queue at a time (start, claim, finish), first on an empty store, then with
100,000 runs queued behind a full queue (``concurrency=1``, its one slot
held), bulk-inserted with SQL. Then the same with the ready run itself in a
second limited queue (``concurrency=1000``). Runs in the project's ``.venv``::

    .venv/bin/python bench/queues.py [--stores sqlite,postgres] [--backlog 100000] \
        [--claims 500] [--parts w3,claims]

Target: claim p99 with the backlog <= 2x the empty store's.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common

import perdure
from perdure.store import open_store, port, queueport

APP = "bench_queues"
TARGET_RATIO = 2.0


def _app(url: str) -> perdure.App:
    app = perdure.App(url, name=APP)
    app.queue("wide", concurrency=50)

    @app.step()
    def tick(i: int) -> int:
        return i

    @app.workflow()
    def ten_steps(ctx: perdure.Context, n: int) -> int:
        return sum(tick(i) for i in range(n))

    return app


def throughput(kind: str, queued: bool, count: int) -> dict[str, Any]:
    db = common.create_database(kind)
    try:
        app = _app(db.perdure_url)
        placed = {"queue": "wide"} if queued else {}
        handles = [app.start("ten_steps", 10, **placed) for _ in range(count)]
        t0 = time.perf_counter()
        with app.worker(concurrency=64, liveness="thread", poll_interval=0.05):
            for handle in handles:
                handle.result(timeout=900)
        elapsed = time.perf_counter() - t0
        app.close()
        return {"steps_per_s": count * 10 / elapsed, "elapsed_s": elapsed}
    finally:
        common.drop_database(db)


def _bulk_queue(db: common.Database, backlog: int) -> None:
    """Insert ``backlog`` queued runs of the queue ``full`` straight into the runs table."""
    conn = db.raw_connect()
    try:
        if db.kind == "sqlite":
            now = int(time.time() * 1_000_000) - 60_000_000
            conn.execute(
                "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?) "
                "INSERT INTO runs (run_id, app, workflow, version, state, input, created_at, "
                "updated_at, ledger_sequence, ledger_limit, queue, queue_key, priority) "
                "SELECT 'bulk-' || i, ?, 'ten_steps', '1', 'queued', '{}', ? + i, ? + i, 1, 256, "
                "'full', 'k' || (i % 100), 0 FROM n",
                (backlog, APP, now, now),
            )
        else:
            conn.execute(
                "INSERT INTO perdure.runs (run_id, app, workflow, version, state, input, "
                "created_at, updated_at, ledger_sequence, ledger_limit, queue, queue_key, "
                "priority) SELECT 'bulk-' || i, %s, 'ten_steps', '1', 'queued', '{}', "
                "now() - interval '1 minute' + i * interval '1 microsecond', now(), 1, 256, "
                "'full', 'k' || (i %% 100), 0 FROM generate_series(1, %s) AS i",
                (APP, backlog),
            )
            conn.execute("ANALYZE perdure.runs")
    finally:
        conn.close()


def _claims(store: Any, claims: int, queue: str | None) -> dict[str, float]:
    """Time claim(limit=1) of one fresh ready run at a time."""
    times: list[float] = []
    for _ in range(claims):
        new = port.NewRun(
            run_id=uuid.uuid4().hex,
            app=APP,
            workflow="one",
            version="1",
            input="{}",
            queue=queue,
        )
        store.create_run(new)
        t0 = time.perf_counter()
        got = store.claim(APP, "bench-1", [("one", "1")], lease_ttl=60, limit=1)
        times.append((time.perf_counter() - t0) * 1e3)
        assert len(got) == 1, got
        store.finish(got[0].claim, [], state="succeeded", result="null")
    return common.summary(times)


def claim_cost(kind: str, backlog: int, claims: int) -> dict[str, Any]:
    db = common.create_database(kind)
    try:
        store = open_store(db.perdure_url)
        assert isinstance(store, queueport.QueueStore)
        store.save_queues(
            APP, [queueport.QueueSpec("full", concurrency=1), queueport.QueueSpec("room", 1000)]
        )
        empty_free = _claims(store, claims, None)
        empty_room = _claims(store, claims, "room")
        _bulk_queue(db, backlog)
        held = store.claim(APP, "bench-0", [("ten_steps", "1")], lease_ttl=3600, limit=1)
        assert len(held) == 1 and held[0].run.queue == "full"  # the queue is now full
        big_free = _claims(store, claims, None)
        big_room = _claims(store, claims, "room")
        store.close()
        return {
            "empty_free": empty_free,
            "big_free": big_free,
            "empty_room": empty_room,
            "big_room": big_room,
        }
    finally:
        common.drop_database(db)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--stores", default="sqlite,postgres")
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--backlog", type=int, default=100_000)
    parser.add_argument("--claims", type=int, default=500)
    parser.add_argument("--parts", default="w3,claims", help="w3, claims or both (default)")
    options = parser.parse_args()
    parts = set(options.parts.split(","))
    for kind in options.stores.split(","):
        if "w3" in parts:
            plain = throughput(kind, False, options.runs)
            queued = throughput(kind, True, options.runs)
            print(
                f"| {kind} | W3 {options.runs}x10 steps/s | default {plain['steps_per_s']:.0f} "
                f"| queue (concurrency 50) {queued['steps_per_s']:.0f} "
                f"| ratio {queued['steps_per_s'] / plain['steps_per_s']:.2f} |",
                flush=True,
            )
        if "claims" not in parts:
            continue
        cost = claim_cost(kind, options.backlog, options.claims)
        for run_in in ("free", "room"):
            empty, big = cost[f"empty_{run_in}"], cost[f"big_{run_in}"]
            ratio = big["p99"] / empty["p99"]
            verdict = "PASS" if ratio <= TARGET_RATIO else "FAIL"
            print(
                f"| {kind} | claim ms, run in {'no queue' if run_in == 'free' else 'a queue'} "
                f"| empty p50 {empty['p50']:.2f} p99 {empty['p99']:.2f} "
                f"| {options.backlog} behind a full queue p50 {big['p50']:.2f} "
                f"p99 {big['p99']:.2f} | ratio {ratio:.2f} {verdict} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
