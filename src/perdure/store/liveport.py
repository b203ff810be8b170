"""The port's section for talking to live runs: updates, and watching runs change.

An update is a request a caller sends to a live run and that the run
answers. Its lifecycle as the store sees it::

    deliver_update ──> pending ──answer_update (fenced, with the journal)──> answered
                          │
                          └──the run ends (any end but needs_attention)──> abandoned

Rules every adapter keeps, on top of those of :mod:`perdure.store.port`:

* Delivery never writes the journal. ``deliver_update`` is put-if-absent by
  ``(run_id, update_id)`` from any number of processes: the first payload
  wins, later calls get the stored record. It wakes the run only if the run
  is parked on an update of that name (a registered wait of kind
  ``update``), after taking the run's row lock, so that a concurrent
  ``park`` either sees the update or is woken by it.
* Each update of a run gets the next ``sequence`` (1, 2, ...); a run consumes
  the updates of one name in sequence order (``next_update``).
* The answer is written by the run's owner in the transaction that records
  its journal entry (``answer_update``, fenced like every claimed-run write),
  and only while the update is pending: an update is answered once.
* Update records outlive their run. When a run ends (by ``finish`` in any
  terminal state but ``needs_attention``, by a cancel, by a failed
  ``resolve``) its pending updates become ``abandoned`` in the same
  transaction; answered ones keep their response for the senders' retries.
* Every transition that changes what a watcher waits for (an answer, a
  journal write made with ``record_live``, the end of a run that has
  updates, events or stream items) is announced to
  :meth:`LiveStore.watch` watchers once it commits, in this process and, for
  a store shared through a server, in every other.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol, cast, runtime_checkable

from perdure import errors
from perdure.store import port, records

# The update's records live with the others, as a claim returns some too.
UpdateState = records.UpdateState
UPDATE_STATES = records.UPDATE_STATES
UpdateRecord = records.UpdateRecord


@dataclass(frozen=True)
class NewUpdate:
    """An update to deliver to a run, deduplicated by ``(run_id, update_id)``."""

    run_id: str
    update_id: str
    name: str
    payload: str
    # The sender's app. With it, the delivery finds the run itself: a run of
    # another app is not found, and one past its deadline is refused with
    # Overdue (the caller settles it, which a delivery does not).
    app: str | None = None


class Overdue(Exception):
    """A delivery refused: the run's deadline has passed and nobody has settled it yet.

    Internal to the client, which settles the run and answers as for a run that ended.
    """

    def __init__(self, run_id: str) -> None:
        super().__init__(f"run {run_id} is past its deadline")
        self.run_id = run_id


class Watch(Protocol):
    """A watcher's subscription: wakes when a watched change may have committed."""

    def wait(self, timeout: float) -> bool:
        """Block until a change is announced or ``timeout`` seconds pass.

        Returns True when woken by an announcement (spurious wake-ups are
        allowed), False on timeout. Announcements made after the watch was
        opened and before this call count: they return at once.
        """
        ...


@runtime_checkable
class ToldAnswers(Protocol):
    """A watch that also hears the answers of updates, as they commit.

    A store that can announce an update's answer with the answer itself (a
    small one) lets its sender return without reading it back.
    """

    def answer(self, run_id: str, update_id: str) -> str | None:
        """The response the update was answered with, if it was heard; else None (read it)."""
        ...


class LiveStore(port.Store, Protocol):
    """A store that can talk to live runs (both SQL adapters are)."""

    def deliver_update(self, update: NewUpdate) -> tuple[UpdateRecord, bool]:
        """Store the update unless ``(run_id, update_id)`` exists; wake the run if it waits on it.

        Returns the stored record and whether this call created it.

        Raises:
            errors.RunNotFound: no such run (or, with ``update.app``, not of that app).
            errors.RunFinished: the run has ended (nothing is stored).
            Overdue: with ``update.app``, the run is past its deadline (nothing is stored).
        """
        ...

    def get_update(self, run_id: str, update_id: str) -> UpdateRecord | None:
        """Return the stored update, or None."""
        ...

    def next_update(self, run_id: str, name: str, after_sequence: int) -> UpdateRecord | None:
        """Return the run's first update named ``name`` with a greater sequence."""
        ...

    def list_updates(self, run_id: str, limit: int = 50) -> list[UpdateRecord]:
        """Return up to ``limit`` of the run's updates of every name, newest first.

        Pending, answered and abandoned ones alike, also after the run ended.
        """
        ...

    def answer_update(
        self,
        claim: port.Claim,
        entries: Sequence[port.JournalEntry],
        update_id: str,
        response: str,
        marks: Sequence[port.Mark] = (),
    ) -> bool:
        """Write ``entries`` and answer the pending update ``update_id`` (fenced).

        Returns False when the update was not pending (already answered, or
        unknown): the entries are written all the same, nothing else changes.
        Raises StaleClaim or Canceled as every fenced write.
        """
        ...

    def record_live(
        self,
        claim: port.Claim,
        entries: Sequence[port.JournalEntry],
        marks: Sequence[port.Mark] = (),
    ) -> None:
        """Write ``entries`` (fenced) and announce the run to watchers.

        For what outside readers follow (events, stream items): the entries are
        visible, and watchers woken, once this returns.
        """
        ...

    def journal_after(self, run_id: str, after_position: int) -> list[port.JournalEntry]:
        """Return the run's journal entries after ``after_position``, in order."""
        ...

    def watch(self) -> AbstractContextManager[Watch]:
        """Open a subscription to announcements; close it on exit.

        Open it before reading what you wait for, then ``wait`` after the read:
        no announcement made in between is lost.
        """
        ...


def require(store: port.Store) -> LiveStore:
    """Return ``store`` as a :class:`LiveStore`, or refuse a store that cannot talk to runs.

    Raises:
        errors.InvalidInput: the store lacks the operations of this section.
    """
    needed = ("deliver_update", "get_update", "answer_update", "record_live", "watch")
    missing = [name for name in needed if not hasattr(store, name)]
    if missing:
        raise errors.InvalidInput(
            f"the store {store.url} cannot talk to live runs (it has no {', '.join(missing)})"
        )
    return cast(LiveStore, store)
