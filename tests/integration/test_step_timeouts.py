"""A step attempt past its timeout fails with StepTimedOut, for each effect class, both stores."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

import perdure
from perdure import journal
from perdure.testing import Environment

TIMEOUT = 0.2  # real time is the point here: each stuck attempt costs this much


@pytest.fixture
def release() -> Iterator[threading.Event]:
    """Lets the stuck step threads go when the test ends."""
    gate = threading.Event()
    yield gate
    gate.set()


def build(store_url: str, release: threading.Event) -> tuple[perdure.App, list[str]]:
    app = perdure.App(store_url, name=f"to_{uuid.uuid4().hex[:8]}")
    attempts: list[str] = []
    twice = perdure.Retry(max_attempts=2, initial_delay=0, jitter=False)

    @app.step(timeout=TIMEOUT, retry=twice)
    def stuck() -> str:
        attempts.append("stuck")
        release.wait(30)  # never returns before the test ends
        return "late"

    @app.step(timeout=TIMEOUT, retry=twice)
    def slow_then_fast() -> str:
        attempts.append("slow_then_fast")
        if len([a for a in attempts if a == "slow_then_fast"]) == 1:
            release.wait(30)
        return "in time"

    @app.step(effect="once", timeout=TIMEOUT)
    def charge() -> str:
        attempts.append("charge")
        release.wait(30)
        return "charged"

    @app.step(timeout=TIMEOUT, retry=perdure.Retry(max_attempts=1))
    async def fetch() -> str:
        attempts.append("fetch")
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            attempts.append("fetch canceled")
            raise
        return "fetched"

    @app.step(timeout=5, retry=perdure.Retry(max_attempts=1))
    async def own_timeout() -> str:
        raise TimeoutError("the remote side timed out")

    @app.workflow()
    def flow(ctx: perdure.Context, which: str) -> Any:
        return {"stuck": stuck, "retry": slow_then_fast, "once": charge}[which]()

    @app.workflow()
    async def aflow(ctx: perdure.Context, which: str) -> Any:
        return await {"fetch": fetch, "own": own_timeout}[which]()

    return app, attempts


def _run(app: perdure.App, store_url: str, workflow: str, which: str) -> perdure.RunInfo:
    with Environment(app, store=store_url) as env:
        handle = env.start(workflow, which)
        env.run_until_idle()
        return app.get(handle.run_id)


def test_an_idempotent_step_past_its_timeout_is_retried_then_fails(
    store_url: str, release: threading.Event
) -> None:
    app, attempts = build(store_url, release)
    info = _run(app, store_url, "flow", "stuck")
    assert info.state == "failed" and info.error is not None
    assert info.error["code"] == "step_failed" and "StepTimedOut" in info.error["message"]
    assert attempts == ["stuck", "stuck"]
    (entry,) = app.store.journal(info.run_id)
    assert [(a.code, a.type) for a in journal.failed_attempts(entry)] == [
        ("step_timed_out", "StepTimedOut")
    ] * 2


def test_a_retry_in_time_succeeds(store_url: str, release: threading.Event) -> None:
    app, attempts = build(store_url, release)
    info = _run(app, store_url, "flow", "retry")
    assert (info.state, info.result) == ("succeeded", "in time")
    assert attempts == ["slow_then_fast", "slow_then_fast"]


def test_a_once_step_past_its_timeout_needs_attention(
    store_url: str, release: threading.Event
) -> None:
    app, attempts = build(store_url, release)
    info = _run(app, store_url, "flow", "once")
    assert info.state == "needs_attention" and info.error is not None
    assert info.error["code"] == "effect_outcome_unknown"
    assert attempts == ["charge"]  # never repeated on its own


def test_an_async_step_past_its_timeout_is_canceled(
    store_url: str, release: threading.Event
) -> None:
    app, attempts = build(store_url, release)
    info = _run(app, store_url, "aflow", "fetch")
    assert info.state == "failed" and info.error is not None
    assert "StepTimedOut" in info.error["message"]
    assert attempts == ["fetch", "fetch canceled"]


def test_a_steps_own_timeout_error_is_not_a_step_timeout(
    store_url: str, release: threading.Event
) -> None:
    app, _ = build(store_url, release)
    info = _run(app, store_url, "aflow", "own")
    assert info.error is not None and "TimeoutError" in info.error["message"]
    assert "StepTimedOut" not in info.error["message"]


def test_a_timeout_must_be_positive() -> None:
    app = perdure.App("sqlite:////tmp/unused-timeouts.db", name="to_bad")
    with pytest.raises(perdure.InvalidInput):
        app.step(timeout=0)(lambda: None)
