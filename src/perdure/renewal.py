"""The worker's leases kept renewed: by its lease keeper, or from its heartbeat thread.

:class:`Renewal` is a part of :class:`~perdure.worker.Worker` (a base class of
it). The claim loop claims nothing until the worker's lease keeper
(:mod:`perdure.keeper`), if it has one, renews, unless the lease outlasts the
keeper's start by far. The heartbeat thread renews
the app's owner record (a worker that lost it stops at once) and, under a run
lease, has the keeper renew the leases of the runs and tasks in flight, or
renews them itself while the keeper starts or after it exited. A refused
renewal, reported by the keeper or met here, marks the execution lost: it
stops at its next check.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Literal

from perdure import errors, keeper
from perdure import execution as execution_api
from perdure import ownership as ownership_api
from perdure import tasks as tasks_api
from perdure.store import ownerport, planport, port

log = logging.getLogger("perdure.worker")

# How long a worker waits for its lease keeper to open the store before it
# renews from its own heartbeat thread instead.
_KEEPER_START = 30.0

# A claim made before the keeper renews is safe from a step holding the GIL
# if the keeper is ready, and has read the claim, before the claim's lease
# lapses: its first renewal comes one heartbeat after it is ready. A keeper is
# ready in about 0.15 s, so a worker whose lease leaves this much beyond one
# heartbeat claims at once; one with a shorter lease waits for its keeper.
_EARLY_CLAIM = 10.0


class Renewal:
    """The lease renewals of a Worker."""

    # What the Worker supplies.
    worker_id: str
    store: port.Store
    lease_ttl: float
    heartbeat: float
    liveness: Literal["process", "thread"]
    ownership: ownerport.Posture
    _owner: ownership_api.AppOwner
    _keeper: keeper.Keeper | None
    _active: dict[str, execution_api.Execution | tasks_api.TaskExecution]
    _active_lock: threading.Lock
    _stop_event: threading.Event
    _halt: threading.Event
    # When the keeper was started (monotonic), for how long it may take to be ready.
    _keeper_started: float = 0.0

    if TYPE_CHECKING:

        def stop_now(self) -> None: ...

    def _await_keeper(self) -> None:
        """Claim nothing until the keeper renews, unless the lease outlasts its start.

        A step holding the GIL from the first claim on starves the heartbeat
        thread, so its lease rests on the keeper alone. With a lease that
        leaves :data:`_EARLY_CLAIM` seconds beyond a heartbeat, the keeper is
        ready and renews long before the claim could lapse (the claim reaches
        it through its pipe before the step starts), so the worker claims at
        once and its heartbeat thread renews until the keeper is ready.
        """
        kept = self._keeper
        if kept is None:
            return
        if self.lease_ttl - self.heartbeat >= _EARLY_CLAIM:
            return
        while not kept.ready.wait(0.05):
            if self._stop_event.is_set() or self._keeper_failed(kept):
                return

    def _keeper_failed(self, kept: keeper.Keeper) -> bool:
        """Give up on a keeper that exited or took too long to start; renew from here."""
        if kept.ready.is_set():
            return False
        if kept.alive and time.monotonic() - self._keeper_started <= _KEEPER_START:
            return False
        # The claim loop and the heartbeat thread may both get here: one gives up.
        with self._active_lock:
            if self._keeper is not kept:
                return True
            self._keeper = None
            self.liveness = "thread"
        log.warning(
            "worker %s: the lease keeper did not start; renewing from this process",
            self.worker_id,
        )
        kept.close()
        return True

    def _lost(self, run_id: str, generation: int, lost: errors.LeaseLost) -> None:
        """Take the keeper's word that a renewal was refused."""
        with self._active_lock:
            execution = self._active.get(run_id)
        if execution is not None and _lose(execution, lost, generation):
            execution.log.info("lease renewal refused (%s)", lost.code)

    def _heartbeat_loop(self) -> None:
        warned = False
        while not self._halt.wait(self.heartbeat):
            if not self._owner.renew():
                # Another worker took the app over: its claims fence this one's
                # runs off; stop claiming, and stop their steps at once.
                self.stop_now()
            kept = self._keeper
            if kept is not None and self._keeper_failed(kept):
                kept = None
            if self.ownership == "none":
                pass  # no run lease to renew
            elif kept is not None and kept.ready.is_set() and kept.alive:
                kept.beat()
            else:
                if kept is not None and kept.ready.is_set() and not warned:
                    warned = True
                    log.warning(
                        "worker %s: the lease keeper exited; renewing from this process",
                        self.worker_id,
                    )
                # Also while the keeper is starting: it renews nothing yet.
                self._renew_here()
            if self._stop_event.is_set() and not self._active:
                return

    def _renew_here(self) -> None:
        for execution in list(self._active.values()):
            if execution.lost is not None:
                continue
            # The claim as read here: a warm run may go on under a newer one meanwhile.
            generation = execution.claim.generation
            try:
                if isinstance(execution, tasks_api.TaskExecution):
                    assert isinstance(self.store, planport.PlanStore)
                    claim = execution.claim
                    execution.renewed(self.store.renew_task(claim, lease_ttl=self.lease_ttl))
                    continue
                held = execution.claim
                generation = held.generation
                execution.renewed(self.store.renew(held, lease_ttl=self.lease_ttl))
            except errors.LeaseLost as lost:
                if _lose(execution, lost, generation):
                    execution.log.info("lease renewal refused (%s)", lost.code)
            except Exception as exc:
                execution.log.warning("lease renewal failed: %s", exc)


def _lose(
    execution: execution_api.Execution | tasks_api.TaskExecution,
    lost: errors.LeaseLost,
    generation: int,
) -> bool:
    """Tell ``execution`` its claim of ``generation`` was refused; False: no longer its claim."""
    if isinstance(execution, execution_api.Execution):
        return execution.lose(lost, generation)
    if execution.claim.generation != generation:
        return False
    execution.lost = lost
    return True
