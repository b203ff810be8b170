"""W3's shape with N worker processes on either store, and what a step costs the CPU.

    PYTHONPATH=src bench/.venv/bin/python bench/processes.py --store sqlite --workers 1,2 --rounds 2

``bench/run.py`` runs W4 (W3 with 1, 2 and 4 worker processes) on PostgreSQL
only; this runs the same workload module on either store, the counts
interleaved round by round, and prints each run's steps/s with the CPU per
step of the worker processes (their lease keepers included), of the
PostgreSQL server, and of the whole machine, and the machine's busy share of
all its cores while the runs drained (``common.CpuLedger``).
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import run


def once(store: str, workers: int, log: Any) -> dict[str, Any]:
    """One W4 run with ``workers`` worker processes, through the orchestrator's own job runner."""
    options = argparse.Namespace(calm=0.0, patience=0.0, quick=False, w7_scale=None)
    result: dict[str, Any] = run.run_job(run.Job("W4", "perdure", store, workers), options, log)
    if "error" in result:
        raise SystemExit(f"W4 with {workers} worker process(es) on {store}: {result['error']}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--store", default="sqlite", choices=["sqlite", "postgres"])
    parser.add_argument("--workers", default="1,2", help="worker process counts")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    counts = [int(x) for x in args.workers.split(",")]
    with open(os.devnull, "w") as log:
        for r in range(args.rounds):
            for n in counts if r % 2 == 0 else reversed(counts):
                result = once(args.store, n, log)
                cpu = result["detail"]["cpu"]
                print(
                    f"{args.store} workers {n}: {result['metrics']['steps_per_s']:,.0f} steps/s;"
                    f" CPU per step: workers {cpu['worker_cpu_us_per_step']:.0f} us,"
                    f" server {cpu['server_cpu_us_per_step']:.0f} us,"
                    f" machine {cpu['machine_cpu_us_per_step']:.0f} us;"
                    f" cores busy {cpu['machine_busy_share']:.0%}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
