"""``ctx.first``: the durable select over signals, messages, updates, children and timers.

Runs are driven by hand (a claim, then the worker's own execution of it, in
this thread) on a FakeClock, so every order is exact. Each source kind wins
in turn; the sources that lose are shown unconsumed by later waits that get
them; the recorded winner is replayed after something earlier in argument
order arrived; timers win only when their journaled deadline is reached.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import perdure
from perdure import worker as worker_api
from perdure.testing.clock import FakeClock

MONTH = timedelta(days=30)

SHIFTY: dict[str, Any] = {}  # the sources of the workflow `shifty`, changed between passes

EXIT = perdure.signal("exit")
GREET = perdure.message("greetings")
ADD = perdure.update("add")
TICK = perdure.timer(MONTH)


def shown(value: Any) -> Any:
    if isinstance(value, perdure.Message):
        return ["message", value.key, value.payload]
    if isinstance(value, perdure.Update):
        return ["update", value.update_id, value.payload]
    return value


def make_app(url: str, clock: FakeClock) -> perdure.App:
    app = perdure.App(url, name=f"first_{uuid.uuid4().hex[:8]}", clock=clock, max_failures=100)

    def drain(ctx: perdure.Context, fired: perdure.Fired, out: dict[str, Any]) -> None:
        """Take every source that lost, as the plain waits do: they must all be there."""
        if isinstance(fired.value, perdure.Update):
            ctx.respond(fired.value, "by first")
        if fired.source != EXIT:
            out["exit"] = ctx.wait("exit")
        if fired.source != GREET:
            out["greetings"] = shown(ctx.receive("greetings"))
        if fired.source != ADD:
            late = ctx.next_update("add")
            ctx.respond(late, "by next_update")
            out["add"] = shown(late)

    @app.workflow()
    def pick(ctx: perdure.Context) -> dict[str, Any]:
        fired = ctx.first(EXIT, GREET, ADD, TICK)
        out: dict[str, Any] = {"index": fired.index, "value": shown(fired.value)}
        drain(ctx, fired, out)
        return out

    @pick.query("added")
    def added(view: perdure.RunView) -> list[str]:
        return [u.update_id for u in view.updates("add")]

    @app.workflow()
    async def apick(ctx: perdure.Context) -> dict[str, Any]:
        fired = await ctx.first(EXIT, GREET, ADD, TICK)
        out: dict[str, Any] = {"index": fired.index, "value": shown(fired.value)}
        if isinstance(fired.value, perdure.Update):
            ctx.respond(fired.value, "by first")
        if fired.source != EXIT:
            out["exit"] = await ctx.wait("exit")
        if fired.source != GREET:
            out["greetings"] = shown(await ctx.receive("greetings"))
        if fired.source != ADD:
            late = await ctx.next_update("add")
            ctx.respond(late, "by next_update")
            out["add"] = shown(late)
        return out

    @app.workflow()
    def twice(ctx: perdure.Context) -> list[Any]:
        # The winner is recorded, then the run parks elsewhere; a signal that
        # would win a fresh evaluation arrives before it is replayed.
        fired = ctx.first(EXIT, GREET)
        seen = shown(fired.value)
        more = ctx.wait("more")
        return [fired.index, seen, more, ctx.wait("exit")]

    @app.workflow()
    def timed(ctx: perdure.Context) -> Any:
        try:
            fired = ctx.first(EXIT, GREET, timeout=timedelta(hours=1))
        except perdure.WaitTimedOut:
            return ["timed out", ctx.wait("exit")]
        return fired.index

    @app.workflow()
    def kid(ctx: perdure.Context) -> Any:
        got = ctx.wait("finish")
        if got == "fail":
            raise ValueError("the child was told to fail")
        return {"kid": got}

    @app.workflow()
    def parent(ctx: perdure.Context) -> list[Any]:
        handle = ctx.start_child(kid)
        stop = perdure.signal("stop")
        try:
            fired = ctx.first(perdure.child(handle), stop)
        except perdure.ChildFailed as exc:
            return ["child failed", exc.state]
        if fired.source == stop:
            # The child lost and keeps running: its result is still there to await.
            return ["stopped", fired.value, handle.result()]
        return ["child", fired.value]

    @app.workflow()
    def shifty(ctx: perdure.Context) -> Any:
        return ctx.first(*SHIFTY["sources"]).index

    @app.workflow()
    def bad(ctx: perdure.Context, how: str) -> Any:
        if how == "none":
            return ctx.first()
        if how == "twice":
            return ctx.first(EXIT, perdure.signal("exit"))
        if how == "clash":
            return ctx.first(perdure.signal("x"), perdure.message("x"))
        return ctx.first("exit")  # type: ignore[arg-type]

    return app


def drive(app: perdure.App) -> list[str]:
    """Claim what is ready and execute it to its next resting point; return the run ids."""
    worker = perdure.Worker(app, app.store, concurrency=1, lease_ttl=3, heartbeat=1)
    # Async workflows run on the worker's event loop, which only start() makes.
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    worker._loop = loop
    try:
        claimed = app.store.claim(app.name, worker.worker_id, app.workflow_versions(), lease_ttl=3)
        for item in claimed:
            worker_api.Execution(worker, item).run()
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()
    return [c.claim.run_id for c in claimed]


def deliver(app: perdure.App, rid: str, what: str) -> None:
    if what == "exit":
        app.signal(rid, "exit", "bye", signal_id="s-exit")
    elif what == "greetings":
        assert app.send(rid, "greetings", "k1", "hello")
    else:
        with pytest.raises(perdure.UpdateTimedOut):
            app.update(rid, "add", 7, update_id="u1", timeout=0)


EXPECTED = {
    "exit": "bye",
    "greetings": ["message", "k1", "hello"],
    "add": ["update", "u1", 7],
}
ORDER = ["exit", "greetings", "add"]


def firsts(app: perdure.App, rid: str) -> list[tuple[str, str, str]]:
    return [(e.kind, e.name, e.status) for e in app.store.journal(rid) if e.kind == "first"]


@pytest.fixture
def app(store_url: str) -> Iterator[tuple[perdure.App, FakeClock]]:
    clock = FakeClock()
    made = make_app(store_url, clock)
    yield made, clock
    made.close()


@pytest.mark.parametrize("workflow", ["pick", "apick"])
@pytest.mark.parametrize("winner", ORDER)
def test_each_source_wins_from_a_parked_run_and_the_losers_stay(
    app: tuple[perdure.App, FakeClock], winner: str, workflow: str
) -> None:
    a, _ = app
    rid = a.start(workflow).run_id
    assert drive(a) == [rid]
    assert a.get(rid).state == "waiting"
    assert sorted(w.name for w in a.waits(rid)) == ["add", "exit", "greetings"]
    deliver(a, rid, winner)
    assert a.get(rid).state == "queued"  # any source wakes the run
    drive(a)
    for other in ORDER:
        if other != winner:
            deliver(a, rid, other)
            drive(a)
    info = a.get(rid)
    assert info.state == "succeeded", info.error
    result = info.result
    assert result["index"] == ORDER.index(winner)
    assert result["value"] == EXPECTED[winner]
    assert {k: v for k, v in result.items() if k in ORDER} == {
        k: v for k, v in EXPECTED.items() if k != winner
    }
    label = "signal:exit|message:greetings|update:add|timer"
    assert firsts(a, rid) == [("first", label, "ok")]
    applied = [h.step for h in a.history(rid) if h.kind == "outcome_applied"]
    assert applied[0] == winner  # the winner's receipt, then the later waits'
    if winner == "add":
        assert a.update(rid, "add", 7, update_id="u1", timeout=0) == "by first"
    if workflow == "pick":
        assert a.query(rid, "added") == ["u1"]  # the view sees an update a first took
    # A sender's retry after the end gets its original receipt.
    again = a.signal(rid, "exit", "bye", signal_id="s-exit")
    assert (again.name, again.outcome) == ("exit", "signaled")


@pytest.mark.parametrize("present", [ORDER, ORDER[1:], ORDER[2:], ["exit", "add"]])
def test_with_several_ready_the_first_in_argument_order_wins(
    app: tuple[perdure.App, FakeClock], present: list[str]
) -> None:
    a, _ = app
    rid = a.start("pick").run_id
    for what in reversed(present):  # arrival order does not matter, argument order does
        deliver(a, rid, what)
    drive(a)
    for other in ORDER:
        if other not in present:
            deliver(a, rid, other)
            drive(a)
    info = a.get(rid)
    assert info.state == "succeeded", info.error
    assert info.result["index"] == ORDER.index(present[0])
    assert info.result["value"] == EXPECTED[present[0]]
    # Every source that lost was still there for the plain wait after it.
    for other in ORDER:
        if other != present[0]:
            assert info.result[other] == EXPECTED[other]


def test_the_timer_wins_at_its_journaled_deadline_and_a_late_signal_is_kept(
    app: tuple[perdure.App, FakeClock],
) -> None:
    a, clock = app
    rid = a.start("pick").run_id
    assert drive(a) == [rid]
    clock.advance((MONTH - timedelta(seconds=1)).total_seconds())
    assert drive(a) == []  # not due yet: nothing to claim
    assert a.get(rid).state == "waiting"
    clock.advance(2)
    assert drive(a) == [rid]
    assert firsts(a, rid) == [("first", "signal:exit|message:greetings|update:add|timer", "ok")]
    for other in ORDER:
        deliver(a, rid, other)
        drive(a)
    info = a.get(rid)
    assert info.state == "succeeded", info.error
    assert info.result == {"index": 3, "value": None, **EXPECTED}


def test_the_timeout_raises_and_leaves_the_sources_alone(
    app: tuple[perdure.App, FakeClock],
) -> None:
    a, clock = app
    rid = a.start("timed").run_id
    assert drive(a) == [rid]
    clock.advance(3601)
    assert drive(a) == [rid]
    assert firsts(a, rid) == [("first", "signal:exit|message:greetings", "error")]
    deliver(a, rid, "exit")
    drive(a)
    assert a.get(rid).result == ["timed out", "bye"]


def test_replay_takes_the_recorded_branch_after_an_earlier_source_arrived(
    app: tuple[perdure.App, FakeClock],
) -> None:
    a, _ = app
    rid = a.start("twice").run_id
    deliver(a, rid, "greetings")
    assert drive(a) == [rid]  # the message won; parked on "more"
    [entry] = [e for e in a.store.journal(rid) if e.kind == "first"]
    assert entry.status == "ok"
    # "exit" comes first in argument order: a fresh evaluation would take it.
    deliver(a, rid, "exit")
    a.signal(rid, "more", "then")
    assert drive(a) == [rid]
    info = a.get(rid)
    assert info.result == [1, ["message", "k1", "hello"], "then", "bye"]
    assert [e for e in a.store.journal(rid) if e.kind == "first"] == [entry]


def test_a_child_that_ends_first_wins(app: tuple[perdure.App, FakeClock]) -> None:
    a, _ = app
    rid = a.start("parent").run_id
    drive(a)
    [kid] = [r for r in a.runs(workflow="kid")]
    drive(a)  # the child parks on "finish"
    a.signal(kid.run_id, "finish", "done")
    drive(a)  # the child ends and wakes its parent
    drive(a)
    info = a.get(rid)
    assert info.state == "succeeded", info.error
    assert info.result == ["child", {"kid": "done"}]
    assert firsts(a, rid) == [("first", f"child:{kid.run_id}|signal:stop", "ok")]


def test_a_child_that_loses_keeps_running_and_is_awaited_later(
    app: tuple[perdure.App, FakeClock],
) -> None:
    a, _ = app
    rid = a.start("parent").run_id
    drive(a)
    [kid] = a.runs(workflow="kid")
    a.signal(rid, "stop", "halt")
    drive(a)  # the parent takes the signal and parks on the child's result
    assert a.get(kid.run_id).state in ("queued", "waiting")
    a.signal(kid.run_id, "finish", "later")
    while drive(a):
        pass
    info = a.get(rid)
    assert info.state == "succeeded", info.error
    assert info.result == ["stopped", "halt", {"kid": "later"}]


def test_a_child_that_failed_raises_child_failed(app: tuple[perdure.App, FakeClock]) -> None:
    a, _ = app
    rid = a.start("parent").run_id
    drive(a)
    [kid] = a.runs(workflow="kid")
    a.signal(kid.run_id, "finish", "fail")
    while drive(a):
        pass
    assert a.get(rid).result == ["child failed", "failed"]


def test_code_that_now_selects_over_other_sources_needs_attention(
    app: tuple[perdure.App, FakeClock],
) -> None:
    a, _ = app
    SHIFTY["sources"] = (EXIT, GREET)
    rid = a.start("shifty").run_id
    assert drive(a) == [rid]  # parked; the journal names both sources
    SHIFTY["sources"] = (GREET, EXIT)
    deliver(a, rid, "greetings")
    assert drive(a) == [rid]
    info = a.get(rid)
    assert info.state == "needs_attention"
    assert info.error is not None and info.error["code"] == "non_determinism"
    assert firsts(a, rid) == [("first", "signal:exit|message:greetings", "started")]


@pytest.mark.parametrize("how", ["none", "twice", "clash", "junk"])
def test_bad_sources_fail_the_run_with_invalid_input(
    app: tuple[perdure.App, FakeClock], how: str
) -> None:
    a, _ = app
    rid = a.start("bad", how).run_id
    drive(a)
    info = a.get(rid)
    assert info.state == "failed"
    assert info.error is not None
    assert info.error["type"] == "InvalidInput", info.error


def test_sources_refuse_bad_arguments_at_once() -> None:
    for make in (
        lambda: perdure.timer(-1),
        lambda: perdure.timer("soon"),  # type: ignore[arg-type]
        lambda: perdure.signal("a#2"),
        lambda: perdure.signal(""),
        lambda: perdure.update("a/b"),
        lambda: perdure.child("run-id"),  # type: ignore[arg-type]
    ):
        with pytest.raises(perdure.InvalidInput):
            make()
    assert perdure.signal("x") == perdure.signal("x", type=int)
    assert perdure.signal("x") != perdure.message("x")
    assert perdure.timer(60) == perdure.timer(timedelta(minutes=1))


# -- a model of a loop over first, under random orders ------------------------------

ROUNDS = 4
PERIOD = timedelta(minutes=1)


def loop_app(url: str, clock: FakeClock) -> perdure.App:
    app = perdure.App(url, name=f"fl_{uuid.uuid4().hex[:8]}", clock=clock, max_failures=100)

    @app.workflow()
    def loop(ctx: perdure.Context) -> list[Any]:
        sig, inbox = perdure.signal("a"), perdure.message("m")
        got = []
        for _ in range(ROUNDS):
            fired = ctx.first(sig, inbox, perdure.timer(PERIOD))
            got.append([fired.index, shown(fired.value)])
        ctx.wait("end")  # so that the run outlives any script
        # What lost in the last rounds is still there, in order, for the plain waits.
        return [got, ctx.wait("a"), ctx.receive("m").key]

    return app


class LoopModel:
    """What the loop must return: the first ready source in argument order, each round."""

    def __init__(self) -> None:
        self.signals: list[Any] = []
        self.messages: list[int] = []
        self.got: list[Any] = []
        self.deadline: datetime | None = None  # journaled when the round is first reached

    def evaluate(self, now: datetime) -> None:
        while len(self.got) < ROUNDS:
            if self.deadline is None:
                self.deadline = now + PERIOD
            if self.signals:
                self.got.append([0, self.signals.pop(0)])
            elif self.messages:
                n = self.messages.pop(0)
                self.got.append([1, ["message", f"k{n}", n]])
            elif now >= self.deadline:
                self.got.append([2, None])
            else:
                return
            self.deadline = None


def play_loop(url: str, script: list[str]) -> None:
    clock = FakeClock()
    a = loop_app(url, clock)
    try:
        rid = a.start("loop").run_id
        model = LoopModel()
        for sent, op in enumerate(script, start=1):
            if op == "signal":
                a.signal(rid, "a", sent)
                model.signals.append(sent)
            elif op == "message":
                a.send(rid, "m", f"k{sent}", sent)
                model.messages.append(sent)
            elif op == "tick":
                clock.advance((PERIOD / 2).total_seconds())
            else:
                drive(a)
                model.evaluate(clock.now())
        while len(model.got) < ROUNDS:
            clock.advance((PERIOD * 2).total_seconds())
            drive(a)
            model.evaluate(clock.now())
        # Feed the plain waits after the loop, then check everything lines up.
        if not model.signals:
            a.signal(rid, "a", "last")
            model.signals.append("last")
        if not model.messages:
            a.send(rid, "m", "k-last", "last")
        a.signal(rid, "end")
        drive(a)
        info = a.get(rid)
        assert info.state == "succeeded", info.error
        expected_message = f"k{model.messages[0]}" if model.messages else "k-last"
        assert info.result == [model.got, model.signals[0], expected_message]
    finally:
        a.close()


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.sampled_from(["signal", "message", "tick", "drive"]), max_size=14))
def test_a_loop_over_first_matches_the_model_in_every_order(
    tmp_path_factory: Any, script: list[str]
) -> None:
    url = f"sqlite:///{tmp_path_factory.mktemp('loop')}/loop.db"
    play_loop(url, script)


@pytest.mark.parametrize(
    "script",
    [
        ["message", "signal", "drive", "drive"],
        ["drive", "tick", "tick", "drive", "signal", "drive"],
        ["signal", "signal", "message", "message", "message", "drive"],
    ],
)
def test_chosen_orders_of_a_loop_match_the_model(store_url: str, script: list[str]) -> None:
    play_loop(store_url, script)
