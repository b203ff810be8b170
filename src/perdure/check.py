"""Replay the journals of live runs against the code, before a deploy: ``perdure check``.

For every live run (queued, running, waiting) whose workflow and version the
code registers, :func:`replay_check` runs the workflow function over a
read-only :class:`ReplayRuntime`: each durable call is matched against the
recorded journal, exactly as a worker's replay matches it, and returns the
recorded outcome. No step executes and nothing is written. The replay stops
where the recorded journal ends (the next call would execute something new)
or where the code parks on what the run is waiting for. A call that does not
match the entry at its position is reported as a :class:`Mismatch`: what the
journal recorded there, and what the code now calls. So is a workflow that
ends or raises while its journal goes on.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from perdure import (
    chains,
    codec,
    context,
    errors,
    journal,
    live,
    payloads,
    plans,
    registry,
    replay,
    steps,
    telemetry,
    validation,
)
from perdure.store import port

LIVE_STATES: tuple[str, ...] = tuple(
    s for s in ("queued", "running", "waiting", "suspended") if s in port.RUN_STATES
)
"""The states whose runs a new deploy will replay."""

_PER_STATE = 100_000


@dataclass(frozen=True)
class Mismatch:
    """A run whose journal the code does not replay: what was recorded, what the code does.

    ``position`` is the journal position (1, 2, ...); ``recorded`` is the
    call the journal holds there and ``attempted`` the one the code makes
    now, each like ``step 'charge'`` or ``wait 'approval'``; ``attempted`` may
    also be ``the end of the workflow (returns)`` or ``the end of the
    workflow (raises ...)``.
    """

    run_id: str
    workflow: str
    version: str
    position: int
    recorded: str
    attempted: str

    def describe(self) -> str:
        """Return one line: the run, the position, the recorded call and the attempted one."""
        if self.position == 0:
            return f"run {self.run_id} ({self.workflow} v{self.version}): {self.attempted}"
        verb = "reaches" if self.attempted.startswith("the end") else "calls"
        return (
            f"run {self.run_id} ({self.workflow} v{self.version}) position {self.position}: "
            f"journal has {self.recorded}, code now {verb} {self.attempted}"
        )


@dataclass(frozen=True)
class Skipped:
    """A live run the check did not replay, and why."""

    run_id: str
    workflow: str
    version: str
    reason: str


@dataclass(frozen=True)
class Report:
    """What :func:`replay_check` found."""

    checked: list[str] = field(default_factory=list)
    mismatches: list[Mismatch] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.mismatches


class _Frontier(errors.Interrupt):
    """The replay reached the end of the recorded journal (or a wait with no outcome)."""

    code = "replay_frontier"


class CheckingCursor(replay.JournalCursor):
    """A journal cursor that stops at the end of the recorded journal and keeps the mismatch."""

    def __init__(self, run_id: str, entries: Sequence[port.JournalEntry]) -> None:
        super().__init__(run_id, entries)
        self.recorded_length = len(entries)
        self.mismatch: tuple[int, replay.Call, replay.Call] | None = None

    def next(self, call: replay.Call) -> port.JournalEntry | None:
        ahead = self.peek()
        if ahead is None:
            raise _Frontier("the recorded journal ends here")
        if (ahead.kind, ahead.name) != (call.kind, call.name):
            self.mismatch = (self.position + 1, replay.Call(ahead.kind, ahead.name), call)
        return super().next(call)


class ReplayRuntime:
    """A :class:`context.Runtime` that answers from the journal and writes nothing.

    Every call that would read something new or write stops the replay: the
    cursor only gives recorded entries, so those calls come only at the end of
    the recorded journal.
    """

    def __init__(self, registry: registry.Registry, cursor: CheckingCursor) -> None:
        self._registry = registry
        self._cursor = cursor

    def _stop(self, *args: Any, **kwargs: Any) -> Any:
        raise _Frontier("the replay would go past the recorded journal")

    # steps.Runtime
    def check(self) -> None:
        return None

    def recorded(self, position: int) -> journal.Entry | None:
        return self._cursor.at(position)

    def pause(self, seconds: float) -> None:
        self._stop()

    def begin_effect(self, entry: journal.Entry, marks: list[journal.Mark]) -> None:
        self._stop()

    def finish_step(self, entry: journal.Entry, marks: list[journal.Mark]) -> None:
        self._stop()

    def transaction_step(
        self, body: Callable[[Any], journal.Entry], marks: list[journal.Mark]
    ) -> journal.Entry:
        raise _Frontier("the replay would run a transaction")

    # context.Runtime
    def acknowledge_cancel(self) -> None:
        return None

    def hold(self, waits: list[journal.WaitSpec], wake_at: datetime | None) -> bool:
        return False  # a replay check parks nothing

    def workflow_ref(self, workflow: Any) -> tuple[str, str, Any]:
        return self._registry.workflow_ref(workflow)

    def child_call(
        self, workflow: Any, key: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[str | None, dict[str, Any]]:
        return registry.child_call(self._registry, workflow, key, args, kwargs)

    def successor(
        self, version: str | None, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> chains.Handover:
        return chains.Handover("", version or "", "")  # replay writes nothing

    def now(self) -> datetime:
        # Only compared with recorded deadlines: a recorded sleep is over
        # (the run went on), and an open wait stops the replay below.
        return datetime.max.replace(tzinfo=UTC)

    def buffer(self, entry: journal.Entry, mark: journal.Mark | None = None) -> None:
        self._stop()

    def outcome(self, name: str) -> journal.Outcome | None:
        raise _Frontier(f"the run waits on {name!r}")

    def settle_timeout(self, name: str) -> journal.Outcome:
        raise _Frontier(f"the run waits on {name!r}")

    def next_message(self, channel: str, after_sequence: int) -> journal.Message | None:
        raise _Frontier(f"the run waits for a message on {channel!r}")

    def create_children(self, children: list[context.NewChild]) -> list[str]:
        raise _Frontier("the replay would start children")

    @property
    def payload_limit(self) -> int:
        return self._registry.payload_limit

    @property
    def payloads(self) -> payloads.Payloads:
        return self._registry.payloads

    def step_attempt(self, key: str, effect: str, attempt: int) -> telemetry.Span:
        raise _Frontier(f"the replay would run step {key!r}")

    def next_update(self, name: str, after_sequence: int) -> live.UpdateReceived | None:
        raise _Frontier(f"the run waits for an update {name!r}")

    def answer_update(self, entry: journal.Entry, update_id: str, response: str) -> None:
        self._stop()

    def record_live(self, entry: journal.Entry) -> None:
        self._stop()


def _inputs(
    run: port.Run, wf: registry.WorkflowDef, opener: payloads.Payloads
) -> tuple[list[Any], dict[str, Any]]:
    data = opener.open_text(run.input)
    if not isinstance(data, dict) or not isinstance(data.get("args"), list):
        raise errors.CorruptState(run.run_id, "run_input_shape", "expected {args, kwargs}")
    names = list(wf.params)
    args = [
        codec.convert(v, wf.params[names[i]]) if i < len(names) else v
        for i, v in enumerate(data["args"])
    ]
    kwargs = {k: codec.convert(v, wf.params.get(k)) for k, v in data.get("kwargs", {}).items()}
    return args, kwargs


def _invoke(wf: registry.WorkflowDef, ctx: context.Context, args: list[Any], kw: Any) -> Any:
    """Call the workflow with ``ctx`` bound (an ``async`` one on an event loop of its own)."""
    if not wf.is_async:
        token = ctx.bind()
        try:
            return wf.fn(ctx, *args, **kw)
        finally:
            ctx.unbind(token)

    async def call() -> Any:
        token = ctx.bind()  # inside the task, so step calls see the replay's context
        try:
            return await wf.fn(ctx, *args, **kw)
        finally:
            ctx.unbind(token)

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(call())
    # Called from a running loop (an async test): replay on a thread of its own.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, call()).result()


def check_run(
    reg: registry.Registry, run: port.Run, entries: Sequence[port.JournalEntry]
) -> Mismatch | None:
    """Replay one run's journal against the registered code; return the mismatch, if any."""
    wf = reg.workflow_def(run.workflow)
    assert wf is not None

    def mismatch(position: int, recorded: str, attempted: str) -> Mismatch:
        return Mismatch(run.run_id, run.workflow, run.version, position, recorded, attempted)

    try:
        validation.journal(run.run_id, entries)
        cursor = CheckingCursor(run.run_id, entries)
        args, kwargs = _inputs(run, wf, reg.payloads)
    except (errors.CorruptState, errors.InvalidPayload) as exc:
        return mismatch(0, "an unreadable journal or input", f"cannot be replayed: {exc}")
    ctx = context.Context(
        run_id=run.run_id,
        workflow=run.workflow,
        runtime=ReplayRuntime(reg, cursor),
        cursor=cursor,
        asynchronous=wf.is_async,
        dry_run=run.dry_run,
    )
    try:
        _invoke(wf, ctx, args, kwargs)
        ended = "the end of the workflow (returns)"
    except (_Frontier, context.Parked):
        return None
    except chains.ContinueAsNew:
        ended = "the end of the run (continues as new)"
    except steps.Halt as halt:
        if cursor.mismatch is not None:
            position, recorded, attempted = cursor.mismatch
            return mismatch(position, recorded.describe(), attempted.describe())
        if halt.error.get("code") == "non_determinism":
            message = str(halt.error.get("message"))
            return mismatch(0, "a call that does not match", f"does not replay: {message}")
        return None  # stopped where the run stopped (an effect whose outcome is unknown)
    except errors.Interrupt:
        return None
    except Exception as exc:  # the workflow fails from here on
        ended = f"the end of the workflow (raises {type(exc).__name__}: {exc})"
    if cursor.position < cursor.recorded_length:
        nxt = cursor.at(cursor.position + 1)
        assert nxt is not None
        return mismatch(cursor.position + 1, replay.Call(nxt.kind, nxt.name).describe(), ended)
    return None


