"""Suspending and resuming runs, on both stores: running, waiting, sleeping, canceled."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from datetime import timedelta

import pytest

import perdure
from perdure.testing import Environment


def _app(store_url: str) -> perdure.App:
    return perdure.App(store_url, name=f"sus_{uuid.uuid4().hex[:8]}")


@pytest.mark.parametrize("effect", ["idempotent", "once"])
def test_a_running_run_records_its_step_then_stops_and_resume_completes_it(
    store_url: str, effect: str
) -> None:
    app = _app(store_url)
    calls: list[str] = []

    @app.step(effect=effect)  # type: ignore[call-overload]
    def first(run_id: str) -> int:
        calls.append("first")
        # The suspend lands while this step is in flight.
        assert app.suspend(run_id) is True
        assert app.get(run_id).state == "running"
        assert app.get(run_id).suspend_requested
        return 1

    @app.step()
    def second() -> int:
        calls.append("second")
        return 2

    @app.workflow(version="1")
    def flow(ctx: perdure.Context) -> int:
        return first(ctx.run_id) + second()

    with Environment(app, store=store_url) as env:
        handle = app.start(flow)
        env.run_until_idle()
        info = app.get(handle.run_id)
        assert (info.state, info.error, info.suspend_requested) == ("suspended", None, False)
        [entry] = env.store.journal(handle.run_id)
        assert (entry.name, entry.status) == ("first", "ok")
        kinds = [p.kind for p in app.history(handle.run_id)]
        assert kinds[-1] == "suspended" and "suspend_requested" in kinds
        assert app.suspend(handle.run_id) is False  # idempotent
        env.advance(timedelta(hours=1))
        assert calls == ["first"] and app.get(handle.run_id).state == "suspended"
        assert app.resume(handle.run_id) is True
        env.run_until_idle()
        assert handle.result(timeout=5) == 3
    assert calls == ["first", "second"]  # the recorded step did not run again


def test_a_signal_to_a_suspended_waiting_run_is_applied_after_resume(store_url: str) -> None:
    app = _app(store_url)

    @app.workflow(version="1")
    def approve(ctx: perdure.Context) -> object:
        return ctx.wait("go", timeout=timedelta(hours=1))

    with Environment(app, store=store_url) as env:
        handle = app.start(approve)
        env.run_until_idle()
        assert app.get(handle.run_id).state == "waiting"
        assert app.suspend(handle.run_id) is True
        assert app.get(handle.run_id).state == "suspended"
        receipt = app.signal(handle.run_id, "go", {"ok": True}, signal_id="s-1")
        assert receipt.outcome == "signaled"
        env.run_until_idle()
        assert app.get(handle.run_id).state == "suspended"
        assert app.resume(handle.run_id) is True
        env.run_until_idle()
        assert handle.result(timeout=5) == {"ok": True}


def test_a_sleep_that_ends_while_suspended_fires_after_resume(store_url: str) -> None:
    app = _app(store_url)
    done: list[str] = []

    @app.step()
    def after() -> str:
        done.append("after")
        return "woke"

    @app.workflow(version="1")
    def nap(ctx: perdure.Context) -> str:
        ctx.sleep(timedelta(minutes=10))
        return after()

    with Environment(app, store=store_url) as env:
        handle = app.start(nap)
        env.run_until_idle()
        assert app.get(handle.run_id).state == "waiting"
        assert app.suspend(handle.run_id) is True
        env.advance(timedelta(hours=1))
        env.store.sweep()
        assert (app.get(handle.run_id).state, done) == ("suspended", [])
        assert app.resume(handle.run_id) is True
        assert app.get(handle.run_id).state == "queued"  # the passed sleep fires at once
        env.run_until_idle()
        assert handle.result(timeout=5) == "woke"


def test_an_update_to_a_suspended_run_waits_for_its_resume(store_url: str) -> None:
    app = _app(store_url)

    @app.workflow(version="1")
    def counter(ctx: perdure.Context) -> int:
        upd = ctx.next_update("add")
        ctx.respond(upd, {"got": upd.payload})
        return int(upd.payload)

    with Environment(app, store=store_url) as env:
        handle = app.start(counter)
        env.run_until_idle()
        assert app.suspend(handle.run_id) is True
        with pytest.raises(perdure.UpdateTimedOut):
            app.update(handle.run_id, "add", 5, update_id="u-1", timeout=0.05)
        assert app.resume(handle.run_id) is True
        env.run_until_idle()
        assert app.update(handle.run_id, "add", 5, update_id="u-1", timeout=5) == {"got": 5}
        assert handle.result(timeout=5) == 5


def test_cancel_of_a_suspended_run_and_suspend_of_an_ended_one(store_url: str) -> None:
    app = _app(store_url)

    @app.workflow(version="1")
    def noop(ctx: perdure.Context) -> int:
        return 1

    with Environment(app, store=store_url) as env:
        held = app.start(noop)
        done = app.start(noop, key="done")
        assert app.suspend(held.run_id) is True
        env.run_until_idle()
        assert done.result(timeout=5) == 1
        assert app.get(held.run_id).state == "suspended"
        assert app.cancel(held.run_id) is True
        assert app.get(held.run_id).state == "canceled"
        with pytest.raises(perdure.RunFinished) as ended:
            app.suspend(done.run_id)
        assert ended.value.code == "run_finished"
        with pytest.raises(perdure.RunFinished):
            app.resume(held.run_id)
        assert [r.run_id for r in app.runs(state="suspended")] == []


def test_a_worker_lets_go_of_a_run_suspended_mid_step(store_url: str) -> None:
    app = _app(store_url)
    entered, go = threading.Event(), threading.Event()
    calls: list[str] = []

    @app.step(effect="once")
    def charge() -> str:
        calls.append("charge")
        entered.set()
        assert go.wait(10)
        return "ch_1"

    @app.step()
    def ship() -> str:
        calls.append("ship")
        return "shipped"

    @app.workflow(version="1")
    def order(ctx: perdure.Context) -> list[str]:
        return [charge(), ship()]

    try:
        with app.worker(concurrency=1, lease_ttl=3, heartbeat=0.5, poll_interval=0.05):
            handle = app.start(order)
            assert entered.wait(10)
            assert app.suspend(handle.run_id) is True
            go.set()
            _until(app, handle.run_id, "suspended")
            assert [(e.name, e.status) for e in app.store.journal(handle.run_id)] == [
                ("charge", "ok")
            ]
            assert calls == ["charge"]
            assert app.resume(handle.run_id) is True
            assert handle.result(timeout=10) == ["ch_1", "shipped"]
        assert calls == ["charge", "ship"]
    finally:
        go.set()
        app.close()


def test_the_async_client_suspends_and_resumes(store_url: str) -> None:
    app = _app(store_url)

    @app.workflow(version="1")
    def idle(ctx: perdure.Context) -> int:
        return 1

    async def scenario() -> None:
        handle = await app.astart(idle, deadline=timedelta(hours=1))
        assert await app.asuspend(handle.run_id) is True
        assert (await app.aget(handle.run_id)).state == "suspended"
        assert await app.aresume(handle.run_id) is True
        assert (await app.aget(handle.run_id)).state == "queued"

    try:
        asyncio.run(scenario())
    finally:
        app.close()


def _until(app: perdure.App, run_id: str, state: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while app.get(run_id).state != state:
        assert time.monotonic() < deadline, f"{run_id} is {app.get(run_id).state}"
        time.sleep(0.02)
