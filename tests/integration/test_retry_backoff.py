"""A retry backoff longer than Retry.park_after is a durable timer, on both stores."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest

import perdure
from perdure import journal
from perdure.testing import Environment

HOUR = 3600.0


def make(store_url: str, park_after: float = 5.0) -> tuple[perdure.App, list[str]]:
    app = perdure.App(store_url, name=f"backoff_{uuid.uuid4().hex[:8]}")
    attempts: list[str] = []
    policy = perdure.Retry(
        max_attempts=3,
        initial_delay=HOUR,
        max_delay=HOUR,
        multiplier=1.0,
        jitter=False,
        park_after=park_after,
    )

    @app.step(retry=policy)
    def poll(job: str) -> str:
        attempts.append(job)
        if len(attempts) < 3:
            raise ConnectionError(f"not ready ({len(attempts)})")
        return f"{job} done"

    @app.workflow()
    def infrequent(ctx: perdure.Context, job: str) -> str:
        return poll(job)

    return app, attempts


def test_a_long_backoff_parks_the_run_until_the_next_attempt_is_due(store_url: str) -> None:
    app, attempts = make(store_url)
    with Environment(app, store=store_url) as env:
        handle = env.start("infrequent", "j1")
        env.run_until_idle()
        # The first attempt failed; the run rests and holds no worker.
        assert attempts == ["j1"]
        assert app.get(handle.run_id).state == "waiting"
        (timer,) = env.store.timers(app.name)
        assert timer.due == env.now() + timedelta(seconds=HOUR)

        # Nothing happens before the instant journaled with the failure.
        env.advance(HOUR - 1)
        assert attempts == ["j1"]
        env.advance(1)
        assert attempts == ["j1", "j1"]
        assert app.get(handle.run_id).state == "waiting"

        env.advance(HOUR)
        assert attempts == ["j1", "j1", "j1"]
        assert handle.result(timeout=5) == "j1 done"

        (entry,) = [e for e in env.store.journal(handle.run_id) if e.kind == "step"]
        assert [a.attempt for a in journal.failed_attempts(entry)] == [1, 2]


def test_a_short_backoff_stays_in_the_execution(store_url: str) -> None:
    app2 = perdure.App(store_url, name=f"short_{uuid.uuid4().hex[:8]}")
    calls: list[int] = []

    @app2.step(retry=perdure.Retry(max_attempts=3, initial_delay=0.01, jitter=False))
    def flaky() -> int:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionError("again")
        return len(calls)

    @app2.workflow()
    def quick(ctx: perdure.Context) -> int:
        return flaky()

    with app2.worker():
        handle = app2.start("quick")
        assert handle.result(timeout=30) == 3
    # One execution did all three attempts: the run never parked.
    kinds = [r.kind for r in app2.history(handle.run_id)]
    assert "parked" not in kinds and kinds.count("step_failed") == 2
    app2.close()


def test_park_after_is_checked() -> None:
    with pytest.raises(perdure.InvalidInput):
        perdure.Retry(park_after=-1)


def test_a_retry_instant_is_journaled_and_read_back() -> None:
    due = Environment(perdure.App("sqlite:///:memory:")).now()
    failed = journal.AttemptFailed("ConnectionError", "down", (), due)
    assert journal.AttemptFailed.decode(failed.encode()) == failed


def test_cancel_during_a_parked_backoff_ends_the_run_without_another_attempt(
    store_url: str,
) -> None:
    app, attempts = make(store_url)
    with Environment(app, store=store_url) as env:
        handle = env.start("infrequent", "j2")
        env.run_until_idle()
        assert app.get(handle.run_id).state == "waiting"
        assert app.cancel(handle.run_id) is True
        env.advance(3 * HOUR)
        assert app.get(handle.run_id).state == "canceled"
        assert attempts == ["j2"]
