"""How long a new worker takes to run its first step, for comparing two trees.

Creates one one-step run on a fresh SQLite file, then times
``app.worker(...)``, ``start()`` and the wait until the step's body runs.
$LIVENESS picks where leases are renewed from (process, the default: the
lease keeper; thread). Run it a few times against each tree::

    PYTHONPATH=src .venv/bin/python bench/worker_start.py
    LIVENESS=thread PYTHONPATH=src .venv/bin/python bench/worker_start.py
"""

from __future__ import annotations

import os
import tempfile
import threading
import time

import perdure


def main() -> None:
    app = perdure.App(f"sqlite:///{tempfile.mkdtemp()}/bench.db", name="bench")
    ran = threading.Event()

    @app.step(name="first")
    def first() -> int:
        ran.set()
        return 1

    @app.workflow(name="one_step")
    def one_step(ctx: perdure.Context) -> int:
        return first()

    app.start("one_step")
    _ = app.store  # open (and migrate) it before the clock starts
    t0 = time.perf_counter()
    worker = app.worker(liveness=os.environ.get("LIVENESS", "process"))  # type: ignore[arg-type]
    t1 = time.perf_counter()
    worker.start()
    t2 = time.perf_counter()
    ran.wait(30)
    t3 = time.perf_counter()
    worker.stop()
    app.close()
    print(
        f"construct_ms {1e3 * (t1 - t0):.1f} start_ms {1e3 * (t2 - t1):.1f} "
        f"first_step_ms {1e3 * (t3 - t2):.1f}"
    )


if __name__ == "__main__":
    main()
