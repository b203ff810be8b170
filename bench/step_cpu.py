"""W1's loop in one process, for comparing two trees: wall time and process CPU per step.

Starts and awaits N ten-step workflows one by one with an in-process worker
on a fresh SQLite file (or the store in $URL), after 10 warm-up runs, and
prints µs per step of wall time and of this process's CPU time. Run it
against two checkouts in alternation::

    PYTHONPATH=src .venv/bin/python bench/step_cpu.py 300
    PYTHONPATH=../before/src .venv/bin/python bench/step_cpu.py 300

$OWNERSHIP picks the worker's posture (default run-lease; none: no keeper and
no lease renewal).
"""

from __future__ import annotations

import os
import sys

# bench/profile.py would shadow the standard library's profile, which cProfile
# imports: this folder goes after the standard library on the path (see loops.py).
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    sys.path.append(sys.path.pop(0))

import tempfile
import time

import loops


def main() -> None:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    url = os.environ.get("URL") or f"sqlite:///{tempfile.mkdtemp()}/bench.db"
    app = loops.ten_step_app(url)

    _ = app.store
    with app.worker(ownership=os.environ.get("OWNERSHIP", "run-lease")):
        for _ in range(10):
            app.start("ten_steps", 10).result(timeout=60)
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(count):
            app.start("ten_steps", 10).result(timeout=60)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    app.close()
    steps = count * 10
    print(f"us/step {wall / steps * 1e6:.1f} cpu {cpu / steps * 1e6:.1f}")


if __name__ == "__main__":
    main()
