"""An alarm whose deadline can be moved while it waits.

The run waits on three things at once with ``ctx.first``: an update ``move``
(a new deadline, answered with the deadline now in force), a signal ``stop``
(give up without ringing) and a timer to the current deadline. A move
restarts the wait with a timer to the new deadline; the alarm rings when the
timer in force fires. Every deadline is journaled, so a worker that dies
while the alarm waits changes nothing: the next one rings at the same instant.

Served by a worker (from this directory)::

    export PERDURE_STORE=sqlite:///alarm.db
    perdure worker alarm:app
    perdure start alarm:app alarm --args '["2030-01-01T07:00:00+00:00"]'
    perdure update RUN move --payload '"2030-01-01T06:30:00+00:00"'
    perdure signal RUN stop --payload '"slept in"'

``python alarm.py`` tells the whole story in one process, with a short timer.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from typing import Any

import perdure

app = perdure.App(os.environ.get("PERDURE_STORE", "sqlite:///alarm.db"), name="alarm")


def instant(text: Any) -> datetime:
    """Read a deadline: ISO 8601 text with a time zone."""
    if not isinstance(text, str):
        raise ValueError(f"a deadline is ISO 8601 text, got {type(text).__name__}")
    when = datetime.fromisoformat(text)
    if when.tzinfo is None:
        raise ValueError(f"the deadline {text!r} has no time zone")
    return when


@app.workflow(version="1")
def alarm(ctx: perdure.Context, wake_at: str) -> dict[str, Any]:
    """Ring at ``wake_at``, or at the deadline the latest ``move`` set; ``stop`` ends it."""
    deadline = instant(wake_at)
    move, stop = perdure.update("move"), perdure.signal("stop")
    moves = 0
    while True:
        left = max(deadline - ctx.now(), timedelta(0))
        fired = ctx.first(move, stop, perdure.timer(left))
        if fired.source == move:
            deadline = instant(fired.value.payload)
            moves += 1
            ctx.respond(fired.value, {"deadline": deadline.isoformat(), "moves": moves})
        elif fired.source == stop:
            return {"rang": False, "reason": fired.value, "moves": moves}
        else:
            return {
                "rang": True,
                "at": ctx.now().isoformat(),
                "deadline": deadline.isoformat(),
                "moves": moves,
            }


@alarm.validator("move")
def check_move(payload: Any) -> None:
    """Refuse a move that is not an aware ISO 8601 instant, before it is stored."""
    instant(payload)


def main() -> None:
    with app.worker(concurrency=2):
        now = datetime.now(UTC)
        handle = app.start(alarm, (now + timedelta(hours=1)).isoformat())
        soon = (now + timedelta(seconds=2)).isoformat()
        print("moved:", app.update(handle.run_id, "move", soon, update_id="move-1", timeout=30))
        print("result:", handle.result(timeout=30))


if __name__ == "__main__":
    main()
