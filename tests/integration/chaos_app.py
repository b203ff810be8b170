"""The app that ``test_many_workers.py`` runs in worker processes it kills at random.

Configuration comes from the environment, read when used (importing this
module touches nothing):

* ``PERDURE_STORE``: the store URL (``App()`` reads it; ``--store`` overrides it).
* ``CHAOS_EFFECTS_DIR``: each process appends its effects to
  ``effects-<pid>.log`` there, one line per write (``O_APPEND``)::

      <run_id> <step> <pid> <generation> <worker id> <effect|done> <monotonic ns>

  ``effect`` is written when a step's body starts (that is its effect),
  ``done`` when the body returns; a kill in between leaves the effect without
  an outcome. ``CLOCK_MONOTONIC`` is one clock for every process of the host,
  so lines of different files can be ordered.
* ``CHAOS_STEP_SECONDS``: how long each step body lasts (default 0.03).
"""

from __future__ import annotations

import os
import time

import perdure
from perdure import context

app = perdure.App(name="chaos")

STEPS = ("reserve", "charge", "ship", "notify")


def record(step: str, phase: str) -> None:
    """Append one line for this step execution to this process's effects file."""
    ctx = context.current()
    assert ctx is not None, "a chaos step runs inside a workflow"
    # The claim the step runs under; the worker supplies it as the context's runtime.
    claim = ctx._runtime.claim
    line = (
        f"{ctx.run_id} {step} {os.getpid()} {claim.generation} {claim.worker} "
        f"{phase} {time.monotonic_ns()}\n"
    )
    path = os.path.join(os.environ["CHAOS_EFFECTS_DIR"], f"effects-{os.getpid()}.log")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def body(step: str, n: int) -> str:
    record(step, "effect")
    time.sleep(float(os.environ.get("CHAOS_STEP_SECONDS", "0.03")))  # the step's work
    record(step, "done")
    return f"{step}:{n}"


@app.step()
def reserve(n: int) -> str:
    return body("reserve", n)


@app.step(effect="once", retry=perdure.Retry(max_attempts=1))
def charge(n: int) -> str:
    return body("charge", n)


@app.step()
def ship(n: int) -> str:
    return body("ship", n)


@app.step()
def notify(n: int) -> str:
    return body("notify", n)


@app.workflow(version="1")
def order(ctx: perdure.Context, n: int) -> list[str]:
    """Reserve, charge once, ship, notify."""
    return [reserve(n), charge(n), ship(n), notify(n)]
