"""Plans: tasks per second through a wide plan and a chain, next to a ctx.map fan-out.

Three shapes, each run once per repeat against a fresh database, served by 1
or 2 worker processes (default worker options, concurrency 8):

- ``wide``: a plan of N independent tasks (default 1,000), each returning at once;
- ``chain``: a plan of M tasks (default 200), each after the one before it;
- ``map``: a workflow that starts N child runs with ``ctx.map`` (each child a
  workflow with no step) and sums their results: the way to fan out without plans.

The clock starts just before ``app.start`` in this process (the start itself,
which writes every task row or the parent run, is counted) and stops when
``handle.result()`` returns (it polls at most every 20 ms). The worker
processes are started and serving before that. Runs in the project's ``.venv``::

    .venv/bin/python bench/plans.py [--stores sqlite,postgres] [--shapes wide,chain,map] \
        [--workers 1,2] [--repeats 3] [--wide 1000] [--chain 200] [--map 1000]

Prints one markdown table of medians (and every repeat's time) at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common

import perdure

APP = "bench_plans"


# -- the app ----------------------------------------------------------------------


def _root(i: int) -> Callable[[], int]:
    def task() -> int:
        return i

    return task


def _link(i: int) -> Callable[..., int]:
    def task(**parents: int) -> int:
        return sum(parents.values()) + 1

    return task


def build(url: str, wide: int, chain: int) -> perdure.App:
    """The app: plans ``wide`` and ``chain`` of the given sizes, workflows ``fan`` and ``leaf``."""
    app = perdure.App(url, name=APP)
    flat = app.plan("wide", version="1")
    for i in range(wide):
        flat.task(name=f"t{i}")(_root(i))
    line = app.plan("chain", version="1")
    line.task(name="c0")(_root(0))
    for i in range(1, chain):
        line.task(name=f"c{i}", after=[f"c{i - 1}"])(_link(i))

    @app.workflow(name="leaf")
    def leaf(ctx: perdure.Context, i: int) -> int:
        return i

    @app.workflow(name="fan")
    def fan(ctx: perdure.Context, n: int) -> int:
        handles = ctx.map(leaf, range(n))
        return sum(h.result() for h in handles)

    return app


# -- the worker process -----------------------------------------------------------


def worker_main() -> None:
    db = common.database_from_env()
    sizes = json.loads(os.environ["BENCH_PLAN_SIZES"])
    app = build(db.perdure_url, sizes["wide"], sizes["chain"])
    _ = app.store  # open (and migrate) the store now
    common.say({"event": "ready", "pid": os.getpid()})
    if common.read_command().get("cmd") != "go":
        return
    worker = app.worker()  # default options
    worker.start()
    common.say({"event": "started", "worker_id": worker.worker_id})
    common.read_command()  # stop (or EOF)
    worker.stop(timeout=30)
    app.close()
    common.say({"event": "stopped"})


# -- one measurement ----------------------------------------------------------------


def measure(kind: str, shape: str, workers: int, sizes: dict[str, int]) -> dict[str, float]:
    """Run one shape once on a fresh database with ``workers`` processes; return timings."""
    db = common.create_database(kind)
    env = {
        "BENCH_DB": json.dumps(vars(db)),
        "BENCH_PLAN_SIZES": json.dumps(sizes),
    }
    app = build(db.perdure_url, sizes["wide"], sizes["chain"])
    app.migrate()
    argv = [common.python(), os.path.abspath(__file__), "worker"]
    children = [common.Child(argv, env=env) for _ in range(workers)]
    try:
        for c in children:
            c.expect("ready")
        for c in children:
            c.send({"cmd": "go"})
        for c in children:
            c.expect("started")
        count = sizes[shape]
        t0 = time.perf_counter()
        handle = app.start("fan", count) if shape == "map" else app.start(shape)
        started = time.perf_counter() - t0
        result = handle.result(timeout=600)
        elapsed = time.perf_counter() - t0
        _check(shape, count, result)
        return {"elapsed_s": elapsed, "start_s": started, "per_s": count / elapsed}
    finally:
        for c in children:
            c.stop()
        app.close()
        common.drop_database(db)


def _check(shape: str, count: int, result: Any) -> None:
    if shape == "map":
        ok = result == count * (count - 1) // 2
    elif shape == "wide":
        ok = isinstance(result, dict) and len(result) == count
    else:
        ok = isinstance(result, dict) and result.get(f"c{count - 1}") == count - 1
    if not ok:
        raise RuntimeError(f"{shape}: unexpected result {str(result)[:200]}")


# -- the table ----------------------------------------------------------------------

_LABEL = {
    "wide": "plan, {n} independent tasks",
    "chain": "plan, chain of {n} tasks",
    "map": "ctx.map, {n} child runs",
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--stores", default="sqlite,postgres")
    parser.add_argument("--shapes", default="wide,chain,map")
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--wide", type=int, default=1000)
    parser.add_argument("--chain", type=int, default=200)
    parser.add_argument("--map", type=int, default=1000)
    options = parser.parse_args()
    sizes = {"wide": options.wide, "chain": options.chain, "map": options.map}
    stores = options.stores.split(",")
    shapes = options.shapes.split(",")
    counts = [int(w) for w in options.workers.split(",")]
    jobs = [(k, s, w) for k in stores for s in shapes for w in counts]
    found: dict[tuple[str, str, int], list[dict[str, float]]] = {j: [] for j in jobs}
    began = time.perf_counter()
    # Repeats interleaved: every configuration once, then every one again.
    for repeat in range(options.repeats):
        for job in jobs:
            got = measure(*job, sizes)
            found[job].append(got)
            print(
                f"# repeat {repeat + 1} {job[0]} {job[1]} workers={job[2]}: "
                f"{got['elapsed_s']:.2f}s ({got['per_s']:.0f}/s, start {got['start_s']:.3f}s)",
                flush=True,
            )
    print(f"# total {time.perf_counter() - began:.0f}s\n")
    print(
        "| store | shape | worker processes | tasks or children per s (median) "
        "| end to end s (median) | every repeat, s | app.start s (median) |"
    )
    print("|---|---|---|---|---|---|---|")
    for kind, shape, workers in jobs:
        runs = found[(kind, shape, workers)]
        elapsed = statistics.median(r["elapsed_s"] for r in runs)
        start = statistics.median(r["start_s"] for r in runs)
        every = ", ".join(f"{r['elapsed_s']:.2f}" for r in runs)
        label = _LABEL[shape].format(n=f"{sizes[shape]:,}")
        print(
            f"| {kind} | {label} | {workers} | {sizes[shape] / elapsed:,.0f} "
            f"| {elapsed:.2f} | {every} | {start:.3f} |"
        )


if __name__ == "__main__":
    if sys.argv[1:2] == ["worker"]:
        worker_main()
    else:
        main()
