"""The app of the ``ctx.first`` crash tests, served by real worker processes.

* ``PERDURE_STORE``: the store URL.
* ``FIRST_CRASH_AT``: ``after_first`` (die as soon as ``ctx.first`` returned)
  or ``in_step`` (die inside the step after it, its effect done and its
  outcome not recorded); unset: no crash.
* ``CRASH_EFFECTS_LOG``: a file the ``note`` step appends to.
"""

from __future__ import annotations

import logging
import os
import sys

import perdure

app = perdure.App(name="firstcrash")


def failpoint(point: str) -> None:
    if os.environ.get("FIRST_CRASH_AT") == point:
        os._exit(137)


@app.step()
def note(branch: str) -> str:
    with open(os.environ["CRASH_EFFECTS_LOG"], "a") as log:
        log.write(f"note {branch}\n")
    failpoint("in_step")
    return branch


@app.workflow(version="1")
def chooser(ctx: perdure.Context) -> list[str]:
    """Take the first of a signal and a message, note the branch, then take the other."""
    exit_sig, greet = perdure.signal("exit"), perdure.message("greetings")
    fired = ctx.first(exit_sig, greet)
    branch = "exit" if fired.source == exit_sig else "greetings"
    failpoint("after_first")
    noted = note(branch)
    rest = ctx.wait("exit") if branch == "greetings" else ctx.receive("greetings").payload
    return [branch, noted, rest]


def serve() -> None:
    """Run a worker until SIGTERM."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    app.worker(concurrency=1, lease_ttl=1.0, heartbeat=0.3, poll_interval=0.05).run()