def _check_plan(reg: registry.Registry, run: port.Run, report: Report) -> None:
    """A plan run has no journal to replay: its shape must be the one this code declares."""
    plan_of = getattr(reg, "plan_def", None)
    plan = plan_of(run.workflow) if plan_of is not None else None
    if not isinstance(plan, plans.Plan):
        reason = f"this code has no plan {run.workflow}"
    elif plan.version != run.version:
        reason = f"this code has {run.workflow} version {plan.version}"
    else:
        report.checked.append(run.run_id)
        if plan.digest() != run.plan_digest:
            report.mismatches.append(
                Mismatch(
                    run.run_id,
                    run.workflow,
                    run.version,
                    0,
                    f"plan shape {run.plan_digest}",
                    f"plan shape {plan.digest()} (tasks, edges or effect classes changed; "
                    "the run would need attention with plan_mismatch)",
                )
            )
        return
    report.skipped.append(Skipped(run.run_id, run.workflow, run.version, reason))


def replay_check(reg: registry.Registry, store: port.Store) -> Report:
    """Replay every live run of ``reg``'s app whose workflow and version it registers.

    Reads runs and journals only: nothing is executed or written.
    """
    report = Report()
    known = dict(reg.workflow_versions())
    for state in LIVE_STATES:
        for run in store.list_runs(reg.name, state=state, limit=_PER_STATE):
            if run.plan_digest is not None:
                _check_plan(reg, run, report)
                continue
            if run.workflow not in known:
                reason = f"this code has no workflow {run.workflow}"
            elif known[run.workflow] != run.version:
                reason = f"this code has {run.workflow} version {known[run.workflow]}"
            else:
                report.checked.append(run.run_id)
                found = check_run(reg, run, store.journal(run.run_id))
                if found is not None:
                    report.mismatches.append(found)
                continue
            report.skipped.append(Skipped(run.run_id, run.workflow, run.version, reason))
    return report
