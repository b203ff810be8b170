"""The flow-control section of the store port: suspending runs, and run deadlines.

Lifecycle additions::

    queued | waiting ──suspend──> suspended ──resume──> queued | waiting (as it was)
    running ──suspend──> running (suspend_requested) ──owner's next write──> suspended
                                                      └──resume (before it)──> running

A suspended run is never claimed. It keeps its ``ready_at`` and its registered
waits; signals, messages and updates delivered meanwhile are stored and do
not wake it, and no sweep settles its expired waits: its deadlines fire once
it is resumed, at once if they have passed. A cancel ends it at once.

While a suspend is asked of a running run, every fenced write of its owner
that is not unwinding a cancel (``Claim.canceling``) is refused with
:class:`errors.Suspended`; the owner then calls :meth:`ControlStore.let_go`
with what it still has to record. Renewals go on, so the step in flight keeps
its lease. A ``release`` of such a run gives it back ``suspended``.

A run with a ``deadline`` that has not ended by then is canceled
(``deadline_exceeded``) with its descendants, exactly as by
``request_cancel``; queued, waiting and suspended runs at once with that
error, running ones by their owner at their next write.
:meth:`ControlStore.expire_deadlines` does it; the client calls it lazily
and the worker's ``sweep`` calls it for every app.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, Protocol, runtime_checkable

from perdure import errors
from perdure.store import port

DEADLINE_EXCEEDED = "deadline_exceeded"
"""The error code of a run canceled because it passed its deadline."""

SuspendResult = Literal["suspended", "requested", "already"]


@runtime_checkable
class ControlStore(Protocol):
    """The store's suspend, resume and deadline operations."""

    def suspend(self, run_id: str) -> SuspendResult:
        """Suspend the run: at once if queued or waiting, else ask its owner.

        Returns ``suspended`` (receipt ``suspended``), ``requested`` (a running
        run; receipt ``suspend_requested``) or ``already`` (it was suspended,
        or its suspend was already asked; nothing changes).

        Raises:
            errors.RunNotFound: no such run.
            errors.RunFinished: the run has ended, or needs attention.
        """
        ...

    def unsuspend(self, run_id: str) -> port.RunState | None:
        """Resume a suspended run, or withdraw a suspend its owner has not taken yet.

        A suspended run returns to the state it was suspended from (receipt
        ``resumed``). If that is ``waiting`` and a wait is already met (an
        outcome, a message or an update it waits on, or ``ready_at`` passed),
        the run is woken to ``queued`` in the same transaction (``woken``).
        Returns the run's state afterwards, or None when the run was neither
        suspended nor asked to suspend (nothing changes).

        Raises:
            errors.RunNotFound: no such run.
            errors.RunFinished: the run has ended.
        """
        ...

    def let_go(
        self,
        claim: port.Claim,
        entries: Sequence[port.JournalEntry],
        marks: Sequence[port.Mark] = (),
        *,
        reset: bool = False,
    ) -> bool:
        """Record ``entries`` and make the claimed run ``suspended`` (fenced).

        Used by the owner of a run whose suspend was asked; the lease is
        dropped and ``suspended`` appended. ``reset`` ends a failure streak
        (``entries`` hold a step's outcome). If the suspend was withdrawn
        meanwhile, the entries are recorded, the claim stays valid and False
        is returned.

        Raises:
            errors.StaleClaim: another claim owns the run.
            errors.Canceled: the run's cancel was requested (the cancel wins).
        """
        ...

    def expire_deadlines(
        self, app: str | None = None, run_id: str | None = None, limit: int = 500
    ) -> int:
        """Cancel up to ``limit`` live runs past their deadline; return how many.

        Only runs of ``app`` / the run ``run_id`` when given. A run already
        asked to cancel is left alone.
        """
        ...


def require(store: port.Store) -> ControlStore:
    """Return ``store`` as a :class:`ControlStore`.

    Raises:
        errors.StoreError: the store cannot suspend runs or enforce deadlines.
    """
    if not isinstance(store, ControlStore):
        raise errors.StoreError(
            f"the store {type(store).__name__} cannot suspend runs or enforce run deadlines"
        )
    return store
