"""The app's queues: declaring them with their limits, placing runs in them, listing them.

:class:`Queues` is a part of :class:`~perdure.app.App` (a base class of it).
A queue is declared in code (``app.queue("emails", concurrency=10)``) and
saved to the store the first time the app needs it there (a start in it, a
worker, ``app.queues()``), so that every worker on every host claims its
runs under the same limits; the store enforces them at claim time
(:mod:`perdure.store.queueport`, ``docs/howto/queues.md``).
"""

from __future__ import annotations

import abc
import re
import threading
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from perdure import client as client_api
from perdure import errors, registry
from perdure.store import port, queueport

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]{0,127}$")
# The start keywords that place a run, unless the workflow takes one of them.
PLACEMENT = ("queue", "queue_key", "priority")


@dataclass(frozen=True)
class Rate:
    """At most ``n`` runs of a queue start within any window of length ``per``."""

    n: int
    per: timedelta

    def __post_init__(self) -> None:
        if type(self.n) is not int or self.n < 1:
            raise errors.InvalidQueue(f"a rate's count is a whole number >= 1, got {self.n!r}")
        if not isinstance(self.per, timedelta) or self.per <= timedelta(0):
            raise errors.InvalidQueue(f"a rate's window is a positive timedelta, got {self.per!r}")


@dataclass(frozen=True)
class Queue:
    """A declared queue: its name and limits (None: no such limit)."""

    name: str
    concurrency: int | None = None
    per_key: int | None = None
    rate: Rate | None = None

    @property
    def spec(self) -> queueport.QueueSpec:
        """The queue as the store keeps it."""
        return queueport.QueueSpec(
            self.name,
            self.concurrency,
            self.per_key,
            None if self.rate is None else self.rate.n,
            None if self.rate is None else self.rate.per.total_seconds(),
        )


@dataclass(frozen=True)
class QueueInfo:
    """A queue as stored: its limits, its running runs and its runs waiting for a slot."""

    app: str
    name: str
    concurrency: int | None
    per_key: int | None
    rate: Rate | None
    running: int
    waiting: int


def info(record: queueport.QueueRecord) -> QueueInfo:
    """Return what a client sees of a stored queue."""
    rate = None
    if record.rate_limit is not None and record.rate_seconds is not None:
        rate = Rate(record.rate_limit, timedelta(seconds=record.rate_seconds))
    return QueueInfo(
        record.app,
        record.name,
        record.concurrency,
        record.per_key,
        rate,
        record.running,
        record.waiting,
    )


def queue_store(store: port.Store) -> queueport.QueueStore:
    """Return the store as one that holds queues.

    Raises:
        errors.InvalidInput: the store cannot hold queues.
    """
    if not isinstance(store, queueport.QueueStore):
        raise errors.InvalidInput(f"the store {store.url} cannot hold queues")
    return store


def listing(store: port.Store, app: str | None = None) -> list[QueueInfo]:
    """Return the stored queues of ``app`` (or of every app), with their counts."""
    return [info(r) for r in queue_store(store).list_queues(app)]


class Queues(abc.ABC):
    """The queue calls of an App."""

    # What the App supplies.
    name: str
    _queues: dict[str, Queue]

    @property
    @abc.abstractmethod
    def store(self) -> port.Store:
        """The app's store."""

    @property
    @abc.abstractmethod
    def client(self) -> client_api.Client:
        """The app's client."""

    def queue(
        self,
        name: str,
        concurrency: int | None = None,
        per_key: int | None = None,
        rate: Rate | None = None,
    ) -> Queue:
        """Declare the queue ``name`` and its limits; return it.

        ``concurrency`` caps the queue's running runs, ``per_key`` its running
        runs of one ``queue_key``, ``rate`` its run starts per window. Every
        worker on every host of the store enforces them at claim time. A
        declaration again (here or in another process) replaces the limits.

        Raises:
            errors.InvalidQueue: a limit below 1, or a rate that is not a Rate.
        """
        if not isinstance(name, str) or not _NAME.match(name):
            raise errors.InvalidQueue(f"queue name {name!r} must be a short identifier")
        if rate is not None and not isinstance(rate, Rate):
            raise errors.InvalidQueue(f"rate must be a perdure.Rate, got {type(rate).__name__}")
        declared = Queue(name, concurrency, per_key, rate)
        queueport.check_spec(declared.spec)
        with self._queue_lock():
            if self._queues.get(name) != declared:
                self._queues[name] = declared
                self._queues_saved = False
        return declared

    def _queue_lock(self) -> threading.Lock:
        lock: threading.Lock | None = getattr(self, "_queues_guard", None)
        if lock is None:
            lock = self._queues_guard = threading.Lock()
        return lock

    _queues_saved = False

    def save_queues(self) -> None:
        """Save the declared queues' limits to the store (once, until one changes)."""
        if self._queues_saved or not self._queues:
            return
        with self._queue_lock():
            specs = [q.spec for q in self._queues.values()]
        queue_store(self.store).save_queues(self.name, specs)
        self._queues_saved = True

    def queues(self) -> list[QueueInfo]:
        """Return the app's queues: their limits, running runs and runs waiting for a slot."""
        self.save_queues()
        return listing(self.store, self.name)

    def placement(self, wf: registry.WorkflowDef, kwargs: dict[str, Any]) -> dict[str, Any]:
        """Take a start's queue, queue_key and priority out of ``kwargs`` (in place).

        A workflow with a parameter of one of these names gets it as its
        argument instead.
        """
        params = list(wf.signature.parameters)[1:]
        placed = {k: kwargs.pop(k) for k in PLACEMENT if k in kwargs and k not in params}
        queue = placed.get("queue")
        if isinstance(queue, Queue):
            placed["queue"] = queue = queue.name
        if isinstance(queue, str) and queue in self._queues:
            self.save_queues()
        return placed
