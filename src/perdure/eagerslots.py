"""Eager starts, the worker's side: the slots it holds for runs started in its process.

:class:`EagerSlots` is a part of :class:`~perdure.worker.Worker` (a base
class of it) and makes it a :class:`~perdure.starts.Taker`. A slot is
reserved before the run is created, under the lock that counts the worker's
executions, and the claim loop counts reserved slots as taken while it
claims, so the two never fill the same slot. A run created claimed is
executed exactly as a claimed one (:meth:`_dispatch`); a reservation whose
run was not created claimed frees its slot.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from perdure import execution as execution_api
from perdure import registry as registry_api
from perdure import starts
from perdure import tasks as tasks_api
from perdure import telemetry as telemetry_api
from perdure.store import ownerport, port

log = logging.getLogger("perdure.worker")


class EagerSlots:
    """The slots a Worker holds for runs started in its process."""

    # What the Worker supplies.
    worker_id: str
    store: port.Store
    registry: registry_api.Registry
    ownership: ownerport.Posture
    dry_run: bool
    concurrency: int
    telemetry: telemetry_api.Telemetry
    _claim_ttl: float
    _active: dict[str, execution_api.Execution | tasks_api.TaskExecution]
    _active_lock: threading.Lock
    _slot_freed: threading.Event
    _stop_event: threading.Event

    if TYPE_CHECKING:

        def _dispatch(
            self,
            claimed: Sequence[port.Claimed],
            known: Mapping[str, port.KnownJournal] | None = None,
        ) -> None: ...

    # Whether runs started here are offered to this worker (app.worker(eager=...)).
    eager: bool = True
    # Set once the claim loop has claimed (the keeper is up, the app is held).
    _claims_open = False
    # Slots held for runs being created claimed, and slots the claim loop is filling.
    _reserved = 0
    _claiming = 0

    @property
    def takes_starts(self) -> bool:
        """Whether a run started in this process now would go straight to this worker.

        True while the worker serves eagerly, has a slot free and is not
        claiming (its claim counts every free slot as taken until it is back).
        """
        if not (self.eager and self._claims_open) or self._stop_event.is_set():
            return False
        with self._active_lock:
            return len(self._active) + self._reserved + self._claiming < self.concurrency

    def _offer_starts(self) -> None:
        """Start taking the runs started in this process (the claim loop has claimed once)."""
        self._claims_open = True
        if self.eager:
            starts.of(self.store).offer(self)

    def _withdraw_starts(self) -> None:
        starts.of(self.store).withdraw(self)

    def reserve(self, new: port.NewRun) -> starts.Reserved | None:
        """Hold a slot for ``new`` if this worker would claim it now (see :mod:`perdure.starts`)."""
        if (
            not self._claims_open
            or self._stop_event.is_set()
            # Under store-lease a claim is fenced by the app's record; under
            # none, a run is claimed for good: both are judged by their claims.
            or self.ownership != "run-lease"
            or new.app != self.registry.name
            or new.dry_run != self.dry_run
            or (new.workflow, new.version) not in self.registry.workflow_versions()
        ):
            return None
        with self._active_lock:
            if len(self._active) + self._reserved + self._claiming >= self.concurrency:
                return None
            self._reserved += 1
        return starts.Reserved(self.worker_id, self._claim_ttl, self._take_started, self._unreserve)

    def _take_started(self, claimed: port.Claimed) -> None:
        """Execute a run created claimed by this worker, in the slot held for it."""
        self.telemetry.claimed(self.registry.name, 1)
        try:
            # Counted among the executions before the reservation goes.
            self._dispatch([claimed])
        except Exception:
            # The run is stored and its start succeeded: hand the claim back
            # so that any worker takes it now (or lets it lapse if this fails).
            log.error(
                "worker %s: run %s not taken up", self.worker_id, claimed.run.run_id, exc_info=True
            )
            with contextlib.suppress(Exception):
                self.store.release(claimed.claim, delay=0, failed=False)
        finally:
            with self._active_lock:
                self._reserved -= 1

    def _unreserve(self) -> None:
        with self._active_lock:
            self._reserved -= 1
        self._slot_freed.set()

    def _claim_slots(self) -> int:
        """The slots free for the claim loop, held as being filled until :meth:`_claims_filled`."""
        with self._active_lock:
            free = self.concurrency - len(self._active) - self._reserved
            self._claiming = max(free, 0)
        return free

    def _claims_filled(self) -> None:
        with self._active_lock:
            self._claiming = 0
        if not self._claims_open and not self._stop_event.is_set():
            # After the first claim: what was ready before this worker came is claimed first.
            self._offer_starts()
