"""Where a started run is placed and until when: a start's queue placement and deadline.

``Client.start`` takes a deadline (a duration from now by the store's clock,
or an aware instant) and a place in one of the app's queues (the queue, the
key its per-key limit counts, a priority); these check them and turn them
into what the run stores, before anything is written.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from perdure import codec, errors
from perdure.store import port, queueport


def deadline(store: port.Store, deadline: timedelta | datetime | None) -> datetime | None:
    """Return the absolute instant of a start's ``deadline``."""
    if deadline is None:
        return None
    if isinstance(deadline, timedelta):
        if deadline <= timedelta(0):
            raise errors.InvalidInput(f"a run deadline must be a positive duration, got {deadline}")
        return store.now() + deadline
    if isinstance(deadline, datetime):
        if deadline.tzinfo is None or deadline.utcoffset() is None:
            raise errors.InvalidInput(
                f"a run deadline must be an aware datetime, got {deadline.isoformat()}"
            )
        return deadline
    raise errors.InvalidInput(
        f"a run deadline is a timedelta or an aware datetime, got {type(deadline).__name__}"
    )


def in_queue(
    store: port.Store, app: str, queue: str | None, queue_key: str | None, priority: int | None
) -> dict[str, Any]:
    """Return a start's queue, key and priority as a run stores them, checked."""
    if queue is None:
        if queue_key is not None or priority is not None:
            given = "queue_key" if queue_key is not None else "priority"
            raise errors.InvalidQueue(
                f"{given} applies within a queue: pass queue= too (runs in no queue "
                "are claimed first come, first served)"
            )
        return {}
    codec.check_text("a queue name", queue)
    if queue_key is not None:
        if not isinstance(queue_key, str):
            raise errors.InvalidQueue(f"a queue key is a string, got {type(queue_key).__name__}")
        codec.check_text("a queue key", queue_key)
    if priority is None:
        priority = 0
    low, high = queueport.PRIORITY_MIN, queueport.PRIORITY_MAX
    if type(priority) is not int or not low <= priority <= high:
        raise errors.InvalidQueue(
            f"a priority is a 32-bit integer (lower runs first), got {priority!r}"
        )
    found = store.get_queue(app, queue) if isinstance(store, queueport.QueueStore) else None
    if found is None:
        raise errors.UnknownQueue(
            f"app {app} has no queue {queue!r}; declare it with app.queue({queue!r}, ...)"
        )
    return {"queue": queue, "queue_key": queue_key, "priority": priority}
