"""W3's shape in one process, for comparing two trees: worker CPU per step.

Starts N ten-step no-op runs on a fresh SQLite file (or the store in $URL)
with no worker serving, then drains them with one in-process worker, polling
the count of finished runs every 50 ms, and prints the process CPU time
(``time.process_time``) per step spent while draining, and the CPU of child
processes (the lease keeper) reaped by then. With ``--calls`` it profiles
every thread the worker starts and prints Python function calls per step
(deterministic, unlike the times). Run it against two checkouts in
alternation::

    PYTHONPATH=$BEFORE/src .venv/bin/python bench/step_cpu_w3.py 1500
    PYTHONPATH=src .venv/bin/python bench/step_cpu_w3.py 1500

$DBPATH drains into a SQLite file prepared beforehand (migrated, and
changed as the comparison needs) instead of a fresh one. $OWNERSHIP picks the
worker's posture (run-lease, none, store-lease), $LIVENESS
where its leases are renewed from (process, thread).
"""

from __future__ import annotations

import os
import sys

# bench/profile.py would shadow the standard library's profile, which cProfile
# imports: this folder goes after the standard library on the path (see loops.py).
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    sys.path.append(sys.path.pop(0))

import argparse
import pstats
import sqlite3
import tempfile
import time
from typing import Any

import loops


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("count", type=int, nargs="?", default=1500)
    parser.add_argument(
        "--steps", type=int, default=10, help="steps per run (0: what a run costs by itself)"
    )
    parser.add_argument("--calls", action="store_true", help="count function calls per step")
    parser.add_argument("--top", type=int, default=0, help="with --calls: the top N functions")
    parser.add_argument("--cpu", action="store_true", help="with --calls: time by thread CPU")
    parser.add_argument("--dump", help="with --calls: write the merged profile to this file")
    parser.add_argument("--sort", default="tottime", help="with --top: the pstats sort key")
    args = parser.parse_args()
    # $DBPATH: a SQLite file prepared beforehand (say, with an index dropped).
    path = os.environ.get("DBPATH") or os.path.join(tempfile.mkdtemp(), "bench.db")
    url = os.environ.get("URL") or f"sqlite:///{path}"
    app = loops.ten_step_app(url)

    for _ in range(args.count):
        app.start("ten_steps", args.steps)
    db = sqlite3.connect(path)

    def done() -> int:
        row = db.execute("SELECT count(*) FROM runs WHERE state = 'succeeded'").fetchone()
        return int(row[0])

    profiles = loops.profile_threads(args.cpu) if args.calls else []
    options: dict[str, Any] = {}
    if os.environ.get("OWNERSHIP"):
        # The worker's posture: run-lease (the default), none or store-lease.
        options["ownership"] = os.environ["OWNERSHIP"]
    if os.environ.get("LIVENESS"):
        # Where leases are renewed from: process (the keeper, the default) or thread.
        options["liveness"] = os.environ["LIVENESS"]
    cpu, wall = time.process_time(), time.perf_counter()
    with app.worker(**options):
        while done() < args.count:
            time.sleep(0.05)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    children = os.times()
    app.close()
    # With --steps 0 the figures are per run.
    steps = args.count * max(1, args.steps)
    keeper = children.children_user + children.children_system
    line = (
        f"cpu_us/step {cpu / steps * 1e6:.1f} wall_us/step {wall / steps * 1e6:.1f}"
        f" children_cpu_us/step {keeper / steps * 1e6:.1f}"
    )
    if profiles:
        stats = pstats.Stats(profiles[0])
        for profile in profiles[1:]:
            stats.add(profile)
        line += f" calls/step {stats.total_calls / steps:.1f}"  # type: ignore[attr-defined]
        if args.dump:
            stats.dump_stats(args.dump)
        if args.top:
            stats.sort_stats(args.sort).print_stats(args.top)
    print(line)


if __name__ == "__main__":
    main()
