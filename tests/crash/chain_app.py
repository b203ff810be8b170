"""The app of the continue-as-new crash tests, run in real worker processes.

* ``PERDURE_STORE``: the store URL; ``CRASH_EFFECTS_LOG``: a file each step appends to.
* ``PERDURE_CHAIN_CRASH=<before|after>:<k>``: the process dies right before its
  ``k``-th ``continue_run`` transaction, or right after it committed.
* ``PERDURE_CRASH_MODE``: ``exit`` (``os._exit(137)``) or ``kill`` (SIGKILL to itself).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from typing import Any

import perdure
from perdure.store import open_store
from perdure.testing import faults

store = faults.FaultyStore(open_store(os.environ["PERDURE_STORE"]))
app = perdure.App(store, name="chain")


def die() -> None:
    if os.environ.get("PERDURE_CRASH_MODE", "exit") == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)
    os._exit(137)


def arm() -> None:
    """Arm the failpoint ``PERDURE_CHAIN_CRASH`` names, if any."""
    point = os.environ.get("PERDURE_CHAIN_CRASH")
    if not point:
        return
    when, _, k = point.partition(":")
    seen = [0]

    def before(*args: Any, **kwargs: Any) -> None:
        seen[0] += 1
        if when == "before" and seen[0] == int(k):
            die()

    def after(*args: Any, **kwargs: Any) -> None:
        if when == "after" and seen[0] == int(k):
            die()

    store.before("continue_run", before, times=None)
    store.after("continue_run", after, times=None)


@app.step()
def record(cursor: int) -> int:
    fd = os.open(os.environ["CRASH_EFFECTS_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"step{cursor}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    return cursor


@app.workflow(version="1")
def looper(ctx: perdure.Context, cursor: int, last: int, total: int = 0) -> int:
    """One step and one message per run, then continue; the last run also takes a signal."""
    total += record(cursor)
    total += int(ctx.receive("feed").payload)
    if cursor < last:
        ctx.continue_as_new(cursor + 1, last, total=total)
    return total + int(ctx.wait("bonus"))


def serve() -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    arm()
    worker = app.worker(concurrency=1, lease_ttl=1.0, heartbeat=0.3, poll_interval=0.05)
    worker.run()
