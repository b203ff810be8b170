"""The client's async forms on PostgreSQL: psycopg's async connections vs a thread per call.

W1's loop (start a ten-step workflow, await its result, repeat) written as an
asyncio program, and the same with 50 callers at once, each against a fresh
database with an in-process worker. ``native`` is what ``app.astart`` and
``handle.aresult`` do on PostgreSQL (the call runs on the event loop; see
``perdure.store.postgres.bridge``); ``threads`` hides the store's
``call_async`` so every call goes through ``asyncio.to_thread``, as before.
Modes alternate within each repeat. Runs in the project's ``.venv``::

    .venv/bin/python bench/async_client.py [--workflows 200] [--callers 50] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import threading
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common
import perdure_workloads as workloads


async def _sequential(app: Any, count: int) -> float:
    for _ in range(5):
        await (await app.astart("ten_steps", 10)).aresult(timeout=60)
    start = time.perf_counter()
    for _ in range(count):
        await (await app.astart("ten_steps", 10)).aresult(timeout=60)
    return time.perf_counter() - start


async def _concurrent(app: Any, callers: int, each: int) -> tuple[float, int]:
    peak = [threading.active_count()]

    async def caller() -> None:
        for _ in range(each):
            await (await app.astart("ten_steps", 10)).aresult(timeout=120)
            peak[0] = max(peak[0], threading.active_count())

    start = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(callers)))
    return time.perf_counter() - start, peak[0]


def measure(mode: str, workflows: int, callers: int) -> dict[str, float]:
    db = common.create_database("postgres")
    try:
        app = workloads.build(db.perdure_url)
        store = app.store
        if mode == "threads":
            store.call_async = None  # type: ignore[attr-defined]
        try:
            with app.worker(concurrency=16):
                cpu = time.process_time()
                took = asyncio.run(_sequential(app, workflows))
                cpu = time.process_time() - cpu
                wall, peak = asyncio.run(_concurrent(app, callers, 2))
        finally:
            app.close()
    finally:
        common.drop_database(db)
    steps = workflows * 10
    return {
        "us_per_step": took / steps * 1e6,
        "cpu_us_per_step": cpu / steps * 1e6,
        "concurrent_wf_per_s": callers * 2 / wall,
        "peak_threads": peak,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workflows", type=int, default=200)
    parser.add_argument("--callers", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    options = parser.parse_args()
    found: dict[str, list[dict[str, float]]] = {"native": [], "threads": []}
    for _ in range(options.repeats):
        for mode in found:
            found[mode].append(measure(mode, options.workflows, options.callers))
            print(mode, found[mode][-1], flush=True)
    print()
    print("| mode | µs per step (W1 loop) | CPU µs per step | workflows/s, "
          f"{options.callers} callers | peak threads |")
    print("|---|---|---|---|---|")
    for mode, runs in found.items():
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        print(f"| {mode} | {med['us_per_step']:.0f} | {med['cpu_us_per_step']:.0f} | "
              f"{med['concurrent_wf_per_s']:.0f} | {med['peak_threads']:.0f} |")


if __name__ == "__main__":
    main()
