"""Plans: declared task graphs, their shape digest, and the deterministic scheduling rule.

A :class:`Plan` is a DAG of tasks declared up front with ``@plan.task()``.
Everything here is pure: declaring, checking and digesting a plan, and the
scheduler functions (:func:`runnable`, :func:`blocked_by_failure`,
:func:`outcome`) that say, from the plan and its tasks' states alone, what may
run next and how the run ends. The store implements the same rule in its
claim; the functions here are its definition.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar, overload

from perdure import codec, effects, errors

__all__ = [
    "SCHEDULER_POLICY",
    "TASK_ENDED",
    "TASK_STATES",
    "Plan",
    "TaskDef",
    "blocked_by_failure",
    "outcome",
    "parent_arguments",
    "root_arguments",
    "runnable",
]

# The version of the scheduling rule below, recorded with each run: a later
# rule gets a new number, so a run is always scheduled by the rule it began with.
SCHEDULER_POLICY: int = 1

TASK_STATES: tuple[str, ...] = (
    "pending",
    "running",
    "succeeded",
    "failed",
    "blocked",
    "canceled",
    "needs_attention",
)
TASK_ENDED: frozenset[str] = frozenset(
    {"succeeded", "failed", "blocked", "canceled", "needs_attention"}
)

# Plans are a kind of workflow: their names follow the same rule.
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]{0,127}$")
_TASK_NAME_LIMIT = 200
_VARIADIC = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class TaskDef:
    """A declared task of a plan.

    ``parents`` are the tasks it runs after, as declared; ``position`` is its
    index in declaration order; ``params`` maps each named parameter (not
    ``*args`` or ``**kwargs``) to its resolved type hint (``Any`` when it has
    none); ``takes_all`` says it has ``**kwargs`` and so receives every
    parent's output.
    """

    name: str
    fn: Callable[..., Any]
    parents: tuple[str, ...]
    effect: effects.Effect
    retry: effects.Retry
    timeout: float | None
    position: int
    is_async: bool
    params: dict[str, Any]
    returns: Any
    takes_all: bool


@dataclass(frozen=True)
class _Mark:
    """What ``@plan.task`` leaves on a function, so ``after=[fn]`` finds it."""

    plan: Plan
    name: str


_MARK = "__perdure_tasks__"


def _marks(obj: Any) -> tuple[_Mark, ...]:
    found = getattr(obj, _MARK, ())
    return found if isinstance(found, tuple) else ()


class Plan:
    """A named, versioned DAG of tasks; each task of a run is claimed on its own.

    Args:
        name: the plan's name, a short identifier like a workflow's.
        version: its version, recorded with each run.
        max_recoveries: how many times a task whose worker died is claimed
            again before it goes to ``needs_attention`` (``poison_task``).

    Raises:
        errors.InvalidInput: a bad name, version or ``max_recoveries``.
    """

    def __init__(self, name: str, version: str, *, max_recoveries: int = 3) -> None:
        codec.check_text("a plan name", name, limit=128)
        if not _NAME.match(name):
            raise errors.InvalidInput(f"plan name {name!r} must be a short identifier")
        codec.check_text("a plan version", version, limit=200)
        if type(max_recoveries) is not int or max_recoveries < 0:
            raise errors.InvalidInput(f"max_recoveries is an integer >= 0, got {max_recoveries!r}")
        self.name = name
        self.version = version
        self.max_recoveries = max_recoveries
        self._tasks: dict[str, TaskDef] = {}
        self._digest: str | None = None

    def __repr__(self) -> str:
        return f"Plan({self.name!r}, version={self.version!r}, tasks={len(self._tasks)})"

    # -- declaring ------------------------------------------------------------

    @overload
    def task(self, fn: F, /) -> F: ...

    @overload
    def task(
        self,
        fn: None = None,
        /,
        *,
        name: str | None = None,
        after: Sequence[Callable[..., Any] | str] = (),
        effect: effects.Effect = "idempotent",
        retry: effects.Retry = effects.DEFAULT_RETRY,
        timeout: timedelta | float | None = None,
    ) -> Callable[[F], F]: ...

    def task(
        self,
        fn: F | None = None,
        /,
        *,
        name: str | None = None,
        after: Sequence[Callable[..., Any] | str] = (),
        effect: effects.Effect = "idempotent",
        retry: effects.Retry = effects.DEFAULT_RETRY,
        timeout: timedelta | float | None = None,
    ) -> F | Callable[[F], F]:
        """Declare a task: use it as ``@plan.task`` or ``@plan.task(after=[...], ...)``.

        A root task (no ``after=``) receives the run's inputs. A task with
        parents receives their outputs, each under its parent's name: every
        parameter must name a parent (``**kwargs`` takes them all). ``after=``
        lists task functions of this plan or task names; a name may refer to a
        task declared later (:meth:`check` refuses one never declared).
        ``effect``, ``retry`` and ``timeout`` mean what they mean for a step.
        The function is returned unchanged, marked so that ``after=[fn]``
        finds it.

        Raises:
            errors.InvalidPlan: the declaration breaks a rule; the error names
                the task.
        """

        def declare(target: F) -> F:
            self._declare(target, name, after, effect, retry, timeout)
            return target

        return declare(fn) if fn is not None else declare

    def _declare(
        self,
        fn: Callable[..., Any],
        name: str | None,
        after: Any,
        effect: Any,
        retry: Any,
        timeout: Any,
    ) -> None:
        task = self._task_name(fn, name)
        if task in self._tasks:
            raise errors.InvalidPlan(task, f"plan {self.name!r} already has a task {task!r}")
        options = _options(task, effect, retry, timeout)
        parents = self._parents(task, after)
        signature = _signature(task, fn)
        if parents:
            _check_parameters(task, signature, parents)
        self._check_acyclic(task, parents)
        hints = codec.param_hints(fn)
        params = {
            p.name: hints.get(p.name, Any)
            for p in signature.parameters.values()
            if p.kind not in _VARIADIC
        }
        takes_all = any(
            p.kind is inspect.Parameter.VAR_KEYWORD for p in signature.parameters.values()
        )
        returns = codec.return_hint(fn)
        try:
            setattr(fn, _MARK, (*_marks(fn), _Mark(self, task)))
        except (AttributeError, TypeError):
            raise errors.InvalidPlan(
                task, "a task is a plain function (perdure marks it for after=)"
            ) from None
        self._tasks[task] = TaskDef(
            name=task,
            fn=fn,
            parents=parents,
            effect=options.effect,
            retry=options.retry,
            timeout=options.timeout,
            position=len(self._tasks),
            is_async=inspect.iscoroutinefunction(fn),
            params=params,
            returns=Any if returns is None else returns,
            takes_all=takes_all,
        )
        self._digest = None

    def _task_name(self, fn: Any, name: Any) -> str:
        if isinstance(fn, str):
            raise errors.InvalidPlan(fn, "a task's name is given as @plan.task(name=...)")
        if not callable(fn):
            raise errors.InvalidPlan(
                str(name or ""), f"a task of plan {self.name!r} is a function, got {fn!r}"
            )
        task = name if name is not None else getattr(fn, "__name__", "")
        if not isinstance(task, str):
            raise errors.InvalidPlan(repr(task), "a task name is a string")
        if not task or "/" in task or "#" in task:
            raise errors.InvalidPlan(task, f"task name {task!r} must be non-empty without / or #")
        try:
            codec.check_text("a task name", task, limit=_TASK_NAME_LIMIT)
        except errors.InvalidInput as exc:
            raise errors.InvalidPlan(task, str(exc)) from None
        return task

    def _parents(self, task: str, after: Any) -> tuple[str, ...]:
        if isinstance(after, str | bytes) or not isinstance(after, Iterable):
            raise errors.InvalidPlan(
                task, f"after= takes a list of tasks or task names, got {after!r}"
            )
        parents: list[str] = []
        for item in after:
            parent = self._parent_name(task, item)
            if parent in parents:
                raise errors.InvalidPlan(task, f"task {task!r} lists parent {parent!r} twice")
            parents.append(parent)
        return tuple(parents)

    def _parent_name(self, task: str, item: Any) -> str:
        if isinstance(item, str):
            if not item or "/" in item or "#" in item:
                raise errors.InvalidPlan(task, f"after= names {item!r}, which is no task name")
            return item
        marks = _marks(item)
        mine = [m.name for m in marks if m.plan is self]
        if len(mine) == 1:
            return mine[0]
        if mine:
            raise errors.InvalidPlan(
                task,
                f"after= gives a function declared as several tasks ({', '.join(mine)}); "
                "name the one meant",
            )
        if marks:
            others = ", ".join(sorted({repr(m.plan.name) for m in marks}))
            raise errors.InvalidPlan(
                task, f"after= gives a task of plan {others}, not of plan {self.name!r}"
            )
        raise errors.InvalidPlan(task, f"after= gives {item!r}, which is not a task of any plan")

    def _check_acyclic(self, task: str, parents: tuple[str, ...]) -> None:
        # Earlier declarations were acyclic, so any cycle runs through the new task.
        came_from: dict[str, str] = {}
        stack = [(p, task) for p in parents]
        while stack:
            current, child = stack.pop()
            if current in came_from:
                continue
            came_from[current] = child
            if current == task:
                path = [task]
                step = came_from[task]
                while step != task:
                    path.append(step)
                    step = came_from[step]
                path.append(task)
                # The walk went from each task to the one after it; read it backwards.
                chain = " after ".join(repr(n) for n in reversed(path))
                raise errors.InvalidPlan(task, f"task {task!r} closes a cycle: {chain}")
            known = self._tasks.get(current)
            if known is not None:
                stack.extend((p, current) for p in known.parents)

    # -- reading --------------------------------------------------------------

    @property
    def tasks(self) -> tuple[TaskDef, ...]:
        """The declared tasks, in declaration order."""
        return tuple(self._tasks.values())

    def task_def(self, name: str) -> TaskDef | None:
        """Return the task declared under ``name``, if any."""
        return self._tasks.get(name)

    def check(self) -> None:
        """Refuse a plan that cannot run: no task, or a parent name never declared.

        Raises:
            errors.InvalidPlan: naming the plan when it has no task, else the
                first task (in declaration order) after an unknown name.
        """
        if not self._tasks:
            raise errors.InvalidPlan(self.name, f"plan {self.name!r} declares no task")
        for task in self._tasks.values():
            for parent in task.parents:
                if parent not in self._tasks:
                    raise errors.InvalidPlan(
                        task.name,
                        f"task {task.name!r} runs after {parent!r}, "
                        f"which plan {self.name!r} does not declare",
                    )

    def digest(self) -> str:
        """Return the sha256 (hex) of the plan's shape: tasks, edges and effect classes.

        The shape is, in declaration order, ``[name, sorted parents, effect]``
        for each task, as compact JSON. Code, retry policies and timeouts are
        not part of it: a run may be served by code that changed them.

        Raises:
            errors.InvalidPlan: as :meth:`check`.
        """
        if self._digest is None:
            self.check()
            shape = [[t.name, sorted(t.parents), t.effect] for t in self._tasks.values()]
            text = json.dumps(shape, separators=(",", ":"), ensure_ascii=True)
            self._digest = hashlib.sha256(text.encode("ascii")).hexdigest()
        return self._digest

    @property
    def identity(self) -> tuple[str, str, str]:
        """``(name, version, digest)``: what a run records and a worker must match."""
        return self.name, self.version, self.digest()

    def roots(self) -> tuple[str, ...]:
        """The tasks with no parent, in declaration order."""
        return tuple(t.name for t in self._tasks.values() if not t.parents)

    def children(self, name: str) -> tuple[str, ...]:
        """The tasks that run right after ``name``, in declaration order."""
        return tuple(t.name for t in self._tasks.values() if name in t.parents)

    def descendants(self, name: str) -> tuple[str, ...]:
        """Every task that runs after ``name``, directly or not, in declaration order."""
        below: set[str] = {name}
        found: list[str] = []
        # Declaration order is not a topological order (names may point
        # forward), so sweep until nothing new joins.
        grew = True
        while grew:
            grew = False
            for task in self._tasks.values():
                if task.name not in below and any(p in below for p in task.parents):
                    below.add(task.name)
                    found.append(task.name)
                    grew = True
        position = {n: t.position for n, t in self._tasks.items()}
        return tuple(sorted(found, key=position.__getitem__))


def _options(task: str, effect: Any, retry: Any, timeout: Any) -> effects.StepOptions:
    if not isinstance(retry, effects.Retry):
        raise errors.InvalidPlan(task, f"retry= takes a perdure.Retry, got {retry!r}")
    if isinstance(timeout, timedelta):
        timeout = timeout.total_seconds()
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int | float)):
        raise errors.InvalidPlan(task, f"timeout= takes seconds or a timedelta, got {timeout!r}")
    try:
        return effects.StepOptions(task, effect, retry, timeout=timeout)
    except errors.InvalidInput as exc:
        raise errors.InvalidPlan(task, str(exc)) from None


def _signature(task: str, fn: Callable[..., Any]) -> inspect.Signature:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError) as exc:
        raise errors.InvalidPlan(task, f"its signature cannot be read: {exc}") from None


def _check_parameters(task: str, signature: inspect.Signature, parents: tuple[str, ...]) -> None:
    for param in signature.parameters.values():
        if param.kind in _VARIADIC:
            continue
        if param.kind is inspect.Parameter.POSITIONAL_ONLY:
            raise errors.InvalidPlan(
                task,
                f"parameter {param.name!r} of task {task!r} is positional-only; "
                "parents' outputs are passed by name",
            )
        if param.name not in parents:
            raise errors.InvalidPlan(
                task,
                f"parameter {param.name!r} of task {task!r} names no parent "
                f"(parents: {', '.join(parents)})",
            )


# -- the scheduling rule (policy 1) ----------------------------------------------
#
# A task absent from ``states`` counts as pending: a run's tasks start there.


def runnable(plan: Plan, states: Mapping[str, str]) -> list[str]:
    """Return the pending tasks whose parents have all succeeded, in declaration order."""
    return [
        t.name
        for t in plan.tasks
        if states.get(t.name, "pending") == "pending"
        and all(states.get(p) == "succeeded" for p in t.parents)
    ]


def blocked_by_failure(plan: Plan, states: Mapping[str, str], failed: str) -> list[str]:
    """Return the tasks that become ``blocked`` (``blocked_by=failed``) when ``failed`` ends.

    ``failed`` failed for good or needs attention; its pending descendants
    are blocked at once, in declaration order, while independent branches run on.
    """
    return [n for n in plan.descendants(failed) if states.get(n, "pending") == "pending"]


def outcome(plan: Plan, states: Mapping[str, str], *, canceling: bool = False) -> str | None:
    """Return how the run ends, or None while a task is pending or running.

    ``succeeded`` when every task succeeded; else ``needs_attention`` when a
    task needs attention; else ``canceled`` when the run is being canceled;
    else ``failed``.
    """
    found = [states.get(t.name, "pending") for t in plan.tasks]
    if any(s in ("pending", "running") for s in found):
        return None
    if all(s == "succeeded" for s in found):
        return "succeeded"
    if "needs_attention" in found:
        return "needs_attention"
    return "canceled" if canceling else "failed"


# -- the arguments a task is called with ----------------------------------------


def root_arguments(
    task: TaskDef, args: list[Any], kwargs: dict[str, Any]
) -> tuple[list[Any], dict[str, Any]]:
    """Bind the run's input to a root task; each value is rebuilt as its hint declares.

    Raises:
        errors.InvalidInput: the input does not fit the task's signature.
        errors.InvalidPayload: a value does not fit its parameter's type hint.
    """
    try:
        bound = inspect.signature(task.fn).bind(*args, **kwargs)
    except TypeError as exc:
        raise errors.InvalidInput(
            f"the run's input does not fit root task {task.name!r}: {exc}"
        ) from None
    for param, value in bound.arguments.items():
        if param in task.params:
            bound.arguments[param] = _convert(task, param, value)
    return list(bound.args), dict(bound.kwargs)


def parent_arguments(task: TaskDef, outputs: Mapping[str, Any]) -> dict[str, Any]:
    """Return the keyword arguments of a task with parents: the outputs it names.

    Each named parameter gets the output of the parent of that name, rebuilt
    as its hint declares; a task with ``**kwargs`` also gets every other parent.

    Raises:
        errors.InvalidInput: a parent it takes has no output in ``outputs``.
        errors.InvalidPayload: an output does not fit its parameter's type hint.
    """
    taken = [p for p in task.parents if p in task.params or task.takes_all]
    missing = [p for p in taken if p not in outputs]
    if missing:
        raise errors.InvalidInput(
            f"task {task.name!r} takes the output of {', '.join(missing)}, which has none"
        )
    return {p: _convert(task, p, outputs[p]) if p in task.params else outputs[p] for p in taken}


def _convert(task: TaskDef, param: str, value: Any) -> Any:
    try:
        return codec.convert(value, task.params[param])
    except errors.InvalidPayload as exc:
        raise errors.InvalidPayload(f"argument {param!r} of task {task.name!r}: {exc}") from None
