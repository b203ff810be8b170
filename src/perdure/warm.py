"""Warm parking: a parked run kept in memory by its worker, resumed without a replay.

When a sync workflow waits (a signal, a message, an update, a child's result,
a sleep), its run is parked in the store as always: the lease is given back
and any worker may claim the run when it is woken. The worker that parked it
also keeps the workflow's thread where it stopped, for a short while
(``Worker(warm_for=...)``), holding a :class:`WarmSlot`. If that worker's own
claim takes the run again and the journal is exactly what this execution
wrote (no other worker ran it in between), the claim is handed to the waiting
thread, which goes on from the wait: no replay, no new execution. Otherwise
the slot is let go: the thread unwinds with :class:`Cooled` (nothing is
written: the run is already parked) and the claim, if any, is executed the
ordinary way. Every guarantee stays the store's: a warm run is parked like
any other, and its claim is an ordinary fenced claim.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime

from perdure import errors
from perdure.store import port


class Cooled(errors.Suspend):
    """A warm-parked run was not resumed here: unwind its code (it is parked already)."""

    def __init__(self, wake_at: datetime | None) -> None:
        self.wake_at = wake_at
        super().__init__("parked, not resumed here")


ClaimAnswering = Callable[
    [Sequence[port.JournalEntry], str, str, Sequence[port.Mark]],
    tuple[port.Claimed | None, bool],
]
"""Make a pending claim together with an update's answer (entries, update id, response, marks)."""


class PendingClaim:
    """A claim of a warm run still being made, handed to the run's thread before it commits.

    Handed over when the wake-up carried what the run waits for (an update),
    so that the run's thread wakes while the claim is on its way: until its
    first call to the store, it runs only workflow code, which writes nothing
    and is replayed the same way if this claim fails. That call waits for
    :meth:`result`: the claim, or None when it was not made or the run moved
    on meanwhile, and then the thread stops without writing anything.

    Who makes the claim is decided once. With ``claim_answering``, the worker
    first gives the run's thread a moment (:meth:`worker_claims`): a thread
    whose first write is the update's answer makes the claim with it, in one
    commit (:meth:`answer_claiming`); any other first call leaves the claim
    to the worker (:meth:`leave_claim`), as does a thread that takes longer.

    Once the worker makes it, one call may go ahead of it instead
    (:meth:`ahead`): the answer, sent under the claim as it will be made
    (``expected``: the next generation, to this worker), whose fence lets it
    write only once that claim has committed. A claimer that did not make
    the claim claims nothing more before that call has come back
    (``settle(None)`` waits for it), so the only claim it can write under is
    this one.
    """

    def __init__(
        self,
        updates: Mapping[tuple[str, int], port.UpdateRecord],
        expected: port.Claim | None = None,
        claim_answering: ClaimAnswering | None = None,
    ) -> None:
        self.updates = dict(updates)
        self.expected = expected
        self._claim_answering = claim_answering
        self._done = threading.Event()
        self._claimed: port.Claimed | None = None
        # Held while a call goes ahead; settle waits for it to come back.
        self._ahead = threading.Lock()
        self._went_ahead = False
        # Who makes the claim: "worker" or "run" (the run's thread, with its answer).
        self._turn = threading.Condition()
        self._claimer: str | None = None
        self._made_by_run = threading.Event()
        self._made: port.Claimed | None = None

    def worker_claims(self, timeout: float) -> bool:
        """Whether the worker makes the claim: False when the run's thread makes it (:meth:`made`).

        Waits up to ``timeout`` for the run's thread to take the claim or to
        leave it, when it may take it at all; past that, the worker makes it.
        """
        with self._turn:
            if self._claim_answering is not None:
                self._turn.wait_for(lambda: self._claimer is not None, timeout)
            if self._claimer is None:
                self._claimer = "worker"
            return self._claimer == "worker"

    def leave_claim(self) -> None:
        """The run's thread does not make the claim: the worker makes it now."""
        with self._turn:
            if self._claimer is None:
                self._claimer = "worker"
                self._turn.notify_all()

    def answer_claiming(
        self,
        entries: Sequence[port.JournalEntry],
        update_id: str,
        response: str,
        marks: Sequence[port.Mark],
    ) -> bool | None:
        """Make the claim with an update's answer; return whether the answer was written.

        None: the worker makes the claim (it began, or this claim cannot
        carry an answer), and nothing was sent. A call that fails may have
        committed: it counts as written for :meth:`settle`.
        """
        with self._turn:
            if self._claim_answering is None or self._claimer is not None:
                return None
            self._claimer = "run"
            self._turn.notify_all()
        made: port.Claimed | None = None
        wrote = True
        try:
            made, wrote = self._claim_answering(entries, update_id, response, marks)
        finally:
            self._made = made
            self._went_ahead = wrote
            self._made_by_run.set()
        return wrote

    def made(self) -> port.Claimed | None:
        """The claim the run's thread made with its answer (None: not made). Waits for it."""
        self._made_by_run.wait()
        return self._made

    def settle(self, claimed: port.Claimed | None) -> bool:
        """Give the claim as made (None: not made here); return whether a call went ahead.

        A claim made here is given at once (a call going ahead writes under
        it). None waits for a call going ahead to come back first, so that
        nothing is left in flight once the claimer may claim the run again.
        """
        if claimed is not None:
            self._claimed = claimed
            self._done.set()
            return self._went_ahead
        with self._ahead:
            self._done.set()
            return self._went_ahead

    def ahead(self, call: Callable[[port.Claim], bool]) -> bool:
        """Make ``call`` under the expected claim before :meth:`settle`; return whether it wrote.

        ``call`` returns False when its fence matched nothing (it wrote
        nothing). Not made once the claim is settled, nor without an expected
        claim: False, and the caller writes the ordinary way after
        :meth:`result`.
        """
        expected = self.expected
        if expected is None:
            return False
        with self._ahead:
            if self._done.is_set():
                return False
            wrote = call(expected)
            self._went_ahead = self._went_ahead or wrote
            return wrote

    def result(self) -> port.Claimed | None:
        """Leave the claim to the worker if not taken yet, wait for :meth:`settle`, return it."""
        self.leave_claim()
        self._done.wait()
        return self._claimed


