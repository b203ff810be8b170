"""Context and replay over an in-memory Runtime: workflow semantics with no store at all."""

from __future__ import annotations

import ast
import inspect
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import perdure
from perdure import (
    attempts,
    bodyshape,
    children,
    childruns,
    codec,
    context,
    effects,
    errors,
    execution,
    host,
    journal,
    livecontext,
    payloads,
    replay,
    runcontrol,
    settlement,
    steps,
    telemetry,
    warmrun,
    writebuffer,
)
from perdure import runtime as runtime_protocol  # tests name their fake runtimes "runtime"

T0 = datetime(2030, 1, 1, tzinfo=UTC)


class FakeRuntime:
    """Everything a Context asks of its runtime, kept in lists: the journal is ``stored``."""

    def __init__(
        self,
        cursor: replay.JournalCursor,
        *,
        outcomes: tuple[journal.Outcome, ...] = (),
        messages: tuple[journal.Message, ...] = (),
    ) -> None:
        self.cursor = cursor
        self.stored: list[journal.Entry] = cursor.entries()
        self.marks: list[journal.Mark] = []
        self.writes: list[str] = []
        self.pending: list[journal.Entry] = []
        self.pending_marks: list[journal.Mark] = []
        self.clock = T0
        self.canceling = False
        self.outcomes = {o.name: o for o in outcomes}
        self.messages = list(messages)
        self.children: list[context.NewChild] = []
        self.payload_limit = 2 * 1024 * 1024
        self.payloads = payloads.PLAIN

    # -- what steps need ----------------------------------------------------------

    def check(self) -> None:
        pass

    def pause(self, seconds: float) -> None:
        pass

    def hold(self, waits: list[journal.WaitSpec], wake_at: datetime | None) -> bool:
        return False

    def recorded(self, position: int) -> journal.Entry | None:
        return self.cursor.at(position)

    def step_attempt(self, key: str, effect: str, attempt: int) -> telemetry.Span:
        return telemetry.NO_SPAN

    def _commit(self, op: str, entries: list[journal.Entry], marks: list[journal.Mark]) -> None:
        self.writes.append(op)
        for entry in entries:
            index = entry.position - 1
            if index < len(self.stored):
                self.stored[index] = entry
            else:
                self.stored.append(entry)
            self.cursor.record(entry)
        self.marks += marks

    def _write(self, op: str, entry: journal.Entry, marks: list[journal.Mark]) -> None:
        self.buffer(entry)
        entries, buffered = self.pending, self.pending_marks
        self.pending, self.pending_marks = [], []
        self._commit(op, entries, [*buffered, *marks])

    def begin_effect(self, entry: journal.Entry, marks: list[journal.Mark]) -> None:
        self._write("begin_effect", entry, marks)

    def finish_step(self, entry: journal.Entry, marks: list[journal.Mark]) -> None:
        self._write("finish_step", entry, marks)

    def transaction_step(
        self, body: Callable[[Any], journal.Entry], marks: list[journal.Mark]
    ) -> journal.Entry:
        entry = body("connection")
        self._write("transaction_step", entry, marks)
        return entry

    # -- what the context needs besides -------------------------------------------

    def acknowledge_cancel(self) -> None:
        self.canceling = True

    def workflow_ref(self, workflow: Any) -> tuple[str, str, Any]:
        return (workflow if isinstance(workflow, str) else workflow.__name__), "1", None

    def child_call(
        self, workflow: Any, key: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[str | None, dict[str, Any]]:
        return key, kwargs

    def now(self) -> datetime:
        return self.clock

    def buffer(self, entry: journal.Entry, mark: journal.Mark | None = None) -> None:
        self.pending = [e for e in self.pending if e.position != entry.position]
        self.pending.append(entry)
        if mark is not None:
            self.pending_marks.append(mark)

    def outcome(self, name: str) -> journal.Outcome | None:
        return self.outcomes.get(name)

    def settle_timeout(self, name: str) -> journal.Outcome:
        outcome = journal.Outcome("r1", name, "timed_out", None, None, None, self.clock)
        return self.outcomes.setdefault(name, outcome)

    def next_message(self, channel: str, after_sequence: int) -> journal.Message | None:
        return next(
            (m for m in self.messages if m.channel == channel and m.sequence > after_sequence),
            None,
        )

    def park(self) -> None:
        """Write what is buffered, as a park that found its wait settled does."""
        entries, marks = self.pending, self.pending_marks
        self.pending, self.pending_marks = [], []
        self._commit("park", entries, marks)

    def create_children(self, children: list[context.NewChild]) -> list[str]:
        self.children += children
        return [f"child-{len(self.children) - len(children) + i + 1}" for i in range(len(children))]


def make(
    recorded: list[journal.Entry] | None = None, **fake: Any
) -> tuple[context.Context, FakeRuntime]:
    cursor = replay.JournalCursor("r1", recorded or [])
    runtime = FakeRuntime(cursor, **fake)
    ctx = context.Context(run_id="r1", workflow="wf", runtime=runtime, cursor=cursor)
    return ctx, runtime


def step_entry(position: int, name: str, value: Any) -> journal.Entry:
    return journal.Entry(position, "step", name, "ok", journal.Value(value).encode())


def test_the_runtime_satisfies_the_protocol() -> None:
    ctx, runtime = make()
    typed: context.Runtime = runtime  # checked by mypy when the test is type-checked
    assert typed is runtime
    assert ctx.run_id == "r1"


def test_a_step_executes_and_is_recorded() -> None:
    ctx, runtime = make()
    calls: list[int] = []

    def reserve(n: int) -> dict[str, int]:
        calls.append(n)
        return {"cents": n * 100}

    assert ctx.step(reserve, 3) == {"cents": 300}
    assert calls == [3]
    assert runtime.writes == ["finish_step"]
    assert runtime.stored == [journal.Entry(1, "step", "reserve", "ok", '{"cents":300}')]
    assert [m.kind for m in runtime.marks] == ["step_started", "step_completed"]
    assert runtime.marks[1].digest == codec.digest('{"cents":300}')


def test_a_replayed_step_returns_its_recorded_value_without_running() -> None:
    ctx, runtime = make([step_entry(1, "reserve", {"cents": 7})])

    def reserve(n: int) -> dict[str, int]:
        raise AssertionError("a recorded step must not run again")

    assert ctx.step(reserve, 3) == {"cents": 7}
    assert runtime.writes == []


def test_replay_stops_at_the_first_unrecorded_position() -> None:
    ctx, runtime = make([step_entry(1, "tick", 1)])

    def tick() -> int:
        return 2

    assert [ctx.step(tick), ctx.step(tick)] == [1, 2]
    assert runtime.stored[1] == step_entry(2, "tick#2", 2)


def test_values_recorded_since_the_last_write_go_with_the_next_step() -> None:
    ctx, runtime = make()
    first = ctx.now()
    assert first == T0
    assert runtime.stored == []  # buffered, not yet written

    def ship() -> str:
        return "TRK"

    assert ctx.step(ship) == "TRK"
    assert [(e.position, e.kind) for e in runtime.stored] == [(1, "now"), (2, "step")]
    assert runtime.writes == ["finish_step"]


def test_a_failing_step_is_recorded_as_failed_once_its_retries_run_out() -> None:
    ctx, runtime = make()

    def flaky() -> None:
        raise ValueError("down")

    flaky.__perdure_step__ = effects.StepOptions("flaky", retry=perdure.Retry(max_attempts=2))  # type: ignore[attr-defined]

    with pytest.raises(errors.StepFailed, match="down"):
        ctx.step(flaky)
    [entry] = runtime.stored
    assert (entry.status, entry.attempt) == ("error", 2)
    error = journal.StepError.decode(entry.error)
    assert (error.type, error.message, error.code) == ("ValueError", "down", "step_failed")
    assert [(a.attempt, a.type, a.message) for a in error.attempts] == [
        (1, "ValueError", "down"),
        (2, "ValueError", "down"),
    ]
    # The first failure was written before the retry, so a crash keeps it.
    assert runtime.writes == ["finish_step", "finish_step"]


def test_a_sleep_parks_until_its_journaled_deadline_then_passes() -> None:
    ctx, runtime = make()
    with pytest.raises(context.Parked) as parked:
        ctx.sleep(timedelta(minutes=5))
    assert parked.value.wake_at == T0 + timedelta(minutes=5)
    assert parked.value.waits == []
    [sleep] = runtime.pending  # written with the park, by the execution
    assert journal.Instant.decode(sleep.output).value == T0 + timedelta(minutes=5)

    # Replayed later: the deadline is the journaled one, not now + 5 minutes.
    ctx, runtime = make([sleep])
    runtime.clock = T0 + timedelta(minutes=4)
    with pytest.raises(context.Parked) as again:
        ctx.sleep(timedelta(minutes=5))
    assert again.value.wake_at == T0 + timedelta(minutes=5)
    runtime.clock = T0 + timedelta(minutes=5)
    ctx.restart()
    ctx.sleep(timedelta(minutes=5))  # due: returns


def test_a_wait_with_a_recorded_outcome_returns_its_payload() -> None:
    text = codec.encode({"ok": True})
    signaled = journal.Outcome("r1", "approval", "signaled", "s-1", text, codec.digest(text), T0)
    ctx, runtime = make(outcomes=(signaled,))
    assert ctx.wait("approval", timeout=timedelta(hours=1)) == {"ok": True}
    [applied] = runtime.pending
    assert applied.status == "ok"
    body = journal.Signaled.decode(applied.output)
    assert (body.signal_id, body.at, body.digest) == ("s-1", T0, codec.digest(text))
    assert runtime.pending_marks == [journal.Mark("outcome_applied", "approval", body.digest)]


def test_a_wait_without_an_outcome_parks_on_it_with_its_deadline() -> None:
    ctx, runtime = make()
    with pytest.raises(context.Parked) as parked:
        ctx.wait("approval", timeout=timedelta(hours=1))
    assert parked.value.waits == [journal.WaitSpec("approval", "signal", T0 + timedelta(hours=1))]
    [opened] = runtime.pending
    assert opened.status == "started"
    assert journal.Opened.decode(opened.output).deadline == T0 + timedelta(hours=1)


def test_a_wait_past_its_deadline_times_out() -> None:
    opened = journal.Entry(1, "wait", "approval", "started", journal.Opened(T0).encode())
    ctx, runtime = make([opened])
    with pytest.raises(errors.WaitTimedOut):
        ctx.wait("approval", timeout=timedelta(hours=1))
    [ended] = runtime.pending
    assert journal.WaitEnded.decode(ended.error).outcome == "timed_out"


def test_a_receive_consumes_messages_in_order() -> None:
    messages = tuple(
        journal.Message("r1", "events", f"k{i}", i, codec.encode(i * 10), T0) for i in (1, 2)
    )
    ctx, _ = make(messages=messages)
    assert ctx.receive("events") == perdure.Message("k1", 10)
    assert ctx.receive("events") == perdure.Message("k2", 20)
    with pytest.raises(context.Parked) as parked:
        ctx.receive("events")
    assert parked.value.waits == [journal.WaitSpec("events", "channel", None, 2)]


def test_children_are_created_once_and_their_result_is_applied() -> None:
    ctx, runtime = make()

    def run() -> Any:
        return ctx.start_child("ship", "o-1").result()

    with pytest.raises(context.Parked) as parked:
        run()
    assert parked.value.waits == [journal.WaitSpec("child:child-1", "child")]
    assert [(c.workflow, c.key) for c in runtime.children] == [("ship", "r1/1")]
    ended = codec.encode({"run_id": "child-1", "state": "succeeded", "result": 5, "error": None})
    runtime.outcomes["child:child-1"] = journal.Outcome(
        "r1", "child:child-1", "signaled", None, ended, codec.digest(ended), T0
    )
    runtime.park()  # the park found the outcome: the run goes on from the top
    ctx.restart()
    assert run() == 5
    assert len(runtime.children) == 1  # replayed, not created again
    assert runtime.pending[-1] == journal.Entry(2, "child_result", "child-1", "ok", "5")


def test_logical_time_and_randomness_replay_as_first_seen() -> None:
    ctx, runtime = make()
    first = (ctx.now(), ctx.random(), ctx.uuid())
    recorded = list(runtime.pending)
    ctx, runtime = make(recorded)
    runtime.clock = T0 + timedelta(days=1)
    assert (ctx.now(), ctx.random(), ctx.uuid()) == first
    assert isinstance(first[2], uuid.UUID)


def test_a_journal_for_other_code_needs_attention() -> None:
    ctx, _ = make([step_entry(1, "reserve", 1)])
    with pytest.raises(steps.Halt) as halted:
        ctx.sleep(1)
    assert halted.value.reason == "needs_attention"
    assert halted.value.error["code"] == "non_determinism"


def test_an_unreadable_body_needs_attention() -> None:
    broken = journal.Entry(1, "wait", "approval", "started", '{"no_deadline":1}')
    ctx, _ = make([broken])
    with pytest.raises(steps.Halt) as halted:
        ctx.wait("approval")
    assert halted.value.error["invariant"] == "journal_output_shape"


# The execution and its parts: its base classes, what it needs of its host, its write buffer.
EXECUTION = (execution, childruns, warmrun, runcontrol, settlement, host, writebuffer)
CONTEXT = (context, children, livecontext, runtime_protocol)


@pytest.mark.parametrize(
    "module", [*CONTEXT, steps, replay, journal, attempts, bodyshape, *EXECUTION]
)
def test_the_workflow_layers_import_no_store_and_no_worker(module: Any) -> None:
    """context (and its parts) and steps never see the store; the others see only its port."""
    tree = ast.parse(inspect.getsource(module))
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            imported |= {f"{node.module}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names}
    engine = {name for name in imported if name.startswith("perdure")}
    above = ("worker", "client", "app") + (() if module in EXECUTION else ("execution",))
    assert not {n for n in engine if n.split(".")[1] in above}
    if module in (*CONTEXT, steps):
        assert not {n for n in engine if n.startswith("perdure.store")}
    if module is steps:
        assert "perdure.context" not in engine
    else:
        store_port = {
            "perdure.store.port",
            "perdure.store.liveport",
            "perdure.store.controlport",
            "perdure.store.chainport",
            "perdure.store.planport",
            "perdure.store.warmport",
        }
        assert engine <= {f"perdure.{m}" for m in _allowed(module)} | store_port


def _allowed(module: Any) -> set[str]:
    return {
        context: {
            "chains",
            "children",
            "codec",
            "dryrun",
            "errors",
            "journal",
            "livecontext",
            "ready",
            "records",
            "replay",
            "runtime",
            "select",
            "signals",
            "steps",
        },
        children: {"codec", "errors", "journal", "replay", "runtime"},
        livecontext: {
            "codec",
            "errors",
            "journal",
            "live",
            "records",
            "replay",
            "runtime",
            "steps",
        },
        runtime_protocol: {"chains", "journal", "live", "steps"},
        replay: {"effects", "errors", "validation"},
        journal: {"attempts", "bodyshape", "codec"},
        attempts: {"bodyshape", "codec"},
        bodyshape: {"codec"},
        execution: {
            "execution",  # its parts name it (under TYPE_CHECKING)
            "childruns",
            "host",
            "runcontrol",
            "settlement",
            "warmrun",
            "writebuffer",
            "warm",
            "appplans",
            "plans",
            "chains",
            "codec",
            "context",
            "effects",
            "endings",
            "errors",
            "journal",
            "live",
            "logs",
            "payloads",
            "registry",
            "replay",
            "steps",
            "telemetry",
            "validation",
        },
    }[execution if module in EXECUTION else module]
