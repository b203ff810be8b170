"""A workflow that loops forever-ish without its journal growing: continue-as-new.

``looping`` does one iteration of work (a step, then a short durable sleep)
and hands over to a fresh run of itself with the next iteration number, until
it reaches ``limit``. Each run's journal holds one iteration, however many
iterations the loop makes; the first run id answers for the whole chain.

Run it::

    export PERDURE_STORE=sqlite:///loop.db     # or postgresql://...
    perdure worker cursor_loop:app &           # from this folder
    python cursor_loop.py start 10             # prints the first run id, waits for the result
    perdure show <first run id>                # the current run and the chain

``LOOP_LOG`` (optional) names a file each iteration's step appends a line to.
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta

import perdure

app = perdure.App(name="loop")


@app.step()
def work(iteration: int) -> str:
    """One iteration's work (idempotent: a retry after a crash may repeat it)."""
    log = os.environ.get("LOOP_LOG")
    if log:
        with open(log, "a", encoding="utf-8") as out:
            out.write(f"{iteration}\n")
    return f"iteration {iteration} done"


@app.workflow(version="1")
def looping(ctx: perdure.Context, iteration: int = 0, limit: int = 10) -> str:
    """Do one iteration, then continue as new with the next, until ``limit``."""
    work(iteration)
    ctx.sleep(timedelta(seconds=float(os.environ.get("LOOP_PAUSE", "0.2"))))
    if iteration >= limit:
        return f"looped {limit} times"
    ctx.continue_as_new(iteration + 1, limit)


def main(argv: list[str]) -> None:
    limit = int(argv[1]) if len(argv) > 1 else 10
    handle = app.start(looping, 0, limit)
    print(handle.run_id, flush=True)
    print(handle.result(timeout=600))
    info = app.get(handle.run_id)
    print(f"{len(info.chain)} runs in the chain; the last is {info.run_id}")


if __name__ == "__main__" and sys.argv[1:2] == ["start"]:
    main(sys.argv[1:])
