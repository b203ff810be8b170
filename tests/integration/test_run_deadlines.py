"""Run deadlines on both stores: a run not ended by then is canceled (deadline_exceeded)."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest

import perdure
from perdure.testing import Environment


def _app(store_url: str) -> perdure.App:
    return perdure.App(store_url, name=f"dl_{uuid.uuid4().hex[:8]}")


def _assert_exceeded(app: perdure.App, run_id: str) -> None:
    info = app.get(run_id)
    assert info.state == "canceled"
    assert info.error is not None and info.error["code"] == "deadline_exceeded"


def test_a_deadline_is_enforced_with_no_worker_running(store_url: str) -> None:
    app = _app(store_url)

    @app.workflow(version="1")
    def idle(ctx: perdure.Context) -> int:
        return 1

    with Environment(app, store=store_url) as env:
        late = app.start(idle, deadline=timedelta(minutes=5))
        calm = app.start(idle, key="calm")
        info = app.get(late.run_id)
        assert info.deadline == env.now() + timedelta(minutes=5)
        env.clock.advance(301)  # the clock alone: nothing runs
        assert app.get(calm.run_id).state == "queued"
        _assert_exceeded(app, late.run_id)
        with pytest.raises(perdure.RunFailed) as failed:
            late.result(timeout=1)
        assert failed.value.error_code == "deadline_exceeded"


def test_a_deadline_passes_while_the_run_sleeps_or_waits(store_url: str) -> None:
    app = _app(store_url)

    @app.workflow(version="1")
    def nap(ctx: perdure.Context) -> str:
        ctx.sleep(timedelta(hours=1))
        return "woke"

    @app.workflow(version="1")
    def approve(ctx: perdure.Context) -> object:
        return ctx.wait("go")

    with Environment(app, store=store_url) as env:
        sleeper = app.start(nap, deadline=timedelta(minutes=10))
        waiter = app.start(approve, deadline=env.now() + timedelta(minutes=10))
        env.run_until_idle()
        assert {app.get(h.run_id).state for h in (sleeper, waiter)} == {"waiting"}
        env.clock.advance(601)
        # A signal after the deadline finds the run ended.
        with pytest.raises(perdure.RunFinished):
            app.signal(waiter.run_id, "go", 1)
        _assert_exceeded(app, waiter.run_id)
        assert [w.run_id for w in app.waits()] == []
        _assert_exceeded(app, sleeper.run_id)


def test_a_running_run_past_its_deadline_is_canceled_at_its_next_write(store_url: str) -> None:
    app = _app(store_url)
    calls: list[str] = []
    clock: list[Environment] = []

    @app.step()
    def slow() -> int:
        calls.append("slow")
        clock[0].clock.advance(120)  # the step outlives the run's deadline
        return 1

    @app.step()
    def never() -> int:
        calls.append("never")
        return 2

    @app.workflow(version="1")
    def flow(ctx: perdure.Context) -> int:
        return slow() + never()

    with Environment(app, store=store_url) as env:
        clock.append(env)
        handle = app.start(flow, deadline=timedelta(minutes=1))
        env.run_until_idle()
        _assert_exceeded(app, handle.run_id)
        # The step's outcome was still recorded; nothing after it ran.
        [entry] = env.store.journal(handle.run_id)
        assert (entry.name, entry.status) == ("slow", "ok")
    assert calls == ["slow"]


def test_a_workflow_argument_named_deadline_stays_an_argument(store_url: str) -> None:
    app = _app(store_url)

    @app.workflow(version="1")
    def echo(ctx: perdure.Context, deadline: int) -> int:
        return deadline

    with Environment(app, store=store_url) as env:
        handle = app.start(echo, deadline=7)
        env.run_until_idle()
        assert handle.result(timeout=5) == 7
        assert app.get(handle.run_id).deadline is None
        with pytest.raises(perdure.InvalidInput):
            app.client.start("echo", "1", deadline=timedelta(0))


def test_an_update_to_a_run_past_its_deadline_settles_it_and_stores_nothing(
    store_url: str,
) -> None:
    app = _app(store_url)

    @app.workflow(version="1")
    def asks(ctx: perdure.Context) -> int:
        return int(ctx.next_update("ask").payload)

    with Environment(app, store=store_url) as env:
        late = app.start(asks, deadline=timedelta(minutes=5))
        env.clock.advance(301)  # nobody has settled it: the update finds it overdue
        with pytest.raises(perdure.RunFinished):
            app.update(late.run_id, "ask", 1, update_id="u-1", timeout=1)
        _assert_exceeded(app, late.run_id)
        assert app.store.get_update(late.run_id, "u-1") is None  # type: ignore[attr-defined]
        other = perdure.App(store_url, name=f"{app.name}_other")
        with pytest.raises(perdure.RunNotFound):
            other.update(late.run_id, "ask", 1, timeout=1)
        other.close()
