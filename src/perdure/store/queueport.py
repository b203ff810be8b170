"""The queues section of the store port: limits on an app's runs, enforced at claim time.

A queue is declared in code (``app.queue``) and saved here with its limits,
so that every worker on every host claims under the same ones. A run started
in a queue (``NewRun.queue``) is claimed by :meth:`port.Store.claim` only
while its queue admits it:

* at most ``concurrency`` runs of the queue are ``running`` at once;
* at most ``per_key`` of them share one ``queue_key`` (runs without a key are
  not counted per key);
* at most ``rate_limit`` runs of the queue are started (first claimed) within
  any window of ``rate_seconds``;
* among the runs it admits, a claim takes the lowest ``priority`` number first,
  then the run that became claimable first.

Limits are counted from the runs' states inside the claim's transaction (a
parked, released or ended run holds no slot; a lapsed lease holds its slot
until a claim recovers the run), and claims of one queue are serialised on
its row, so concurrent claims on any number of hosts never exceed them. A
run in no queue is claimed as before and is counted by none.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol, runtime_checkable

from perdure import errors

PRIORITY_MIN = -(2**31)
PRIORITY_MAX = 2**31 - 1
"""A run's priority is a 32-bit integer, as both stores hold it; the default is 0."""


@dataclass(frozen=True)
class QueueSpec:
    """A queue as the code declares it; None: no such limit."""

    name: str
    concurrency: int | None = None
    per_key: int | None = None
    rate_limit: int | None = None
    rate_seconds: float | None = None

    @property
    def limited(self) -> bool:
        """Whether a claim must count anything for this queue."""
        return (
            self.concurrency is not None or self.per_key is not None or self.rate_limit is not None
        )


@dataclass(frozen=True)
class QueueRecord:
    """A stored queue: its limits and, when listed, its runs by what they wait for.

    ``running`` counts the queue's running runs; ``waiting`` its queued ones
    (waiting for a slot, or held back by a retry's backoff).
    """

    app: str
    name: str
    concurrency: int | None
    per_key: int | None
    rate_limit: int | None
    rate_seconds: float | None
    created_at: datetime
    updated_at: datetime
    running: int = 0
    waiting: int = 0

    @property
    def spec(self) -> QueueSpec:
        """The limits alone."""
        return QueueSpec(
            self.name, self.concurrency, self.per_key, self.rate_limit, self.rate_seconds
        )


def check_spec(spec: QueueSpec) -> None:
    """Refuse limits the store cannot enforce.

    Raises:
        errors.InvalidQueue: a limit below 1, or a rate without a positive window.
    """
    for what, value in (
        ("concurrency", spec.concurrency),
        ("per_key", spec.per_key),
        ("rate", spec.rate_limit),
    ):
        if value is not None and (type(value) is not int or value < 1 or value > PRIORITY_MAX):
            raise errors.InvalidQueue(
                f"queue {spec.name!r}: {what} must be a whole number of at least 1 or None, "
                f"got {value!r}"
            )
    if (spec.rate_limit is None) != (spec.rate_seconds is None):
        raise errors.InvalidQueue(f"queue {spec.name!r}: a rate needs both a count and a window")
    if spec.rate_seconds is not None and not spec.rate_seconds > 0:
        raise errors.InvalidQueue(
            f"queue {spec.name!r}: a rate's window must be positive, got {spec.rate_seconds}s"
        )


@runtime_checkable
class QueueStore(Protocol):
    """The store's queue operations."""

    def save_queues(self, app: str, specs: Sequence[QueueSpec]) -> list[QueueRecord]:
        """Create or update the app's queues, in one transaction; return the saved rows.

        A saved limit replaces the stored one (None removes it) and applies
        to every claim that follows, on every worker. Queues not named are
        left alone.

        Raises:
            errors.InvalidInput: a limit below 1, or a rate without a positive window.
        """
        ...

    def get_queue(self, app: str, name: str) -> QueueRecord | None:
        """Return the app's queue ``name`` (without counts), or None."""
        ...

    def list_queues(self, app: str | None = None) -> list[QueueRecord]:
        """Return the queues of ``app`` (or of every app) with their counts, by app and name."""
        ...
