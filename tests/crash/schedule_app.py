"""The app the schedule fleet test serves from several worker processes.

One schedule ticks every second (``catch_up="all"``, so no tick is skipped).
Each execution of a tick's run appends ``<tick> <run id> <pid>`` to the file
``SCHEDULE_LOG``. A worker started with ``SCHEDULE_CRASH`` set kills itself
(SIGKILL) right after its first such line, while it holds the run's claim,
once across the fleet (the file ``SCHEDULE_CRASH`` is the marker).

Configuration comes from the environment: ``PERDURE_STORE``,
``SCHEDULE_LOG``, ``SCHEDULE_CRASH`` (optional).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from datetime import datetime

import perdure

app = perdure.App(name="fleet")


def _record(line: str) -> None:
    fd = os.open(os.environ["SCHEDULE_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{line}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)


@app.step(effect="idempotent")
def note(tick: str) -> None:
    run_id = perdure.idempotency_key().split("/")[0]
    _record(f"{tick} {run_id} {os.getpid()}")
    marker = os.environ.get("SCHEDULE_CRASH")
    if marker:
        try:
            os.close(os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        except FileExistsError:
            return
        os.kill(os.getpid(), signal.SIGKILL)


@app.schedule("* * * * * *", catch_up="all")
@app.workflow()
def every_second(ctx: perdure.Context, tick: datetime) -> None:
    note(tick.isoformat())


def serve() -> None:
    """Run one worker until SIGTERM, logging to stderr."""
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(process)d %(threadName)s %(name)s %(levelname)s %(message)s",
    )
    worker = app.worker(concurrency=2, lease_ttl=1.0, heartbeat=0.3, poll_interval=0.2)
    print(f"worker {worker.worker_id} serving", file=sys.stderr, flush=True)
    worker.run()
