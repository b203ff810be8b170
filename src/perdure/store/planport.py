"""The plans section of the store port: a run's tasks, each claimed on its own.

A plan run is created with its tasks (``NewRun.plan``) and is ``running`` from
the start, with no owner of its own: its tasks are what workers claim. A task
row holds its parents' names, so the store decides, inside each claim's
transaction, whether a task may run:

* the run is ``running``, neither canceled nor being canceled, and its plan
  identity (workflow, version, digest) is one the claiming worker serves;
* the task is ``pending``, its backoff (``ready_at``) has passed, and every
  parent has ``succeeded``; or the task is ``running`` under a lease that
  lapsed (a recovery).

Each claim raises the task's ``generation``; every later write of the task is
fenced by it, so a worker that lost its claim writes nothing. A lapsed task is
recovered through the same claim at most ``max_recoveries`` times; after that
it needs attention (``poison_task``), and a ``once`` task whose effect had
started needs attention at once (``effect_outcome_unknown``): it is never run
again. A task that fails for good, or needs attention, blocks every pending
descendant (``blocked``, ``blocked_by``) in the same transaction; independent
tasks run on. When no task is pending or running, the same transaction ends
the run: ``succeeded`` with every output by task name, ``needs_attention``
when a task needs it, ``canceled`` when a cancel was asked, else ``failed``
(the failed and blocked tasks in its error).

A run of the same workflow and version as a served plan but another digest
needs attention (``plan_mismatch``) when a claim comes upon it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal, Protocol, runtime_checkable

TaskState = Literal[
    "pending", "running", "succeeded", "failed", "blocked", "canceled", "needs_attention"
]
TASK_STATES: tuple[TaskState, ...] = (
    "pending",
    "running",
    "succeeded",
    "failed",
    "blocked",
    "canceled",
    "needs_attention",
)
TASK_OPEN = frozenset({"pending", "running"})

PLAN_MISMATCH = "plan_mismatch"
POISON_TASK = "poison_task"
EFFECT_OUTCOME_UNKNOWN = "effect_outcome_unknown"
TASK_FAILED = "task_failed"


@dataclass(frozen=True)
class TaskSpec:
    """A task as a plan declares it; ``output`` (JSON text) admits it already succeeded (a fork)."""

    name: str
    parents: tuple[str, ...]
    effect: str
    position: int
    output: str | None = None


@dataclass(frozen=True)
class PlanSpec:
    """What a plan run is created with: its identity's digest, the scheduling policy, its tasks."""

    digest: str
    policy: int
    tasks: tuple[TaskSpec, ...]
    max_recoveries: int = 3


@dataclass(frozen=True)
class Task:
    """A task as stored.

    ``attempt`` counts the attempts started (0 before the first claim);
    ``recoveries`` the claims that took the task from a worker whose lease
    lapsed. ``output`` and ``error`` are JSON text.
    """

    run_id: str
    name: str
    position: int
    parents: tuple[str, ...]
    effect: str
    state: TaskState
    generation: int
    attempt: int
    recoveries: int
    max_recoveries: int
    worker: str | None
    lease_expires_at: datetime | None
    ready_at: datetime | None
    effect_started: bool
    output: str | None
    error: str | None
    blocked_by: str | None
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None = None
    ended_at: datetime | None = None


@dataclass(frozen=True)
class TaskClaim:
    """The right to run one task and write its outcome, as long as ``generation`` is current.

    ``input`` is the run's input and ``parents`` each parent's output (JSON
    text, by name). ``attempt`` is the attempt this claim starts (1 first).
    """

    run_id: str
    task: str
    worker: str
    generation: int
    lease_expires_at: datetime
    attempt: int
    effect: str
    app: str
    workflow: str
    version: str
    input: str
    parents: dict[str, str] = field(default_factory=dict)
    recovered: bool = False


@dataclass(frozen=True)
class TaskEnd:
    """What a task's final write did to its run: the run's state after it, and its blocked tasks."""

    run_state: str
    blocked: tuple[str, ...] = ()


@runtime_checkable
class PlanStore(Protocol):
    """The store's task operations."""

    def claim_tasks(
        self,
        app: str,
        worker: str,
        plans: Sequence[tuple[str, str, str]],
        *,
        lease_ttl: float,
        limit: int = 1,
        recover_until: datetime | None = None,
    ) -> list[TaskClaim]:
        """Claim up to ``limit`` runnable tasks of runs of the plans ``(name, version, digest)``.

        Runs are taken oldest first and, within a run, tasks in declaration
        order. In the same transaction a lapsed task (lease past, and the
        store's instant at or before ``recover_until``) is recovered, or
        needs attention past its ``max_recoveries`` or when it is a ``once``
        task whose effect started; a lapsed task of a run being canceled is
        settled (``canceled``, or ``needs_attention`` with
        ``effect_outcome_unknown`` for an ``idempotent`` or ``once`` task);
        and a run of a served name and version with another digest needs
        attention (``plan_mismatch``). Appends ``task_claimed`` (and
        ``task_recovered``).
        """
        ...

    def renew_task(self, claim: TaskClaim, *, lease_ttl: float) -> TaskClaim:
        """Extend the task's lease (fenced); a cancel does not end it.

        Raises:
            errors.StaleClaim: the claim is no longer current.
        """
        ...

    def begin_task_effect(self, claim: TaskClaim, attempt: int) -> None:
        """Record, before a ``once`` task's attempt, that its effect starts (``effect_started``).

        Raises:
            errors.StaleClaim: the claim is no longer current.
        """
        ...

    def retry_task(self, claim: TaskClaim, attempt: int, error: str) -> None:
        """Record that attempt ``attempt - 1`` failed and ``attempt`` starts (fenced).

        Raises:
            errors.StaleClaim: the claim is no longer current.
        """
        ...

    def complete_task(self, claim: TaskClaim, output: str) -> TaskEnd:
        """Record the task's output (fenced); end the run if nothing is left to run.

        Raises:
            errors.StaleClaim: the claim is no longer current.
        """
        ...

    def fail_task(
        self,
        claim: TaskClaim,
        error: str,
        *,
        state: Literal["failed", "needs_attention"] = "failed",
    ) -> TaskEnd:
        """Record the task's final failure (fenced), block its pending descendants, end the run
        if nothing is left to run.

        Raises:
            errors.StaleClaim: the claim is no longer current.
        """
        ...

    def release_task(self, claim: TaskClaim, *, delay: float = 0.0) -> None:
        """Give the task back unstarted (a worker stopping), claimable again after ``delay``."""
        ...

    def tasks(self, run_id: str) -> list[Task]:
        """Return the run's tasks in declaration order (empty for a run that is not a plan)."""
        ...

    def resolve_task(self, run_id: str, task: str, output: str) -> TaskEnd:
        """Settle a task that needs attention as succeeded with ``output``.

        Its blocked descendants become pending again (unless another
        ancestor still holds them), and a run that had ended in
        ``needs_attention`` runs again (or ends, if nothing is left).

        Raises:
            errors.RunNotFound: no such run.
            errors.NotResolvable: the task does not need attention.
        """
        ...
