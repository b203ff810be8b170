"""The runs a run starts as its children: workflows or plans, one start per key.

:class:`ChildRuns` is a part of :class:`~perdure.execution.Execution` (a base
class of it): it names the workflow or plan a child call asks for, checks the
call's arguments against it, and creates the children with the run's fenced
claim. A plan child is created with its plan's tasks (:mod:`perdure.appplans`).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from perdure import appplans, context, errors, payloads, plans, telemetry
from perdure import host as host_api
from perdure import registry as registry_api
from perdure.store import planport, port


class ChildRuns:
    """The child runs of an Execution: naming, checking and creating them."""

    # What the Execution supplies.
    host: host_api.Host
    store: port.Store
    run_: port.Run
    span: telemetry.Span

    if TYPE_CHECKING:

        @property
        def claim(self) -> port.Claim: ...

        @property
        def payloads(self) -> payloads.Payloads: ...

        def _guarded(self, fn: Callable[[], Any]) -> Any: ...

    def _plan(self, workflow: Any) -> plans.Plan | None:
        """The app's plan ``workflow`` names, if it names one (a registry may have none)."""
        plan_of = getattr(self.host.registry, "plan_of", None)
        found = plan_of(workflow) if plan_of is not None else None
        return found if isinstance(found, plans.Plan) else None

    def workflow_ref(self, workflow: Any) -> tuple[str, str, Any]:
        plan = self._plan(workflow)
        if plan is not None:
            return plan.name, plan.version, None
        return self.host.registry.workflow_ref(workflow)

    def child_call(
        self, workflow: Any, key: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[str | None, dict[str, Any]]:
        plan = self._plan(workflow)
        if plan is not None:
            appplans.check_start(plan, args, kwargs)
            return (key if isinstance(key, str) else None), kwargs
        return registry_api.child_call(self.host.registry, workflow, key, args, kwargs)

    def _plan_spec(self, workflow: str) -> planport.PlanSpec | None:
        plan = self._plan(workflow)
        return None if plan is None else appplans.plan_spec(plan)

    def _parent_close(self, workflow: str) -> str | None:
        found = self.host.registry.workflow_def(workflow)
        return "cancel" if found is not None and found.parent_close == "cancel" else None

    def create_children(self, children: list[context.NewChild]) -> list[str]:
        new = [
            port.NewRun(
                run_id=uuid.uuid4().hex,
                app=self.run_.app,
                workflow=child.workflow,
                version=child.version,
                input=telemetry.with_trace(child.input, self.span.trace_context()),
                key=child.key,
                parent_id=self.run_.run_id,
                parent_close=self._parent_close(child.workflow),
                plan=self._plan_spec(child.workflow),
            )
            for child in children
        ]
        created: list[port.Run] = self._guarded(lambda: self.store.create_children(self.claim, new))
        by_key = {run.key: run for run in created}
        for asked in new:
            found = by_key.get(asked.key)
            # A key names one start: a replayed call finds its own child, but a
            # caller's key that names another child is a conflict, not a match.
            if (
                found is not None
                and found.run_id != asked.run_id
                and not port.same_start(found, asked, self.payloads.open_text)
            ):
                raise errors.KeyConflict(str(asked.key), found, asked.workflow)
        return [by_key[run.key].run_id if run.key in by_key else run.run_id for run in new]