Handed = port.Claimed | PendingClaim | None
"""What a slot's thread is handed: a claim, one on its way, or None to unwind."""


class WarmSlot:
    """Where a claim of a warm-parked run is handed to the thread that waits for it."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        # Set once the run is parked in the store: only then may a claim be handed over.
        self.parked = False
        # The journal as the run was parked with it, offered to this worker's claims.
        self.known: port.KnownJournal | None = None
        # Set once the park is decided either way (parked, or the slot given up).
        self.settled = threading.Event()
        self._handed = threading.Event()
        self._claimed: Handed = None

    def hand(self, claimed: Handed) -> None:
        """Give the waiting thread a claim to go on with (made or on its way), or None to unwind."""
        self._claimed = claimed
        self._handed.set()

    def wait(self, timeout: float) -> bool:
        """Block until a hand-over or ``timeout``; return whether one came."""
        return self._handed.wait(timeout)

    def taken(self) -> Handed:
        """The claim handed over (None: unwind). Call after a hand-over."""
        return self._claimed


def same_journal(known: list[port.JournalEntry], claimed: port.Claimed) -> bool:
    """Whether a claim's journal is exactly the one a warm execution knows."""
    if len(known) != len(claimed.journal):
        return False
    # A claim that proved the held journal current hands back its very entries:
    # those are not compared field by field (a long journal costs no more).
    return all(
        a is b
        or (a.position, a.kind, a.name, a.status, a.output, a.error, a.attempt)
        == (b.position, b.kind, b.name, b.status, b.output, b.error, b.attempt)
        for a, b in zip(known, claimed.journal, strict=True)
    )
