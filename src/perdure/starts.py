"""Eager starts: a run started where a worker serves it is created already claimed by that worker.

A start announces its run and a worker claims it: a commit, a wake-up and a
second commit before the workflow's first line runs. When the process that
starts the run also serves the app (``with app.worker():`` around the calls,
a script, a test) and that worker has a slot free, the start creates the run
running under the worker instead (:mod:`perdure.store.eagerport`), in one
commit, and hands it to the worker in memory. Temporal calls this an eager
workflow start.

The claim is an ordinary one from there on: renewed while the run executes,
fenced by its generation, and recovered by any worker if this process dies.
Each worker offers itself here while it claims (``app.worker(eager=False)``
never does); the slot is reserved before the run is created, so a worker never
runs more at once than its ``concurrency``, and a start that finds no slot
free, or a run a claim must judge (in a queue, a plan, a dry run for an
ordinary worker), is created the ordinary way.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from perdure.store import eagerport, port


@dataclass(frozen=True)
class Reserved:
    """A slot of a worker here, held for one run about to be created claimed."""

    worker: str
    lease_ttl: float
    hand: Callable[[port.Claimed], None]
    """Give the worker the run it now holds; it starts executing it."""
    cancel: Callable[[], None]
    """Free the slot: the run was not created claimed (or not at all)."""


class Taker(Protocol):
    """A worker of this process that takes runs as they are started."""

    def reserve(self, new: port.NewRun) -> Reserved | None:
        """Hold a slot for ``new`` if this worker would claim it now, else None."""
        ...


class Starts:
    """The workers of this process that take the runs started on one store object."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._takers: weakref.WeakSet[Taker] = weakref.WeakSet()

    def offer(self, taker: Taker) -> None:
        with self._lock:
            self._takers.add(taker)

    def withdraw(self, taker: Taker) -> None:
        with self._lock:
            self._takers.discard(taker)

    def create(self, store: port.Store, new: port.NewRun) -> tuple[port.Run, bool] | None:
        """Create ``new`` claimed by a worker here and hand it over; None: none takes it.

        Returns the run and whether this call created it, as ``create_run``;
        a run found under its key is returned as stored and no worker holds it.
        """
        if new.queue is not None or new.plan is not None:
            return None
        if not isinstance(store, eagerport.EagerStarts):
            return None
        with self._lock:
            takers = list(self._takers)
        reserved = None
        for taker in takers:
            reserved = taker.reserve(new)
            if reserved is not None:
                break
        if reserved is None:
            return None
        try:
            run, claimed = store.create_claimed(new, reserved.worker, lease_ttl=reserved.lease_ttl)
        except BaseException:
            # Created or not (an outcome unknown), the run is the store's: a
            # claim made here and never handed over lapses and is recovered.
            reserved.cancel()
            raise
        if claimed is None:
            reserved.cancel()
            return run, False
        reserved.hand(claimed)
        return run, True


_lock = threading.Lock()
_by_store: weakref.WeakKeyDictionary[object, Starts] = weakref.WeakKeyDictionary()


def of(store: object) -> Starts:
    """Return the eager starts of ``store``: workers and clients sharing the object share them."""
    try:
        with _lock:
            found = _by_store.get(store)
            if found is None:
                found = _by_store[store] = Starts()
            return found
    except TypeError:
        # A store object that cannot be weakly referenced: starts are announced.
        return Starts()
