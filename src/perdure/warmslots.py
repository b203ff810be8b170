"""Warm parking, the worker's side: the slots its parked runs wait in, and claims handed to them.

:class:`WarmSlots` is a part of :class:`~perdure.worker.Worker` (a base class
of it) and makes it a :class:`~perdure.host.WarmHost`. A run that parks warm
takes one of at most ``warm`` slots and gives up its place among the running;
a claim of the run by this worker is handed to its slot when the run's
execution finds the journal as it left it (:mod:`perdure.warmrun`), and is
executed the ordinary way otherwise. The rules are :mod:`perdure.warm`'s.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import TYPE_CHECKING

from perdure import execution as execution_api
from perdure import keeper
from perdure import registry as registry_api
from perdure import tasks as tasks_api
from perdure import warm as warm_api
from perdure.store import ownerport, port, warmport

log = logging.getLogger("perdure.worker")

# How long a worker leaves the claim of a run it woke early to the run's
# thread, whose answer would carry it (one commit for both): that thread
# runs only workflow code until then, which takes far less on any machine.
# A thread that takes longer, or writes anything else first, is claimed for.
_ANSWER_WINDOW = 0.005


class WarmSlots:
    """The warm-parked runs of a Worker, by run id."""

    # What the Worker supplies.
    worker_id: str
    store: port.Store
    registry: registry_api.Registry
    ownership: ownerport.Posture
    dry_run: bool
    _claim_ttl: float
    _warm_cap: int
    _warm_for: float
    _warm: dict[str, tuple[warm_api.WarmSlot, execution_api.Execution]]
    _warm_lock: threading.Lock
    _active: dict[str, execution_api.Execution | tasks_api.TaskExecution]
    _active_lock: threading.Lock
    _keeper: keeper.Keeper | None
    _pool: ThreadPoolExecutor | None
    _slot_freed: threading.Event
    _stop_event: threading.Event

    if TYPE_CHECKING:

        def _note_wake(self, when: datetime | None) -> None: ...

        def _activate(
            self, execution: execution_api.Execution | tasks_api.TaskExecution
        ) -> None: ...

        def _deactivate(
            self, execution: execution_api.Execution | tasks_api.TaskExecution
        ) -> None: ...

    @property
    def warm_for(self) -> float:
        return self._warm_for

    def warm_slot(self, execution: execution_api.Execution) -> warm_api.WarmSlot | None:
        # Only a worker that serves (its claim loop hands claims over) keeps runs warm:
        # an execution driven by hand parks the ordinary way.
        if self._warm_cap == 0 or self._pool is None or self._stop_event.is_set():
            return None
        with self._warm_lock:
            if len(self._warm) >= self._warm_cap or execution.key in self._warm:
                return None
            slot = warm_api.WarmSlot(execution.key)
            self._warm[execution.key] = (slot, execution)
            return slot

    def warm_parked(
        self, execution: execution_api.Execution, slot: warm_api.WarmSlot, wake: datetime | None
    ) -> None:
        self._deactivate(execution)
        if self._keeper is not None:
            self._keeper.drop(execution.key, execution.claim.generation, settled=True)
        known = execution.known_journal()
        with self._warm_lock:
            slot.known = known
            slot.parked = True
        slot.settled.set()
        self._slot_freed.set()
        self._note_wake(wake)

    def warm_cooled(self, slot: warm_api.WarmSlot) -> warm_api.Handed:
        with self._warm_lock:
            found = self._warm.get(slot.run_id)
            if found is not None and found[0] is slot:
                del self._warm[slot.run_id]
                slot.settled.set()
                return None
        # A claim took the slot: its hand-over follows at once.
        slot.wait(5.0)
        return slot.taken()

    def _cool_all(self) -> None:
        with self._warm_lock:
            slots = [slot for slot, _ in self._warm.values()]
            self._warm.clear()
        for slot in slots:
            slot.hand(None)

    def _known_journals(self) -> dict[str, port.KnownJournal] | None:
        """The journals of the runs parked warm here, for the claim to take instead of reading."""
        if not self._warm:
            return None
        with self._warm_lock:
            return {
                run_id: slot.known
                for run_id, (slot, _) in self._warm.items()
                if slot.parked and slot.known is not None
            }

    def _claim_woken(
        self, known: Mapping[str, port.KnownJournal] | None, limit: int
    ) -> tuple[list[port.Claimed], bool]:
        """Claim by key the warm runs that the last wake-ups named, if they named only those.

        Returns the claims made and whether the ordinary claim is still due:
        it is when a wake-up named another run or none, when a named run was
        not claimed here, or when the store cannot claim by key.
        """
        store = self.store
        if not isinstance(store, warmport.WarmClaims):
            return [], True
        # Taken every time, so that what a wake-up named never lingers.
        woken = store.woken()
        if (
            not known
            or woken.others
            or not woken.runs
            or not woken.runs <= known.keys()
            or len(woken.runs) > limit
            or self.ownership == "store-lease"
        ):
            return [], True
        claimed: list[port.Claimed] = []
        for run_id in sorted(woken.runs):
            carried = warmport.carried_updates(known[run_id], woken.updates.get(run_id))
            # With the update it waits for at hand, the run goes on while it is claimed.
            early = self._hand_early(run_id, carried) if carried else None
            found: port.Claimed | None = None
            try:
                if early is not None and not early[0].worker_claims(_ANSWER_WINDOW):
                    # The run's thread makes the claim, with its answer.
                    found = early[0].made()
                else:
                    found = store.claim_warm(
                        self.registry.name,
                        self.worker_id,
                        self.registry.workflow_versions(),
                        run_id=run_id,
                        known=known[run_id],
                        lease_ttl=self._claim_ttl,
                        dry_run=self.dry_run,
                    )
            except Exception as exc:
                # The ordinary claim meets the same failure, and reports it.
                log.debug("worker %s: warm claim of %s failed: %s", self.worker_id, run_id, exc)
            finally:
                if early is not None and (found is None or not self._settle_early(early, found)):
                    pending, early = early[0], None
                    if pending.settle(None):
                        # An answer went ahead under this claim: what the claim
                        # read predates it, so the run is claimed afresh instead.
                        self._give_back(found.claim if found is not None else pending.expected)
                        found = None
            if found is None:
                return claimed, True
            if early is None:
                # The update its delivery carried: the run need not read it.
                claimed.append(dataclasses.replace(found, updates={**carried, **found.updates}))
        return claimed, False

    def _give_back(self, claim: port.Claim | None) -> None:
        """Release ``claim`` at once, for the ordinary claim to take the run with what it holds."""
        if claim is None:
            return
        try:
            self.store.release(claim, delay=0.0, failed=False)
        except Exception as exc:
            # Not released: its lease lapses, and the run is recovered then.
            log.warning("worker %s: run %s not released: %s", self.worker_id, claim.run_id, exc)

    def _hand_early(
        self, run_id: str, carried: Mapping[tuple[str, int], port.UpdateRecord]
    ) -> tuple[warm_api.PendingClaim, execution_api.Execution] | None:
        """Wake the run's warm thread with ``carried`` while its claim is being made."""
        found = self._unpark(run_id)
        if found is None:
            return None
        slot, execution = found
        expected = None
        claim_answering: warm_api.ClaimAnswering | None = None
        known = slot.known
        store = self.store
        if isinstance(store, warmport.AnswersAhead) and known is not None:
            # The claim as claim_warm will make it. Its lease is not known
            # before it is back: the last one stands in, as nothing written
            # under this claim (a fenced answer, a release) reads it.
            lease = execution.claim.lease_expires_at
            expected = port.Claim(run_id, self.worker_id, known.generation + 1, lease)
            app, worker, workflows = (
                self.registry.name,
                self.worker_id,
                self.registry.workflow_versions(),
            )
            ttl, dry_run, held = self._claim_ttl, self.dry_run, known

            def claim_answering(
                entries: Sequence[port.JournalEntry],
                update_id: str,
                response: str,
                marks: Sequence[port.Mark],
            ) -> tuple[port.Claimed | None, bool]:
                return store.claim_answering(
                    app,
                    worker,
                    workflows,
                    run_id=run_id,
                    known=held,
                    lease_ttl=ttl,
                    dry_run=dry_run,
                    entries=entries,
                    update_id=update_id,
                    response=response,
                    marks=marks,
                )

        pending = warm_api.PendingClaim(carried, expected, claim_answering)
        self._activate(execution)
        slot.hand(pending)
        return pending, execution

    def _settle_early(
        self,
        early: tuple[warm_api.PendingClaim, execution_api.Execution],
        claimed: port.Claimed,
    ) -> bool:
        """Give the claim to the run's thread woken before it; False: it must replay instead."""
        pending, execution = early
        try:
            taken = not claimed.recovered and execution.matches(claimed)
        except Exception as exc:
            # The ordinary execution of the claim checks it again, and reports it.
            log.debug("worker %s: run %s not taken up: %s", self.worker_id, claimed.run.run_id, exc)
            taken = False
        if not taken:
            log.debug("worker %s: run %s moved on; replaying", self.worker_id, claimed.run.run_id)
            return False
        pending.settle(claimed)
        # After the run's thread has its claim: the keeper renews it within
        # the lease, and the run's first write no longer waits for that.
        if self._keeper is not None:
            self._keeper.hold(claimed.claim)
        return True

    def _unpark(self, run_id: str) -> tuple[warm_api.WarmSlot, execution_api.Execution] | None:
        """Take the run's slot from the warm ones, if it waits here parked."""
        if not self._warm:
            return None
        with self._warm_lock:
            found = self._warm.get(run_id)
        if found is None:
            return None
        # A claim can follow the park's commit before its thread says it parked.
        found[0].settled.wait(1.0)
        with self._warm_lock:
            if self._warm.get(run_id) is not found or not found[0].parked:
                return None
            del self._warm[run_id]
        return found

    def _take_warm(self, claimed: port.Claimed) -> bool:
        """Hand a claim to the run's warm execution, if it waits here and still fits."""
        found = self._unpark(claimed.claim.run_id)
        if found is None:
            return False
        slot, execution = found
        if claimed.recovered or not execution.matches(claimed):
            # Another pass ran it meanwhile: the claim replays the journal instead.
            log.debug(
                "worker %s: run %s moved on elsewhere; replaying",
                self.worker_id,
                claimed.claim.run_id,
            )
            slot.hand(None)
            return False
        self._activate(execution)
        if self._keeper is not None:
            self._keeper.hold(claimed.claim)
        slot.hand(claimed)
        return True
