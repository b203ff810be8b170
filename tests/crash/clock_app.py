"""The app the clock-step tests run in real worker processes.

Its store reads time from :class:`perdure.testing.clock.OffsetClock`: the
system clock plus an offset the test writes to a file, so that every process
steps at once, as the processes of a host do when its clock is set.

Configuration comes from the environment, read when used:

* ``PERDURE_STORE``: the store URL.
* ``CLOCK_OFFSET_FILE``: the offset file (seconds; missing means 0).
* ``CLOCK_DIR``: a folder. Each step execution appends ``<run id> <step>
  <pid>`` to ``effects.log`` there, creates ``started/<run id>.<pid>`` and
  then blocks until the file ``release`` exists.
* ``CLOCK_LEASE_TTL``, ``CLOCK_HEARTBEAT``, ``CLOCK_POLL``, ``CLOCK_SWEEP``:
  worker timing for ``serve()``.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path

import perdure
from perdure.testing.clock import OffsetClock

app = perdure.App(name="clock", clock=OffsetClock(os.environ.get("CLOCK_OFFSET_FILE", "")))


def _slow(step: str) -> None:
    """Record this execution, say it started, then block until the test releases it."""
    folder = Path(os.environ["CLOCK_DIR"])
    run_id = perdure.idempotency_key().split("/")[0]
    pid = os.getpid()
    fd = os.open(folder / "effects.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{run_id} {step} {pid}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    (folder / "started" / f"{run_id}.{pid}").touch()
    deadline = time.monotonic() + 120
    while not (folder / "release").exists():
        if time.monotonic() > deadline:
            raise TimeoutError("the test never released the step")
        time.sleep(0.02)


@app.step(effect="idempotent")
def slow_idempotent(n: int) -> str:
    _slow("slow_idempotent")
    return f"idempotent:{n}"


@app.step(effect="once", retry=perdure.Retry(max_attempts=1))
def slow_once(n: int) -> str:
    _slow("slow_once")
    return f"once:{n}"


@app.workflow(version="1")
def idempotent_flow(ctx: perdure.Context, n: int) -> str:
    return slow_idempotent(n)


@app.workflow(version="1")
def once_flow(ctx: perdure.Context, n: int) -> str:
    return slow_once(n)


def serve() -> None:
    """Run one worker until SIGTERM, logging to stderr."""
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(process)d %(threadName)s %(name)s %(levelname)s %(message)s",
    )
    worker = app.worker(
        concurrency=1,
        lease_ttl=float(os.environ["CLOCK_LEASE_TTL"]),
        heartbeat=float(os.environ["CLOCK_HEARTBEAT"]),
        poll_interval=float(os.environ["CLOCK_POLL"]),
        sweep_interval=float(os.environ["CLOCK_SWEEP"]),
    )
    print(f"worker {worker.worker_id} serving", file=sys.stderr, flush=True)
    worker.run()
