"""The app's plans: declaring them, starting their runs, and what a plan run looks like.

A base class of :class:`perdure.App`. ``app.plan(name, version)`` returns a
:class:`perdure.Plan` registered under ``name``, which ``app.start``
accepts like a workflow; its runs' tasks are served by the app's workers.
"""

from __future__ import annotations

import inspect
from typing import Any

from perdure import codec, errors, plans, records
from perdure.plans import Plan
from perdure.store import planport


class PlanRegistry:
    """Declaring and starting plans (a base class of App)."""

    def __init__(self) -> None:
        self._plans: dict[str, Plan] = {}

    def _plan_names_taken(self) -> set[str]:
        """Names a new plan may not take (the app's workflows); App overrides this."""
        return set()

    def plan(self, name: str, version: str = "1", *, max_recoveries: int = 3) -> Plan:
        """Declare a plan: a graph of tasks declared with ``@plan.task(after=[...])``.

        Raises:
            errors.InvalidInput: a name already taken by a workflow or a plan,
                or a bad version or ``max_recoveries``.
        """
        if name in self._plans or name in self._plan_names_taken():
            raise errors.InvalidInput(f"{name!r} already names a workflow or plan of this app")
        found = Plan(name, version, max_recoveries=max_recoveries)
        self._plans[name] = found
        return found

    def plan_def(self, name: str) -> Plan | None:
        """Return the plan registered under ``name``, or None."""
        return self._plans.get(name)

    @property
    def plans(self) -> dict[str, Plan]:
        """The app's plans by name."""
        return dict(self._plans)

    def plan_identities(self) -> list[tuple[str, str, str]]:
        """``(name, version, digest)`` of every plan this app serves (each checked first)."""
        return [p.identity for p in self._plans.values()]

    def plan_of(self, target: Any) -> Plan | None:
        """Return the plan ``target`` names (a Plan or a plan's name), or None."""
        if isinstance(target, Plan):
            found = self._plans.get(target.name)
            if found is not target:
                raise errors.WorkflowNotFound(target.name, list(self._plans))
            return found
        return self._plans.get(target) if isinstance(target, str) else None


def plan_spec(plan: Plan, outputs: dict[str, str] | None = None) -> planport.PlanSpec:
    """Return what a run of ``plan`` is created with; ``outputs`` admits tasks as succeeded.

    Raises:
        errors.InvalidPlan: a parent name still unknown, or no task at all.
    """
    digest = plan.digest()
    done = outputs or {}
    tasks = tuple(
        planport.TaskSpec(t.name, t.parents, t.effect, t.position, done.get(t.name))
        for t in plan.tasks
    )
    return planport.PlanSpec(digest, plans.SCHEDULER_POLICY, tasks, plan.max_recoveries)


_RUN_OPTIONS = ("deadline", "queue", "queue_key", "priority")


def refuse_run_options(plan: Plan, kwargs: dict[str, Any]) -> None:
    """Refuse a workflow run's start options that a plan run does not take.

    A keyword some root task takes is an input, as for a workflow's own parameters.

    Raises:
        errors.InvalidInput: ``deadline=``, ``queue=``, ``queue_key=`` or ``priority=``.
    """
    taken = {p for name in plan.roots() for p in inspect.signature(_fn(plan, name)).parameters}
    for option in _RUN_OPTIONS:
        if option in kwargs and option not in taken:
            raise errors.InvalidInput(
                f"plan {plan.name!r}: a plan run takes no {option}= (its tasks are claimed "
                "one by one, outside deadlines and queues made for whole runs)"
            )


def _fn(plan: Plan, name: str) -> Any:
    task = plan.task_def(name)
    assert task is not None
    return task.fn


def check_start(plan: Plan, args: tuple[Any, ...] | list[Any], kwargs: dict[str, Any]) -> None:
    """Refuse inputs that no root task of ``plan`` can take, before anything is stored.

    Raises:
        errors.InvalidPlan: the plan is not whole.
        errors.InvalidInput: a root cannot be called with these inputs.
        errors.InvalidPayload: a value does not fit a root's type hint.
    """
    plan.check()
    for name in plan.roots():
        task = plan.task_def(name)
        assert task is not None
        try:
            bound = inspect.signature(task.fn).bind(*args, **kwargs)
        except TypeError as exc:
            raise errors.InvalidInput(
                f"plan {plan.name!r}: root task {name!r} cannot take these inputs: {exc}"
            ) from exc
        # As for a workflow: a value its hint refuses would only fail the task later.
        for param, value in bound.arguments.items():
            if param not in task.params:
                continue
            try:
                codec.convert(codec.decode(codec.encode(value)), task.params[param])
            except errors.InvalidPayload as exc:
                raise errors.InvalidPayload(
                    f"plan {plan.name!r}: argument {param!r} of root task {name!r}: {exc}"
                ) from None


def task_info(task: planport.Task, output: Any, error: dict[str, Any] | None) -> records.TaskInfo:
    """Return the :class:`records.TaskInfo` of a stored task, its output and error decoded."""
    return records.TaskInfo(
        name=task.name,
        state=task.state,
        attempt=task.attempt,
        output=output,
        error=error,
        blocked_by=task.blocked_by,
        worker=task.worker,
        effect=task.effect,
        parents=task.parents,
        generation=task.generation,
        recoveries=task.recoveries,
        started_at=task.started_at,
        ended_at=task.ended_at,
    )
