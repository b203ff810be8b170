"""Suspend and run deadlines, the run's side: letting a suspended run go, a deadline enforced.

:class:`RunControl` is a part of :class:`~perdure.execution.Execution` (a base
class of it). A suspend asked of a running run refuses its next write; the
execution records what already happened and lets the run go suspended
(``let_go``), or goes on if the suspend was withdrawn meanwhile. A run past its
deadline is canceled before its next write, and so ends by the ordinary
cancel path, with the deadline's error. The store's side is
:mod:`perdure.store.control`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from perdure import errors, journal, logs, settlement, writebuffer
from perdure.store import controlport, port


class RunControl:
    """The suspend and deadline handling of an Execution."""

    # What the Execution supplies.
    store: port.Store
    run_: port.Run
    lost: errors.LeaseLost | None
    log: logs.RunLog
    ended: str
    _buffer: writebuffer.WriteBuffer
    _deadline_asked: bool

    if TYPE_CHECKING:

        @property
        def claim(self) -> port.Claim: ...

        def now(self) -> datetime: ...

        def acknowledge_cancel(self) -> None: ...

        def _written(self, entries: list[journal.Entry]) -> None: ...

        def _guarded(self, fn: Callable[[], Any]) -> Any: ...

        def _release(self, *, failed: bool, why: str) -> None: ...

        def _settle_cancel(self) -> None: ...

    def _suspend_write(
        self,
        op: Callable[[port.Claim, Sequence[journal.Entry], Sequence[journal.Mark]], None],
        entry: journal.Entry,
        entries: list[journal.Entry],
        buffered: list[journal.Mark],
        marks: list[journal.Mark],
    ) -> None:
        """Record a write the run's suspend refused, then let go (raising Suspended).

        As for a cancel, an outcome that already happened is recorded and an
        effect that was about to start is not. If the suspend was withdrawn
        meanwhile, the write is completed and the run goes on.
        """
        starting = entry.status == "started" and not journal.retry_due(entry)
        kept = [e for e in entries if e.position != entry.position] if starting else entries
        if self._let_go(kept, [*buffered, *([] if starting else marks)]):
            raise errors.Suspended(self.run_.run_id)
        if starting:
            self._guarded(lambda: op(self.claim, [entry], marks))
            self._written([entry])

    def _let_go(self, entries: list[journal.Entry], marks: list[journal.Mark]) -> bool:
        """Record ``entries`` and hand the run back suspended; False if it was withdrawn."""
        store = controlport.require(self.store)
        suspended: bool = self._guarded(
            lambda: store.let_go(self.claim, entries, marks, reset=bool(entries))
        )
        self._written(entries)
        if suspended:
            self.lost = errors.Suspended(self.run_.run_id)
            self.ended = "suspended"
            self.log.info("suspended")
        return suspended

    def _settle_suspend(self) -> None:
        """Let go of a run whose suspend stopped it (unless that is done already)."""
        if isinstance(self.lost, errors.Suspended):
            return
        entries, marks = self._buffer.take()
        try:
            if not self._let_go(entries, marks):
                # Withdrawn after the workflow unwound: it runs again from its journal.
                self._release(failed=False, why="suspend withdrawn")
        except errors.Canceled:
            self.acknowledge_cancel()
            self._settle_cancel()

    def _enforce_deadline(self) -> None:
        """Have the run canceled before this write if it is past its deadline.

        The write that follows is then refused as canceled, and the run ends
        by the ordinary cancel path. Only runs with a deadline pay the clock read.
        """
        deadline = self.run_.deadline
        if deadline is None or self._deadline_asked or self.claim.canceling:
            return
        if self.now() >= deadline:
            self._deadline_asked = True
            store = controlport.require(self.store)
            self._guarded(lambda: store.expire_deadlines(run_id=self.run_.run_id))

    def _deadline_error(self) -> str | None:
        """Return the error of a run canceled past its deadline, or None."""
        deadline = self.run_.deadline
        if deadline is None:
            return None
        try:
            passed = self.store.now() >= deadline
        except Exception:
            passed = False
        if not passed:
            return None
        return settlement.error_text(
            controlport.DEADLINE_EXCEEDED,
            f"the run did not end by its deadline {deadline.isoformat()}",
        )
