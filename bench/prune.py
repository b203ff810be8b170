"""Claim latency while pruning: ``store.claim(limit=1)`` on W7's big store, idle and during.

Builds W7's store (1,000,000 succeeded and 100,000 waiting runs, bulk SQL
straight into the tables; ``--scale`` shrinks it), then times
``store.claim(limit=1)`` with exactly one ready run at a time (start, claim,
finish), first with nothing else going on, then while another process prunes
every finished run with ``perdure prune``'s loop,
``perdure.store.retention.prune_paced`` (batches of ``store.prune(app,
ended_before, 500)`` until one deletes nothing, resting ``--pause-factor``
times each batch's duration after it; 0 runs them back to back, as
``perdure prune`` did before it was paced). Runs in the project's ``.venv``::

    .venv/bin/python bench/prune.py [--stores sqlite,postgres] [--scale 1] [--claims 1000] \\
        [--batch 500] [--pause-factor 3]

Target: claim p99 during pruning <= 2x the idle p99.
"""

from __future__ import annotations

import argparse
import datetime as dt
import multiprocessing
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common
import perdure_workloads as workloads

from perdure.store import open_store, retention

TARGET_RATIO = 2.0


def _prune_all(
    url: str, batch: int, pause_factor: float, started: Any, done: Any, report: Any
) -> None:
    """Prune every run that ended before the bulk load's newest, as ``perdure prune`` does."""
    store = open_store(url)
    assert isinstance(store, retention.PrunableStore)
    # The bulk-loaded runs ended at least a minute ago; the claimer's own runs are newer.
    cutoff = store.now() - dt.timedelta(seconds=30)
    batches: list[float] = []
    started.set()
    t0 = time.perf_counter()
    deleted = retention.prune_paced(
        store,
        workloads.APP,
        cutoff,
        batch=batch,
        pause_factor=pause_factor,
        on_batch=lambda _n, took: batches.append(took * 1e3),
    )
    report.put(
        {
            "deleted": deleted,
            "prune_s": time.perf_counter() - t0,
            "batch_ms": common.summary(batches),
        }
    )
    done.set()
    store.close()


def _one_claim(app: Any, versions: Any) -> float:
    store = app.store
    app.start("zero_steps")
    s = time.perf_counter()
    claimed = store.claim(workloads.APP, "prune-claimer", versions, lease_ttl=30, limit=1)
    took = (time.perf_counter() - s) * 1e3
    assert len(claimed) == 1, claimed
    store.finish(claimed[0].claim, [], state="succeeded", result="0")
    return took


def measure(
    kind: str, scale: float, claims: int, batch: int, pause_factor: float
) -> dict[str, Any]:
    os.environ["BENCH_W7_SCALE"] = str(scale)
    db = common.create_database(kind)
    try:
        made = workloads.generate_template(db)
        app = workloads.build(db.perdure_url)
        try:
            versions = app.workflow_versions()
            for _ in range(50):
                _one_claim(app, versions)
            idle = [_one_claim(app, versions) for _ in range(claims)]
            ctx = multiprocessing.get_context("spawn")
            started, done, report = ctx.Event(), ctx.Event(), ctx.Queue()
            pruner = ctx.Process(
                target=_prune_all, args=(db.perdure_url, batch, pause_factor, started, done, report)
            )
            pruner.start()
            started.wait(120)
            during = []
            while not done.is_set():
                during.append(_one_claim(app, versions))
            found = report.get(timeout=60)
            pruner.join(60)
            return {
                "store": kind,
                **made,
                "idle": common.summary(idle),
                "during": common.summary(during),
                **found,
            }
        finally:
            app.close()
    finally:
        common.drop_database(db)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stores", default="sqlite,postgres")
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--claims", type=int, default=1000)
    parser.add_argument(
        "--batch", type=int, default=retention.DEFAULT_BATCH, help="runs per prune call"
    )
    parser.add_argument(
        "--pause-factor",
        type=float,
        default=retention.DEFAULT_PAUSE_FACTOR,
        help="rest after each batch, in multiples of its duration",
    )
    options = parser.parse_args()
    print(
        "| store | claims idle / during | idle p50 ms | idle p99 ms | during p50 ms "
        "| during p99 ms | during max ms | p99 ratio | ≤ 2× |"  # noqa: RUF001
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for kind in options.stores.split(","):
        f = measure(kind, options.scale, options.claims, options.batch, options.pause_factor)
        i, d = f["idle"], f["during"]
        ratio = d["p99"] / i["p99"]
        verdict = "PASS" if ratio <= TARGET_RATIO else "FAIL"
        print(
            f"| {kind} | {i['n']} / {d['n']} | {i['p50']:.2f} | {i['p99']:.2f} "
            f"| {d['p50']:.2f} | {d['p99']:.2f} | {d['max']:.2f} | {ratio:.2f}× | {verdict} |"  # noqa: RUF001
        )
        b = f["batch_ms"]
        print(
            f"<!-- {kind}: {f['finished_runs']} finished + {f['waiting_runs']} waiting runs "
            f"generated in {f['generate_s']:.0f} s; pruned {f['deleted']} runs in "
            f"{f['prune_s']:.1f} s, {b['n']} batches of {options.batch}, pause factor "
            f"{options.pause_factor:g}, batch p50 {b['p50']:.1f} ms "
            f"p99 {b['p99']:.1f} ms max {b['max']:.1f} ms -->"
        )
        sys.stdout.flush()


if __name__ == "__main__":
    main()
