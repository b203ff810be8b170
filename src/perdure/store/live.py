"""The live-run transitions written once, over named queries, for every SQL adapter.

:class:`LiveTransitions` adds the operations of :mod:`perdure.store.liveport`
to :class:`perdure.store.transitions.Transitions`: deliver, read and answer
updates, write what outside readers follow, and settle a run's pending
updates when it ends. An adapter supplies, besides what ``Transitions``
needs, how a change is announced to watchers (``_announce``) and how a
watcher waits for one (``watch``).
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any, TypeVar

from perdure import errors
from perdure.store import ledger, liveport, port, rows, transitions

C = TypeVar("C")
Row = rows.Row


class LiveTransitions(transitions.Transitions[C]):
    """The live-run operations shared by the SQL adapters; ``C`` is the adapter's cursor."""

    # -- what the adapter supplies -----------------------------------------------

    @abc.abstractmethod
    def _announce(self, cur: C, run_ids: Iterable[str]) -> None:
        """Wake watchers once this transaction commits: these runs changed."""

    def _tell_answer(self, cur: C, run_id: str, update_id: str, response: str) -> None:
        """Tell watchers this answer with the announcement, if the store can (see ToldAnswers)."""

    @abc.abstractmethod
    def now(self) -> datetime:
        """The store's current time (the injected clock's, if any)."""

    @abc.abstractmethod
    def watch(self) -> AbstractContextManager[liveport.Watch]:
        """Open a subscription to announcements (see :class:`liveport.LiveStore`)."""

    # -- the end of a run -----------------------------------------------------------

    def _end_runs(self, cur: C, ended: Sequence[Row]) -> None:
        """Apply the end-of-run rules, then abandon the ended runs' pending updates."""
        super()._end_runs(cur, ended)
        if not ended:
            return
        run_ids = [r["run_id"] for r in ended]
        self._exec(cur, "updates_abandon", run_ids=run_ids)
        # Readers of events and streams stop at a run's end, and callers learn
        # that their updates were abandoned. Only runs that have such readers
        # are announced: on PostgreSQL every NOTIFY serializes commits.
        followed = [r["run_id"] for r in self._exec(cur, "live_ended", run_ids=run_ids)]
        if followed:
            self._announce(cur, followed)

    # -- updates --------------------------------------------------------------------

    def deliver_update(self, update: liveport.NewUpdate) -> tuple[liveport.UpdateRecord, bool]:
        """Store the update unless its id exists; wake the run if it is parked on that name."""
        if not update.update_id or not update.name:
            raise errors.InvalidInput("an update needs a name and an update id")
        params = {k: v for k, v in vars(update).items() if k != "app"}

        def work(cur: C) -> tuple[liveport.UpdateRecord, bool]:
            run = self._lock_for_delivery(cur, update)  # orders this delivery with a park
            created = self._exec(cur, "update_put", **params).fetchone()
            if created is None:
                stored = self._exec(cur, "update_get", **params).fetchone()
                if stored is None:
                    raise rows.corrupt(update.run_id, "update_state", "a refused update is gone")
                return self.read.update(stored), False
            if run.state == "waiting":
                woken = self._exec(
                    cur, "wake_on_wait", run_id=update.run_id, kind="update", name=update.name
                ).fetchall()
                self._woken(cur, woken)
            # Watchers are not told: what they wait for (an answer, an event,
            # an end) has not come, and the sender would only wake itself.
            return self.read.update(created), True

        return self._transact(work)

    def _lock_for_delivery(self, cur: C, update: liveport.NewUpdate) -> port.Run:
        """Lock the run's row; refuse a run its sender may not reach, or one that ended.

        With the sender's app, a run of another app is not found (whatever
        its state), and a live run past its deadline is refused (Overdue).
        """
        row = self._exec(cur, "lock_run", run_id=update.run_id).fetchone()
        run = None if row is None else self.read.run(row)
        if run is None or (update.app is not None and run.app != update.app):
            raise errors.RunNotFound(update.run_id)
        if run.state in port.TERMINAL_STATES:
            raise errors.RunFinished(update.run_id, run.state)
        due = None if update.app is None or run.cancel_requested else run.deadline
        if due is not None and due <= self.now():
            raise liveport.Overdue(update.run_id)
        return run

    def get_update(self, run_id: str, update_id: str) -> liveport.UpdateRecord | None:
        """Return the stored update, or None."""
        params = {"run_id": run_id, "update_id": update_id}
        row = self._transact(
            lambda cur: self._exec(cur, "update_get", **params).fetchone(), single=True
        )
        return None if row is None else self.read.update(row)

    def next_update(
        self, run_id: str, name: str, after_sequence: int
    ) -> liveport.UpdateRecord | None:
        """Return the run's first update named ``name`` after ``after_sequence``."""
        params = {"run_id": run_id, "name": name, "after_sequence": after_sequence}
        row = self._transact(
            lambda cur: self._exec(cur, "next_update", **params).fetchone(), single=True
        )
        return None if row is None else self.read.update(row)

    def list_updates(self, run_id: str, limit: int = 50) -> list[liveport.UpdateRecord]:
        """Return up to ``limit`` of the run's updates, newest first."""
        params: dict[str, Any] = {"run_id": run_id, "limit": max(0, limit)}
        found = self._transact(
            lambda cur: self._exec(cur, "list_updates", **params).fetchall(), single=True
        )
        return [self.read.update(r) for r in found]

    def answer_update(
        self,
        claim: port.Claim,
        entries: Sequence[port.JournalEntry],
        update_id: str,
        response: str,
        marks: Sequence[port.Mark] = (),
    ) -> bool:
        """Write entries and answer the pending update (fenced); False if it was not pending."""
        entries = rows.checked_entries(claim.run_id, entries)
        marks = ledger.checked_marks(marks)
        params = {"run_id": claim.run_id, "update_id": update_id, "response": response}

        def work(cur: C) -> bool:
            row = self._fenced(cur, "fence_touch", claim, claim.canceling, receipts=len(marks))
            self._put_journal(cur, claim.run_id, entries)
            self._append_marks(cur, claim, row["ledger_sequence"], marks)
            answered = self._exec(cur, "update_answer", **params).fetchone() is not None
            if answered:
                self._announce(cur, [claim.run_id])
                self._tell_answer(cur, claim.run_id, update_id, response)
            return answered

        return self._transact(work)

    # -- what outside readers follow ------------------------------------------------

    def record_live(
        self,
        claim: port.Claim,
        entries: Sequence[port.JournalEntry],
        marks: Sequence[port.Mark] = (),
    ) -> None:
        """Write entries (fenced) and announce the run to its watchers."""
        entries = rows.checked_entries(claim.run_id, entries)
        marks = ledger.checked_marks(marks)

        def work(cur: C) -> None:
            row = self._fenced(cur, "fence_touch", claim, claim.canceling, receipts=len(marks))
            self._put_journal(cur, claim.run_id, entries)
            self._append_marks(cur, claim, row["ledger_sequence"], marks)
            self._announce(cur, [claim.run_id])

        self._transact(work)

    def journal_after(self, run_id: str, after_position: int) -> list[port.JournalEntry]:
        """Return the run's journal entries after ``after_position``, in order."""
        params: dict[str, Any] = {"run_id": run_id, "after_position": max(0, after_position)}
        found = self._transact(
            lambda cur: self._exec(cur, "journal_after", **params).fetchall(), single=True
        )
        return [self.read.entry(r) for r in found]
