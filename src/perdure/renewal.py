"""The worker's leases kept renewed: by its lease keeper, or from its heartbeat thread.

:class:`Renewal` is a part of :class:`~perdure.worker.Worker` (a base class of
it). The claim loop claims nothing until the worker's lease keeper
(:mod:`perdure.keeper`), if it has one, renews. The heartbeat thread renews
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

    if TYPE_CHECKING:

        def stop_now(self) -> None: ...

    def _await_keeper(self) -> None:
        """Claim nothing until the keeper renews.

        A step holding the GIL from the first claim on would otherwise starve
        the only other renewer, the heartbeat thread.
        """
        kept = self._keeper
        if kept is None:
            return
        deadline = time.monotonic() + _KEEPER_START
        while not kept.ready.wait(0.05):
            if self._stop_event.is_set():
                return
            if not kept.alive or time.monotonic() > deadline:
                log.warning(
                    "worker %s: the lease keeper did not start; renewing from this process",
                    self.worker_id,
                )
                self._keeper = None
                self.liveness = "thread"
                kept.close()
                return

    def _lost(self, run_id: str, generation: int, lost: errors.LeaseLost) -> None:
        """Take the keeper's word that a renewal was refused."""
        with self._active_lock:
            execution = self._active.get(run_id)
        if execution is not None and execution.claim.generation == generation:
            execution.log.info("lease renewal refused (%s)", lost.code)
            execution.lost = lost

    def _heartbeat_loop(self) -> None:
        warned = False
        while not self._halt.wait(self.heartbeat):
            if not self._owner.renew():
                # Another worker took the app over: its claims fence this one's
                # runs off; stop claiming, and stop their steps at once.
                self.stop_now()
            kept = self._keeper
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
            try:
                if isinstance(execution, tasks_api.TaskExecution):
                    assert isinstance(self.store, planport.PlanStore)
                    claim = execution.claim
                    execution.renewed(self.store.renew_task(claim, lease_ttl=self.lease_ttl))
                    continue
                execution.renewed(self.store.renew(execution.claim, lease_ttl=self.lease_ttl))
            except errors.LeaseLost as lost:
                execution.log.info("lease renewal refused (%s)", lost.code)
                execution.lost = lost
            except Exception as exc:
                execution.log.warning("lease renewal failed: %s", exc)
