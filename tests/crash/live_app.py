"""The app of the live-run crash tests, served by real worker processes.

* ``PERDURE_STORE``: the store URL.
* ``LIVE_CRASH_AT``: ``after_next_update`` (die once the update is read, before
  anything is written) or ``after_step`` (die after a step recorded, so the
  update's consumption is in the journal); unset: no crash.
* ``CRASH_EFFECTS_LOG``: a file the ``note`` step appends to.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

import perdure

app = perdure.App(name="livecrash")


def failpoint(point: str) -> None:
    if os.environ.get("LIVE_CRASH_AT") == point:
        os._exit(137)


@app.step()
def note(payload: Any) -> str:
    with open(os.environ["CRASH_EFFECTS_LOG"], "a") as log:
        log.write(f"note {payload}\n")
    return f"noted {payload}"


@app.workflow(version="1")
def answer_once(ctx: perdure.Context) -> str:
    """Answer one update ``ask`` with twice its payload."""
    upd = ctx.next_update("ask")
    failpoint("after_next_update")
    noted = note(upd.payload)
    failpoint("after_step")
    ctx.respond(upd, {"answer": upd.payload * 2, "noted": noted})
    return "answered"


def serve() -> None:
    """Run a worker until SIGTERM."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    app.worker(concurrency=1, lease_ttl=1.0, heartbeat=0.3, poll_interval=0.05).run()
