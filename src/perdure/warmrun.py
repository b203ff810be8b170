"""Warm parking, the run's side: a parked run held on its thread, and taken up again there.

:class:`WarmExecution` is a part of :class:`~perdure.execution.Execution` (a
base class of it). When a workflow waits, :meth:`WarmExecution.hold` parks
the run in the store as always, then keeps the workflow's thread where it
stopped, in a slot its worker reserved (:class:`~perdure.host.WarmHost`). A
claim handed to the slot that finds the journal as this execution left it
(:meth:`WarmExecution.matches`) goes on from the wait, with no replay; the
worker's side of it is :mod:`perdure.warmslots`, the rules :mod:`perdure.warm`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any, cast

from perdure import errors, journal, logs, replay, telemetry, validation, warm, writebuffer
from perdure import host as host_api
from perdure.store import port, warmport

if TYPE_CHECKING:
    from perdure import execution as execution_api


class WarmExecution:
    """The warm parking of an Execution: hold a parked run here, resume it under a new claim."""

    # What the Execution supplies.
    host: host_api.Host
    store: port.Store
    claimed: port.Claimed
    run_: port.Run
    lost: errors.LeaseLost | None
    log: logs.RunLog
    span: telemetry.Span
    ended: str
    _claim: port.Claim
    _lock: threading.Lock
    _buffer: writebuffer.WriteBuffer
    _cursor: replay.JournalCursor | None
    _outcomes: dict[str, journal.Outcome]
    _ahead: dict[tuple[str, int], port.UpdateRecord]
    _park_error: BaseException | None

    if TYPE_CHECKING:

        @property
        def claim(self) -> port.Claim: ...

        def _written(self, entries: list[journal.Entry]) -> None: ...

        def _guarded(self, fn: Callable[[], Any]) -> Any: ...

        def _begin_span(self) -> None: ...

    # The update waits of the last warm park, as (name, after sequence).
    _parked_on: tuple[tuple[str, int], ...] = ()
    # The claim this run was taken up under before it committed (see warm.PendingClaim).
    _pending: warm.PendingClaim | None = None

    def hold(self, waits: list[journal.WaitSpec], wake_at: datetime | None) -> bool:
        self._taken_up()
        # A run with a deadline parks the ordinary way: its deadline is enforced there.
        if self.run_.deadline is not None or self.lost is not None:
            return False
        host = self.host
        if not isinstance(host, host_api.WarmHost):
            return False
        # Always a part of an Execution: the worker keeps it whole, to hand it the next claim.
        execution = cast("execution_api.Execution", self)
        slot = host.warm_slot(execution)
        if slot is None:
            return False
        entries, marks = self._buffer.take()
        try:
            done = self.store.park(self.claim, entries, waits, wake_at=wake_at, marks=marks)
        except BaseException as exc:
            # The ordinary path settles what refused the park, as if it had tried.
            self._buffer.restore(entries, marks)
            host.warm_cooled(slot)
            self._park_error = exc
            return False
        self._written(entries)
        if not done:
            # A wait was met meanwhile: the run still holds its claim; look again.
            host.warm_cooled(slot)
            self._outcomes = {o.name: o for o in self._guarded(self._all_outcomes)}
            return True
        deadlines = [w.deadline for w in waits if w.deadline] + ([wake_at] if wake_at else [])
        wake = min(deadlines) if deadlines else None
        self.log.log(logging.DEBUG, "parked warm (%s)", ", ".join(w.name for w in waits) or wake)
        self._parked_on = tuple((w.name, w.after_sequence) for w in waits if w.kind == "update")
        host.warm_parked(execution, slot, wake)
        # This claim's span ends here, as an ordinary park's would.
        self.span.end("parked")
        self.span = telemetry.NO_SPAN
        claimed = slot.taken() if slot.wait(host.warm_for) else host.warm_cooled(slot)
        if claimed is None:
            self.ended = "parked"
            raise warm.Cooled(wake)
        if isinstance(claimed, warm.PendingClaim):
            # Goes on with what the wake-up carried; the claim is settled by
            # the first call to the store (_taken_up), before anything is written.
            with self._lock:
                self._pending = claimed
                # Parked with none, so any loss since is the parked claim's (a
                # renewal refused before the keeper heard of the park): no news.
                self.lost = None
            self._ahead = dict(claimed.updates)
            return True
        self._resume(claimed)
        return True

    def _taken_up(self) -> None:
        """Wait for the claim this run went on under before it committed, and resume under it.

        Raises:
            errors.StaleClaim: it was not made here (nothing was written since the park).
        """
        pending = self._pending
        if pending is None:
            return
        try:
            claimed = pending.result()
            if claimed is None:
                raise errors.StaleClaim(self.run_.run_id, "taken up by another claim")
            carried = self._ahead
            self._resume(claimed)
            self._ahead = {**carried, **self._ahead}
        finally:
            # Only now: until it holds the new claim, the run is taking it up.
            self._pending = None

    def lose(self, lost: errors.LeaseLost, generation: int) -> bool:
        """Take a refusal of this run's claim of ``generation``; False: not the claim it holds.

        A refusal of an earlier claim is no news, and neither is one of the
        claim the run parked with while it goes on under a claim still being
        made (:class:`warm.PendingClaim`): that claim, once made, says what
        became of the run (a cancel, a suspend), and the run stops by itself
        if it was not made.
        """
        with self._lock:
            if self._claim.generation != generation or self._pending is not None:
                return False
            self.lost = lost
            return True

    def _answered_ahead(
        self, store: warmport.AnswersAhead, entry: journal.Entry, update_id: str, response: str
    ) -> bool:
        """Write an update's answer while the claim this run went on under is being made.

        Only while that claim is pending (:class:`warm.PendingClaim`), and
        only when the run's bound on receipts keeps the claim's own. The
        answer makes the claim with it when the worker has not begun to, and
        otherwise goes ahead of it: the store writes it only once that claim
        has committed. Either way the run then resumes under the claim.
        False: nothing was written, and the caller writes the ordinary way.
        """
        pending = self._pending
        if pending is None or pending.expected is None:
            return False
        self._buffer.add(entry)
        entries, marks = self._buffer.take()
        try:
            # Sent ahead, the claim's receipt is written by another statement,
            # which this one cannot trim: the bound must keep it anyway.
            wrote = False
            if len(marks) + 2 <= self.run_.ledger_limit:
                with_claim = pending.answer_claiming(entries, update_id, response, marks)
                wrote = (
                    with_claim
                    if with_claim is not None
                    else pending.ahead(
                        lambda claim: store.answer_ahead(claim, entries, update_id, response, marks)
                    )
                )
        except BaseException:
            self._buffer.restore(entries, marks)
            raise
        if not wrote:
            self._buffer.restore(entries, marks)
            return False
        # Written under the expected claim, which therefore committed: resume under it.
        self._taken_up()
        self._written(entries)
        return True

    def _all_outcomes(self) -> list[port.Outcome]:
        return self.store.outcomes(self.run_.run_id)

    def matches(self, claimed: port.Claimed) -> bool:
        """Whether a claim of this run finds the journal exactly as this execution left it.

        What the claim read is checked as an ordinary execution checks it; a
        claim that fails the check is left to one, which sets the run aside.
        """
        if self._cursor is None or not warm.same_journal(self._cursor.entries(), claimed):
            return False
        run = claimed.run
        try:
            validation.run(run, max_failures=self.host.registry.max_failures)
            validation.outcomes(run.run_id, claimed.outcomes, claimed.journal, [])
        except errors.CorruptState:
            return False
        return True

    def known_journal(self) -> port.KnownJournal | None:
        """The journal as this execution wrote it, under the claim it holds (None: not replayed)."""
        if self._cursor is None:
            return None
        entries = tuple(self._cursor.entries())
        outcomes = frozenset(self._outcomes)
        return port.KnownJournal(self.claim.generation, entries, outcomes, self._parked_on)

    def _resume(self, claimed: port.Claimed) -> None:
        """Go on under a new claim of the run, from where its code waits."""
        self.claimed = claimed
        self.run_ = claimed.run
        run = claimed.run
        with self._lock:
            # With the claim, under the same lock as lose(): a refusal of the
            # claim before this one cannot land past this point.
            self._claim = claimed.claim
            self.lost = (
                errors.Canceled(run.run_id)
                if run.cancel_requested
                else errors.Suspended(run.run_id)
                if run.suspend_requested
                else None
            )
        # A claim by key may leave out the outcomes this execution holds (they
        # never change): what it returns is added to them.
        self._outcomes = {**self._outcomes, **{o.name: o for o in claimed.outcomes}}
        self._ahead = dict(claimed.updates)
        self.log.log(logging.DEBUG, "taken up warm (generation %d)", claimed.claim.generation)
        self._begin_span()
