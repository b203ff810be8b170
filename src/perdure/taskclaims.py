"""The tasks of plan runs, claimed by the worker one by one beside its runs.

:class:`TaskClaims` is a part of :class:`~perdure.worker.Worker` (a base class
of it). After each claim of runs, the worker claims tasks of the app's plans
into its free places (:meth:`perdure.store.planport.PlanStore.claim_tasks`) and
runs each as a :class:`~perdure.tasks.TaskExecution`; a task left in flight at
a stop is handed back, unless a ``once`` attempt may have had its effect.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from typing import TYPE_CHECKING

from perdure import clockwatch, errors, keeper, plans
from perdure import execution as execution_api
from perdure import registry as registry_api
from perdure import tasks as tasks_api
from perdure.store import planport, port

log = logging.getLogger("perdure.worker")


class TaskClaims:
    """Claiming, starting and abandoning the plan tasks a Worker serves."""

    # What the Worker supplies.
    worker_id: str
    registry: registry_api.Registry
    store: port.Store
    dry_run: bool
    _claim_ttl: float
    _clock_watch: clockwatch.ClockWatch
    _keeper: keeper.Keeper | None
    _stop_event: threading.Event
    _loop: asyncio.AbstractEventLoop | None

    if TYPE_CHECKING:

        def _start(self, execution: execution_api.Execution | tasks_api.TaskExecution) -> None: ...

    def _plans(self) -> dict[str, plans.Plan]:
        """The app's plans by name (a registry written before plans declares none)."""
        found = getattr(self.registry, "plans", None)
        return dict(found) if isinstance(found, dict) else {}

    def _claim_tasks(self, free: int) -> int:
        """Claim and start up to ``free`` tasks of the app's plans; return how many."""
        served = self._plans()
        if free <= 0 or not served or self.dry_run:
            return 0
        store = self.store
        if not isinstance(store, planport.PlanStore):
            return 0
        try:
            claims = store.claim_tasks(
                self.registry.name,
                self.worker_id,
                [p.identity for p in served.values()],
                lease_ttl=self._claim_ttl,
                limit=free,
                recover_until=self._clock_watch.recover_until(time.monotonic()),
            )
        except Exception as exc:
            log.warning("worker %s: task claim failed: %s", self.worker_id, exc)
            return 0
        for claim in claims:
            plan = served.get(claim.workflow)
            assert plan is not None  # claims are only of the plans served
            execution = tasks_api.TaskExecution(
                store,
                claim,
                plan,
                self.registry.payloads,
                stopping=self._stop_event,
                loop=lambda: self._loop,
            )
            self._start(execution)
            if self._keeper is not None:
                self._keeper.hold_task(execution.key, claim)
        return len(claims)

    def _abandon_task(self, execution: tasks_api.TaskExecution) -> None:
        """Hand a task back, unless a once attempt may have had its effect (then it lapses)."""
        if execution.unsettled_effect() is not None:
            log.warning(
                "worker %s left the once task %s in flight: its outcome is unknown, so it "
                "will need attention (effect_outcome_unknown)",
                self.worker_id,
                execution.key,
            )
            return
        log.warning(
            "worker %s left the task %s in flight; it will run again", self.worker_id, execution.key
        )
        if execution.lost is None and isinstance(self.store, planport.PlanStore):
            with contextlib.suppress(Exception, errors.LeaseLost):
                self.store.release_task(execution.claim)
