"""The public records perdure hands back: runs, tasks, receipts, waits, messages, history."""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from datetime import datetime
from typing import Any


@dataclass(frozen=True)
class RunInfo:
    """A run as a client sees it.

    ``attempt`` counts how many times the run has been claimed; ``failures``
    counts consecutive failed attempts. ``error`` is a dict with ``code``,
    ``message`` and, when a step is at fault, ``step``.
    """

    run_id: str
    workflow: str
    version: str
    state: str
    result: Any
    error: dict[str, Any] | None
    attempt: int
    failures: int
    created_at: datetime
    updated_at: datetime
    key: str | None = None
    parent_id: str | None = None
    cancel_requested: bool = False
    # The instant by which the run must end (else canceled, deadline_exceeded).
    deadline: datetime | None = None
    # A suspend asked of a running run, taken at its next journal write.
    suspend_requested: bool = False
    # Continue-as-new: the successor of a run that continued (it ended
    # "succeeded" with no result), and the run ids of its chain, first to
    # current, as ``app.get`` reports them (empty outside any chain).
    continued_as: str | None = None
    chain: tuple[str, ...] = ()
    # The run's queue (None: none), its key there and its priority (lower first).
    queue: str | None = None
    queue_key: str | None = None
    priority: int = 0
    # Claimed only by dry-run workers; its effectful steps are described, not performed.
    dry_run: bool = False

    @property
    def done(self) -> bool:
        return self.state in ("succeeded", "failed", "canceled", "needs_attention")


@dataclass(frozen=True)
class Receipt:
    """What a signal's sender gets back; every later sender sees the same one."""

    wait_id: str
    run_id: str
    name: str
    outcome: str
    signal_id: str | None
    at: datetime
    payload_digest: str | None


@dataclass(frozen=True)
class Wait:
    """An open wait: a run paused for a signal, a message or a child."""

    wait_id: str
    run_id: str
    name: str
    deadline: datetime | None
    kind: str = "signal"


@dataclass(frozen=True)
class Message:
    """A channel message as ``ctx.receive`` returns it (``await``-able in async workflows)."""

    key: str
    payload: Any

    def __await__(self) -> Generator[Any, None, Message]:
        return self
        yield  # never suspends: the message is here


@dataclass(frozen=True)
class Update:
    """An update as ``ctx.next_update`` returns it: answer it with ``ctx.respond``.

    ``await``-able, like a :class:`Message`, for async workflows.
    """

    update_id: str
    name: str
    payload: Any

    def __await__(self) -> Generator[Any, None, Update]:
        return self
        yield  # never suspends: the update is here


@dataclass(frozen=True)
class Provenance:
    """One receipt of a run's provenance ledger; never holds a payload."""

    sequence: int
    kind: str
    at: datetime
    generation: int
    worker: str | None
    step: str | None
    digest: str | None
    note: str | None = None


@dataclass(frozen=True)
class RunPage:
    """One page of an app's runs, newest first; ``next_cursor`` is None on the last page."""

    runs: list[RunInfo]
    next_cursor: str | None


@dataclass(frozen=True)
class JournalItem:
    """One journal entry as a reader sees it: ``output`` and ``error`` decoded from JSON.

    ``status`` is ``ok``, ``error`` or ``started`` (an effect began and has no
    recorded outcome yet); ``attempt`` is the attempt that recorded it.
    """

    position: int
    kind: str
    name: str
    status: str
    output: Any
    error: Any
    attempt: int


@dataclass(frozen=True)
class StepAttempt:
    """A failed attempt of a step, as its journal entry keeps it.

    ``code``, ``type`` and ``message`` name what the attempt raised;
    ``traceback`` is a bounded summary of where (innermost frames last);
    ``duration`` is how long the attempt ran, in seconds. The last two are
    None for attempts journaled before they were kept.
    """

    step: str
    position: int
    attempt: int
    code: str
    type: str
    message: str
    traceback: str | None
    duration: float | None


@dataclass(frozen=True)
class TaskInfo:
    """A task of a plan's run, as a client sees it.

    ``state`` is one of ``pending`` (a parent has not succeeded), ``running``,
    ``succeeded``, ``failed``, ``blocked`` (an ancestor failed or needs
    attention; ``blocked_by`` names that ancestor), ``canceled`` or
    ``needs_attention``. ``attempt`` counts the task's attempts; ``output`` is
    its result once it succeeded; ``error`` is a dict with ``code`` and
    ``message`` once it failed; ``worker`` is the id (host and pid) of the
    worker that last claimed it. ``effect`` is the task's effect class and
    ``parents`` the tasks it runs after. ``generation`` grows at each claim
    (the fence of its writes), ``recoveries`` counts claims taken over from a
    worker that died.
    """

    name: str
    state: str
    attempt: int
    output: Any
    error: dict[str, Any] | None
    blocked_by: str | None
    worker: str | None
    effect: str = "idempotent"
    parents: tuple[str, ...] = ()
    generation: int = 0
    recoveries: int = 0
    started_at: datetime | None = None
    ended_at: datetime | None = None


@dataclass(frozen=True)
class ScheduleInfo:
    """A schedule as the store holds it, with its next tick.

    ``last_tick`` is the latest tick whose run was started (``last_run_id``);
    ``next_tick`` is None while the schedule is paused.
    """

    app: str
    name: str
    workflow: str
    cron: str
    tz: str
    catch_up: str
    paused: bool
    last_tick: datetime | None
    last_run_id: str | None
    next_tick: datetime | None
