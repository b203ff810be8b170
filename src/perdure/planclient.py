"""The client's calls on plan runs: their tasks, resolving a task, forking a plan run.

:class:`PlanCalls` is part of :class:`perdure.client.Client`. Nothing here
needs the plan's code: a fork copies the stored shape (tasks, edges, effect
classes and digest) of the run it forks.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from perdure import appplans, codec, errors, payloads, records
from perdure.store import planport, port


def _decoded(run_id: str, text: str | None) -> Any:
    try:
        return None if text is None else codec.decode(text)
    except errors.InvalidPayload as exc:
        raise errors.CorruptState(run_id, "task_error", str(exc)) from exc


def _below(tasks: list[planport.Task], name: str) -> set[str]:
    """The descendants of task ``name``, at any depth."""
    found: set[str] = set()
    frontier = {name}
    while frontier:
        frontier = {t.name for t in tasks if frontier & set(t.parents)} - found
        found |= frontier
    return found


class PlanCalls:
    """Tasks, resolve and fork of plan runs (a part of the Client)."""

    store: port.Store
    app: str
    payloads: payloads.Payloads
    # The Client supplies them: the app's run (or RunNotFound), and what a client sees of it.
    _run: Callable[[str], port.Run]
    get: Callable[[str], records.RunInfo]

    def _resolve_task(
        self, run: port.Run, task: str, output: Any, error: str | None
    ) -> records.RunInfo:
        """Settle a plan run's task that needs attention; its descendants run on."""
        if error is not None:
            raise errors.InvalidInput(
                "a plan's task is resolved with output=: a task that failed for good "
                "is run again by fork"
            )
        store = self._plan_store()
        store.resolve_task(run.run_id, task, self.payloads.seal(output, "the resolved output"))
        return self.get(run.run_id)

    def _fork_plan(self, run: port.Run, from_task: str | None) -> str:
        """Start the plan again with the same inputs, reusing the tasks that succeeded.

        ``from_task`` also runs that task again, and everything below it.
        """
        if run.state not in port.TERMINAL_STATES:
            raise errors.RunNotFinished(
                run.run_id,
                run.state,
                f"plan run {run.run_id} is still {run.state}; fork it once it has ended",
            )
        found = self._plan_store().tasks(run.run_id)
        names = {t.name for t in found}
        if from_task is not None and from_task not in names:
            raise errors.InvalidInput(f"plan run {run.run_id} has no task {from_task!r}")
        unsettled = [t for t in found if t.state == "needs_attention" and t.effect != "pure"]
        if unsettled:
            task = unsettled[0].name
            raise errors.EffectUnsettled(
                run.run_id,
                task,
                f"task {task} of plan run {run.run_id} needs attention and its effect may "
                f"have happened, so a fork would run it again; resolve it first "
                f"(perdure resolve {run.run_id} {task} --output JSON)",
            )
        again = set() if from_task is None else {from_task, *_below(found, from_task)}
        spec = planport.PlanSpec(
            run.plan_digest or "",
            run.plan_policy or 0,
            tuple(
                planport.TaskSpec(
                    t.name,
                    t.parents,
                    t.effect,
                    t.position,
                    t.output if t.state == "succeeded" and t.name not in again else None,
                )
                for t in found
            ),
            max(t.max_recoveries for t in found),
        )
        new = port.NewRun(
            uuid.uuid4().hex, self.app, run.workflow, run.version, run.input, plan=spec
        )
        created, _ = self.store.create_run(new)
        return created.run_id

    def _plan_store(self) -> planport.PlanStore:
        if not isinstance(self.store, planport.PlanStore):
            raise errors.InvalidInput(f"the store at {self.store.url} keeps no plan runs")
        return self.store

    def tasks(self, run_id: str) -> list[records.TaskInfo]:
        """Return the tasks of a plan run in declaration order (empty for a workflow run)."""
        self._run(run_id)
        found = (
            self._plan_store().tasks(run_id) if isinstance(self.store, planport.PlanStore) else []
        )
        return [
            appplans.task_info(
                t,
                None if t.output is None else self.payloads.open_text(t.output),
                _decoded(run_id, t.error),
            )
            for t in found
        ]
