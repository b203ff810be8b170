"""Durable signals, waits and channels, end to end on a real store.

Every event is ordered explicitly: a step that sets an event and blocks on
another, a FakeClock moved past a deadline, a store wrapper that acts right
before ``park``, a worker process that dies inside a step. Nothing sleeps to
order anything (polling a stored state up to a bound is not ordering). Every
test runs on SQLite and PostgreSQL (``store_url``).
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import perdure
from perdure import codec
from perdure.records import Receipt, Wait
from perdure.store import port
from perdure.testing.clock import FakeClock

WORKER: dict[str, Any] = {"concurrency": 4, "lease_ttl": 2, "heartbeat": 0.5, "poll_interval": 0.2}
LIMIT = 15.0  # seconds: an upper bound for anything to happen, never a pause
T0 = datetime(2030, 1, 1, tzinfo=UTC)  # FakeClock's default start


def wait_for(check: Callable[[], Any], what: str, timeout: float = LIMIT) -> Any:
    """Poll ``check`` until it returns something truthy; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


def wait_state(app: perdure.App, run_id: str, *states: str, timeout: float = LIMIT) -> Any:
    try:
        return wait_for(
            lambda: (i := app.get(run_id)).state in states and i,
            f"run {run_id} to reach {'/'.join(states)}",
            timeout,
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc} (it is {app.get(run_id).state})") from None


def journal(app: perdure.App, run_id: str) -> list[tuple[int, str, str, str]]:
    return [(e.position, e.kind, e.name, e.status) for e in app.store.journal(run_id)]


def kinds(app: perdure.App, run_id: str) -> list[str]:
    return [r.kind for r in app.history(run_id)]


def digest_of(payload: Any) -> str | None:
    return codec.digest(codec.encode(payload))


def expected_receipt(
    run_id: str,
    name: str,
    outcome: str,
    at: datetime,
    *,
    signal_id: str | None = None,
    payload: Any = None,
) -> Receipt:
    return Receipt(
        wait_id=f"{run_id}/{name}",
        run_id=run_id,
        name=name,
        outcome=outcome,
        signal_id=signal_id,
        at=at,
        payload_digest=digest_of(payload) if outcome == "signaled" else None,
    )


def no_records(app: perdure.App, run_id: str, *channels: str) -> None:
    """Assert the run keeps no outcome, wait or message record."""
    assert app.store.outcomes(run_id) == []
    assert app.store.waits(app.name, run_id) == []
    for channel in channels:
        assert app.store.next_message(run_id, channel, 0) is None


def approval_workflow(app: perdure.App, timeout: timedelta | None = None) -> Any:
    """Register ``approval``: waits for ``go``; a timeout takes the other branch."""

    @app.workflow()
    def approval(ctx: perdure.Context) -> dict[str, Any]:
        try:
            payload = ctx.wait("go", timeout=timeout)
        except perdure.WaitTimedOut:
            return {"branch": "timed_out"}
        return {"branch": "signaled", "payload": payload}

    return approval


def park(app: perdure.App, workflow: Any, *args: Any) -> str:
    """Start a run with a worker, let it park, stop the worker; return the run id."""
    with app.worker(**WORKER):
        run_id = app.start(workflow, *args).run_id
        wait_state(app, run_id, "waiting")
    assert app.get(run_id).state == "waiting"
    return run_id


# -- signal delivery -----------------------------------------------------------------


def test_a_signal_during_a_step_is_consumed_without_parking(
    make_app: Callable[..., perdure.App],
) -> None:
    app = make_app()
    entered, release = threading.Event(), threading.Event()

    @app.step()
    def work() -> str:
        entered.set()
        assert release.wait(LIMIT), "the test never released the step"
        return "worked"

    @app.workflow()
    def approval(ctx: perdure.Context) -> dict[str, Any]:
        done = work()
        return {"work": done, "approval": ctx.wait("go")}

    with app.worker(**WORKER):
        handle = app.start(approval)
        assert entered.wait(LIMIT)
        receipt = app.signal(handle.run_id, "go", {"ok": True}, signal_id="sig-1")
        (stored,) = app.store.outcomes(handle.run_id)
        assert receipt == expected_receipt(
            handle.run_id, "go", "signaled", stored.at, signal_id="sig-1", payload={"ok": True}
        )
        assert (stored.outcome, stored.signal_id, stored.payload) == (
            "signaled",
            "sig-1",
            codec.encode({"ok": True}),
        )
        # Delivery wrote nothing but the outcome record: no journal, no wake.
        assert app.get(handle.run_id).state == "running"
        assert app.store.journal(handle.run_id) == []
        assert "woken" not in kinds(app, handle.run_id)
        release.set()
        assert handle.result(timeout=LIMIT) == {"work": "worked", "approval": {"ok": True}}

    rid = handle.run_id
    assert journal(app, rid) == [(1, "step", "work", "ok"), (2, "wait", "go", "ok")]
    body = codec.decode(app.store.journal(rid)[1].output or "null")
    assert body == {
        "payload": {"ok": True},
        "signal_id": "sig-1",
        "at": receipt.at.isoformat(),
        "digest": receipt.payload_digest,
    }
    history = app.history(rid)
    assert [h.kind for h in history] == [
        "initialized",
        "claimed",
        "step_started",
        "step_completed",
        "outcome_applied",
        "finished",
    ]
    applied = next(h for h in history if h.kind == "outcome_applied")
    assert (applied.step, applied.digest) == ("go", receipt.payload_digest)
    no_records(app, rid)


def test_a_signal_before_the_run_reaches_the_wait_is_kept(
    make_app: Callable[..., perdure.App],
) -> None:
    clock = FakeClock()
    app = make_app(clock=clock)
    approval = approval_workflow(app, timeout=timedelta(minutes=5))

    handle = app.start(approval)
    receipt = app.signal(handle.run_id, "go", [1, 2], signal_id="early")
    assert receipt == expected_receipt(
        handle.run_id, "go", "signaled", T0, signal_id="early", payload=[1, 2]
    )
    assert app.get(handle.run_id).state == "queued"
    assert app.store.journal(handle.run_id) == []
    assert app.waits(handle.run_id) == []  # not registered: the run never reached it
    assert [o.signal_id for o in app.store.outcomes(handle.run_id)] == ["early"]
    # The deadline counts from when the wait is first reached, so this is no expiry.
    clock.advance(minutes=10)

    with app.worker(**WORKER):
        assert handle.result(timeout=LIMIT) == {"branch": "signaled", "payload": [1, 2]}
    assert journal(app, handle.run_id) == [(1, "wait", "go", "ok")]
    assert "parked" not in kinds(app, handle.run_id)
    no_records(app, handle.run_id)


class SignalRightBeforePark:
    """Delegate to a real store; the first ``park`` is preceded by a signal."""

    def __init__(self, inner: port.Store, app: perdure.App) -> None:
        self._inner = inner
        self._app = app
        self.receipts: list[Receipt] = []
        self.parked: list[bool] = []

    def park(self, claim: port.Claim, entries: Any, waits: Any, **kw: Any) -> bool:
        if not self.receipts:
            self.receipts.append(self._app.signal(claim.run_id, "go", "raced", signal_id="r"))
        done = self._inner.park(claim, entries, waits, **kw)
        self.parked.append(done)
        return done

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def test_an_outcome_recorded_just_before_the_park_requeues_at_once(
    make_app: Callable[..., perdure.App],
) -> None:
    app = make_app()
    approval = approval_workflow(app)
    store = SignalRightBeforePark(app.store, app)
    worker = perdure.Worker(app, store, **WORKER)
    handle = app.start(approval)
    with worker:
        assert handle.result(timeout=LIMIT) == {"branch": "signaled", "payload": "raced"}
    assert store.parked == [False]  # the park saw the outcome and did not happen
    assert [r.signal_id for r in store.receipts] == ["r"]
    assert journal(app, handle.run_id) == [(1, "wait", "go", "ok")]
    history = kinds(app, handle.run_id)
    assert "parked" not in history and "woken" not in history
    assert history.count("claimed") == 1


@pytest.mark.parametrize("delivery", ["signal", "send"])
def test_a_delivery_wakes_an_idle_worker_without_polling(
    make_app: Callable[..., perdure.App], delivery: str
) -> None:
    app = make_app()

    @app.workflow()
    def either(ctx: perdure.Context) -> Any:
        return ctx.wait("go") if delivery == "signal" else ctx.receive("events").payload

    # A poll interval far beyond LIMIT: only the wake-up (in-process for
    # SQLite, NOTIFY for PostgreSQL) can get the run going again in time.
    with app.worker(**{**WORKER, "poll_interval": 60}):
        handle = app.start(either)
        wait_state(app, handle.run_id, "waiting")
        if delivery == "signal":
            app.signal(handle.run_id, "go", "wake up")
        else:
            assert app.send(handle.run_id, "events", "k", "wake up") is True
        assert handle.result(timeout=LIMIT) == "wake up"


SIGNAL_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import perdure

    url, app_name, run_id = sys.argv[1:4]
    app = perdure.App(url, name=app_name)
    r = app.signal(run_id, "go", {"from": "elsewhere"}, signal_id="remote-1")
    print(json.dumps({
        "wait_id": r.wait_id, "outcome": r.outcome, "signal_id": r.signal_id,
        "digest": r.payload_digest, "at": r.at.isoformat(),
    }))
    app.close()
    """
)


def test_a_signal_from_another_process_is_applied_by_the_worker(
    make_app: Callable[..., perdure.App], store_url: str
) -> None:
    app = make_app()
    approval = approval_workflow(app)
    # The worker is in this process; the signal comes from another one, which
    # cannot wake it in-process: on PostgreSQL NOTIFY must (so the poll is
    # longer than LIMIT); on SQLite the worker polls.
    poll = 60 if store_url.startswith("postgres") else 0.2
    with app.worker(**{**WORKER, "poll_interval": poll}):
        handle = app.start(approval)
        wait_state(app, handle.run_id, "waiting")
        done = subprocess.run(
            [sys.executable, "-c", SIGNAL_SCRIPT, store_url, app.name, handle.run_id],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        remote = json.loads(done.stdout)
        assert handle.result(timeout=LIMIT) == {
            "branch": "signaled",
            "payload": {"from": "elsewhere"},
        }
    rid = handle.run_id
    assert remote["wait_id"] == f"{rid}/go"
    assert (remote["outcome"], remote["signal_id"]) == ("signaled", "remote-1")
    assert remote["digest"] == digest_of({"from": "elsewhere"})
    entries = app.store.journal(rid)
    assert journal(app, rid) == [(1, "wait", "go", "ok")]
    assert codec.decode(entries[0].output or "null") == {
        "payload": {"from": "elsewhere"},
        "signal_id": "remote-1",
        "at": remote["at"],
        "digest": remote["digest"],
    }
    applied = [h for h in app.history(rid) if h.kind == "outcome_applied"]
    assert [(h.step, h.digest) for h in applied] == [("go", remote["digest"])]
    # A late repeat from the other process, after the run ended, gets its receipt.
    repeat = app.signal(rid, "go", {"from": "elsewhere"}, signal_id="remote-1")
    assert (repeat.signal_id, repeat.payload_digest, repeat.at.isoformat()) == (
        "remote-1",
        remote["digest"],
        remote["at"],
    )


# -- one outcome per wait ---------------------------------------------------------------


def test_a_repeat_returns_the_original_receipt_and_another_signal_is_kept_for_the_next_wait(
    make_app: Callable[..., perdure.App],
) -> None:
    clock = FakeClock()
    app = make_app(clock=clock)
    approval = approval_workflow(app)
    rid = park(app, approval)

    first = app.signal(rid, "go", {"v": 1}, signal_id="s-1")
    assert first == expected_receipt(rid, "go", "signaled", T0, signal_id="s-1", payload={"v": 1})
    assert app.get(rid).state == "queued"  # woken: waiting -> queued, nothing else
    assert journal(app, rid) == [(1, "wait", "go", "started")]

    clock.advance(seconds=30)
    # Same signal_id: the original receipt, even with another payload, even later.
    assert app.signal(rid, "go", {"v": 2}, signal_id="s-1") == first

    async def repeat_async() -> Receipt:
        return await app.asignal(rid, "go", {"v": 2}, signal_id="s-1")

    assert asyncio.run(repeat_async()) == first
    # Naming the first wait itself: it is settled, so any other signal is refused.
    for other in ({"signal_id": "s-2"}, {}):
        with pytest.raises(perdure.WaitSettled) as refused:
            app.signal(rid, "go#1", {"v": 3}, **other)
        assert refused.value.receipt == first
        assert refused.value.code == "wait_settled"
    # Naming the wait name: another signal is kept for the run's second wait on it.
    second = app.signal(rid, "go", {"v": 3}, signal_id="s-2")
    assert second.wait_id == f"{rid}/go#2"
    assert (second.name, second.outcome, second.signal_id) == ("go#2", "signaled", "s-2")
    assert app.signal(rid, "go", {"v": 4}, signal_id="s-2") == second
    stored = {o.name: o for o in app.store.outcomes(rid)}
    assert sorted(stored) == ["go", "go#2"]
    assert (stored["go"].signal_id, stored["go"].payload, stored["go"].at) == (
        "s-1",
        codec.encode({"v": 1}),
        T0,
    )
    assert kinds(app, rid).count("woken") == 1

    with app.worker(**WORKER):
        assert app.handle(rid).result(timeout=LIMIT) == {"branch": "signaled", "payload": {"v": 1}}
    # The run ended and its outcome record is gone; the journal still answers
    # a sender's retry with the original receipt, and refuses any other.
    assert not app.store.outcomes(rid)
    assert app.signal(rid, "go", {"v": 1}, signal_id="s-1") == first
    # The second signal was never waited for: it ended with the run, unapplied.
    for signal_id in ("s-9", "s-2"):
        with pytest.raises(perdure.WaitSettled) as refused_after:
            app.signal(rid, "go", {"v": 1}, signal_id=signal_id)
        assert refused_after.value.receipt == first


def test_a_signal_after_the_deadline_is_refused_and_the_run_times_out(
    make_app: Callable[..., perdure.App],
) -> None:
    clock = FakeClock()
    app = make_app(clock=clock)
    approval = approval_workflow(app, timeout=timedelta(minutes=5))
    rid = park(app, approval)
    deadline = T0 + timedelta(minutes=5)
    assert app.waits(rid) == [Wait(f"{rid}/go", rid, "go", deadline, "signal")]
    assert app.store.get_run(rid).ready_at == deadline  # type: ignore[union-attr]

    clock.advance(minutes=5, seconds=1)
    with pytest.raises(perdure.WaitExpired) as expired:
        app.signal(rid, "go", "too late", signal_id="late-1")
    timed_out = expected_receipt(rid, "go", "timed_out", clock.now())
    assert expired.value.receipt == timed_out
    assert expired.value.code == "wait_expired"
    (stored,) = app.store.outcomes(rid)
    assert (stored.outcome, stored.signal_id, stored.payload) == ("timed_out", None, None)
    assert app.get(rid).state == "queued"
    # The timeout is settled: every later signal to that wait, even a repeat, sees it.
    for signal_id in ("late-1", "late-2"):
        with pytest.raises(perdure.WaitSettled) as settled:
            app.signal(rid, "go#1", "later still", signal_id=signal_id)
        assert settled.value.receipt == timed_out
    assert app.waits(rid) == []
    # A later signal on the name is kept for a second wait, which this run never makes.
    assert app.signal(rid, "go", "for the next wait").wait_id == f"{rid}/go#2"

    with app.worker(**WORKER):
        assert app.handle(rid).result(timeout=LIMIT) == {"branch": "timed_out"}
    (entry,) = app.store.journal(rid)
    assert (entry.kind, entry.name, entry.status) == ("wait", "go", "error")
    assert codec.decode(entry.error or "null") == {
        "code": "wait_timeout",
        "message": "wait 'go' timed_out",
        "outcome": "timed_out",
        "at": timed_out.at.isoformat(),
    }
    with pytest.raises(perdure.WaitSettled) as after_end:
        app.signal(rid, "go", "after the end", signal_id="late-1")
    assert after_end.value.receipt == timed_out
    no_records(app, rid)


def test_a_signal_just_before_the_deadline_wins_over_it(
    make_app: Callable[..., perdure.App],
) -> None:
    clock = FakeClock()
    app = make_app(clock=clock)
    approval = approval_workflow(app, timeout=timedelta(minutes=5))
    rid = park(app, approval)

    clock.set(T0 + timedelta(minutes=5) - timedelta(milliseconds=1))
    receipt = app.signal(rid, "go", "in time", signal_id="s")
    assert receipt.outcome == "signaled"
    clock.advance(minutes=1)
    # The deadline passes with the outcome stored: listing and sweeping change nothing.
    assert app.waits() == []
    app.store.sweep()
    (stored,) = app.store.outcomes(rid)
    assert (stored.outcome, stored.signal_id) == ("signaled", "s")
    with pytest.raises(perdure.WaitSettled) as refused:
        app.signal(rid, "go#1", "late")
    assert refused.value.receipt == receipt
    with app.worker(**WORKER):
        assert app.handle(rid).result(timeout=LIMIT) == {"branch": "signaled", "payload": "in time"}


def test_a_cancel_before_the_signal_ends_the_run_and_refuses_the_signal(
    make_app: Callable[..., perdure.App],
) -> None:
    app = make_app()
    approval = approval_workflow(app)
    rid = park(app, approval)

    assert app.cancel(rid) is True
    assert app.get(rid).state == "canceled"
    with pytest.raises(perdure.RunFinished) as finished:
        app.signal(rid, "go", "too late")
    assert finished.value.state == "canceled"
    with pytest.raises(perdure.RunFinished):
        app.send(rid, "events", "k1", 1)
    assert app.cancel(rid) is False
    no_records(app, rid, "events")
    assert journal(app, rid) == [(1, "wait", "go", "started")]
    assert kinds(app, rid)[-1] == "canceled"


def test_a_cancel_after_the_signal_still_cancels_the_run(
    make_app: Callable[..., perdure.App],
) -> None:
    app = make_app()
    approval = approval_workflow(app)
    rid = park(app, approval)

    receipt = app.signal(rid, "go", "yes", signal_id="s")
    assert app.get(rid).state == "queued"
    assert app.cancel(rid) is True
    info = app.get(rid)
    assert (info.state, info.result) == ("canceled", None)
    with pytest.raises(perdure.RunFinished):
        app.signal(rid, "go", "yes", signal_id="s")
    with app.worker(**WORKER):
        with pytest.raises(perdure.RunFailed) as failed:
            app.handle(rid).result(timeout=LIMIT)
        assert failed.value.state == "canceled"
    # The outcome was never applied: the journal still holds the open wait only.
    assert journal(app, rid) == [(1, "wait", "go", "started")]
    assert "outcome_applied" not in kinds(app, rid)
    assert receipt.outcome == "signaled"
    no_records(app, rid)


def test_a_canceled_outcome_refuses_signals_and_cancels_the_run(
    make_app: Callable[..., perdure.App],
) -> None:
    clock = FakeClock()
    app = make_app(clock=clock)
    approval = approval_workflow(app)
    rid = park(app, approval)
    # The record a cancel writes for an open wait (put-if-absent, as a signal's).
    offered = port.Outcome(rid, "go", "canceled", None, None, None, clock.now())
    stored, created = app.store.settle_wait(rid, "go", offered)
    assert created and stored.outcome == "canceled"
    assert app.get(rid).state == "queued"
    with pytest.raises(perdure.WaitSettled) as refused:
        app.signal(rid, "go#1", "yes")
    assert refused.value.receipt == expected_receipt(rid, "go", "canceled", T0)
    again, created = app.store.settle_wait(
        rid, "go", port.Outcome(rid, "go", "timed_out", None, None, None, clock.now())
    )
    assert (again, created) == (stored, False)
    with app.worker(**WORKER):
        info = wait_state(app, rid, "canceled", "succeeded", "failed")
    assert (info.state, info.result, info.error) == ("canceled", None, None)
    assert journal(app, rid) == [(1, "wait", "go", "error")]
    assert codec.decode(app.store.journal(rid)[0].error or "null")["code"] == "canceled"
    assert "outcome_applied" in kinds(app, rid)
    no_records(app, rid)


def test_uncaught_wait_timed_out_fails_the_run_with_wait_timeout(
    make_app: Callable[..., perdure.App],
) -> None:
    clock = FakeClock()
    app = make_app(clock=clock)

    @app.workflow()
    def strict(ctx: perdure.Context) -> Any:
        return ctx.wait("go", timeout=timedelta(milliseconds=200))

    with app.worker(**WORKER):
        handle = app.start(strict)
        wait_state(app, handle.run_id, "waiting")
        # Nobody lists, sweeps or signals: the worker itself sees the deadline.
        clock.advance(seconds=1)
        info = wait_state(app, handle.run_id, "failed", "succeeded", "canceled")
    assert info.state == "failed"
    assert info.error == {"code": "wait_timeout", "message": "wait 'go' timed out"}
    assert journal(app, handle.run_id) == [(1, "wait", "go", "error")]
    with pytest.raises(perdure.RunFailed) as failed:
        handle.result(timeout=LIMIT)
    assert (failed.value.state, failed.value.error) == ("failed", info.error)
    # The ended run's journal holds the timeout: a late signal is shown it.
    with pytest.raises(perdure.WaitSettled) as settled:
        app.signal(handle.run_id, "go", 1)
    assert (settled.value.receipt.outcome, settled.value.receipt.signal_id) == ("timed_out", None)
    no_records(app, handle.run_id)


# -- listing and resuming with no worker running -------------------------------------------


def test_waits_lists_open_waits_and_settles_expired_ones(
    make_app: Callable[..., perdure.App],
) -> None:
    clock = FakeClock()
    app = make_app(clock=clock)
    bounded = approval_workflow(app, timeout=timedelta(minutes=5))

    @app.workflow()
    def unbounded(ctx: perdure.Context) -> Any:
        return ctx.wait("ok")

    a = park(app, bounded)
    clock.advance(seconds=1)
    b = park(app, unbounded)
    queued = app.start(bounded).run_id  # never reached its wait: nothing to list

    expected = [
        Wait(f"{a}/go", a, "go", T0 + timedelta(minutes=5), "signal"),
        Wait(f"{b}/ok", b, "ok", None, "signal"),
    ]
    listed = app.waits()
    assert listed == expected  # oldest first
    assert make_app().waits() == []  # another app on the same store has none
    assert all(w.deadline is None or w.deadline.utcoffset() == timedelta(0) for w in listed)
    assert app.waits(a) == [expected[0]]
    assert app.waits(queued) == []

    clock.set(T0 + timedelta(minutes=5))  # exactly the deadline: it has passed
    assert app.waits() == [expected[1]]
    (stored,) = app.store.outcomes(a)
    assert (stored.outcome, stored.at) == ("timed_out", T0 + timedelta(minutes=5))
    assert app.get(a).state == "queued"
    assert app.get(b).state == "waiting"
    with pytest.raises(perdure.WaitSettled) as refused:
        app.signal(a, "go#1", "late")
    assert refused.value.receipt.outcome == "timed_out"
    with app.worker(**WORKER):
        assert app.handle(a).result(timeout=LIMIT) == {"branch": "timed_out"}


def test_a_sweep_settles_an_expired_wait_with_no_worker_running(
    make_app: Callable[..., perdure.App],
) -> None:
    clock = FakeClock()
    app = make_app(clock=clock)
    approval = approval_workflow(app, timeout=timedelta(minutes=5))
    rid = park(app, approval)
    clock.advance(minutes=6)
    assert app.store.sweep() >= 1
    (stored,) = app.store.outcomes(rid)
    assert stored.outcome == "timed_out"
    assert app.get(rid).state == "queued"
    with pytest.raises(perdure.WaitSettled):
        app.signal(rid, "go#1", 1)


def test_resume_refuses_an_open_wait_and_requeues_a_settled_one(
    make_app: Callable[..., perdure.App],
) -> None:
    clock = FakeClock()
    app = make_app(clock=clock)
    approval = approval_workflow(app, timeout=timedelta(minutes=5))
    rid = park(app, approval)

    with pytest.raises(perdure.WaitStillOpen) as still_open:
        app.resume(rid)
    assert still_open.value.code == "wait_still_open"
    assert f"{rid}/go" in str(still_open.value)
    assert app.get(rid).state == "waiting"
    assert app.store.outcomes(rid) == []

    clock.advance(minutes=6)
    assert app.resume(rid) is True  # settles the expired wait, then re-queues
    (stored,) = app.store.outcomes(rid)
    assert stored.outcome == "timed_out"
    assert app.get(rid).state == "queued"
    assert app.resume(rid) is False  # queued already: nothing to do
    with app.worker(**WORKER):
        assert app.handle(rid).result(timeout=LIMIT) == {"branch": "timed_out"}
    with pytest.raises(perdure.RunFinished):
        app.resume(rid)


# -- channels -------------------------------------------------------------------------------


def test_channel_messages_dedup_keep_delivery_order_and_match_names_exactly(
    make_app: Callable[..., perdure.App],
) -> None:
    app = make_app()

    @app.workflow()
    def inbox(ctx: perdure.Context) -> list[list[Any]]:
        got = [ctx.receive("a") for _ in range(3)]
        got.append(ctx.receive("ab"))
        return [[m.key, m.payload] for m in got]

    handle = app.start(inbox)
    rid = handle.run_id
    assert app.send(rid, "ab", "x", "for ab") is True
    assert app.send(rid, "a", "k3", {"n": 3}) is True
    assert app.send(rid, "a", "k1", {"n": 1}) is True
    assert app.send(rid, "a", "k3", {"n": 99}) is False  # first payload wins
    assert app.send(rid, "A", "k9", "other case") is True
    assert app.send(rid, "A", "k3", "same key, other channel") is True

    with app.worker(**WORKER):
        wait_state(app, rid, "waiting")  # consumed k3 and k1, waits for a third on "a"
        assert app.waits(rid) == [Wait(f"{rid}/a", rid, "a", None, "channel")]
        assert app.send(rid, "ab", "y", "for ab") is True  # another channel: no wake
        assert app.send(rid, "a", "k1", {"n": 1}) is False  # consumed already: not again
        assert app.get(rid).state == "waiting"
        assert app.send(rid, "a", "k2", {"n": 2}) is True
        assert handle.result(timeout=LIMIT) == [
            ["k3", {"n": 3}],
            ["k1", {"n": 1}],
            ["k2", {"n": 2}],
            ["x", "for ab"],
        ]
    entries = app.store.journal(rid)
    assert journal(app, rid) == [
        (1, "receive", "a", "ok"),
        (2, "receive", "a", "ok"),
        (3, "receive", "a", "ok"),
        (4, "receive", "ab", "ok"),
    ]
    bodies = [codec.decode(e.output or "null") for e in entries]
    assert [(b["key"], b["payload"], b["sequence"]) for b in bodies] == [
        ("k3", {"n": 3}, 2),
        ("k1", {"n": 1}, 3),
        ("k2", {"n": 2}, 7),
        ("x", "for ab", 1),
    ]
    history = kinds(app, rid)
    assert history.count("outcome_applied") == 4
    assert history.count("woken") == 1
    # The run ended: its messages are gone (the journal keeps the payloads).
    no_records(app, rid, "a", "ab", "A")
    with pytest.raises(perdure.RunFinished):
        app.send(rid, "a", "k4", 4)


def test_receive_with_a_timeout_noticed_by_listing(
    make_app: Callable[..., perdure.App], store_url: str, request: pytest.FixtureRequest
) -> None:
    # The worker sweeps when it starts: a channel wait must get no outcome from it.
    clock = FakeClock()
    app = make_app(clock=clock)

    @app.workflow()
    def poll(ctx: perdure.Context) -> dict[str, Any]:
        try:
            first: Any = ctx.receive("events", timeout=timedelta(minutes=1)).payload
        except perdure.WaitTimedOut:
            first = "timed_out"
        later = ctx.receive("events")
        return {"first": first, "later": [later.key, later.payload]}

    rid = park(app, poll)
    assert app.waits(rid) == [
        Wait(f"{rid}/events", rid, "events", T0 + timedelta(minutes=1), "channel")
    ]
    clock.advance(minutes=2)
    assert app.waits(rid) == []  # expired: the run is woken to decide for itself
    assert app.get(rid).state == "queued"
    with app.worker(**WORKER):
        wait_state(app, rid, "waiting", timeout=3)
        assert app.waits(rid) == [Wait(f"{rid}/events", rid, "events", None, "channel")]
        assert app.send(rid, "events", "e1", "hello") is True
        assert app.handle(rid).result(timeout=LIMIT) == {
            "first": "timed_out",
            "later": ["e1", "hello"],
        }
    assert journal(app, rid) == [(1, "receive", "events", "error"), (2, "receive", "events", "ok")]
    (timed_out, received) = app.store.journal(rid)
    assert codec.decode(timed_out.error or "null")["code"] == "wait_timeout"
    assert codec.decode(received.output or "null") == {
        "key": "e1",
        "payload": "hello",
        "sequence": 1,
    }


def test_receive_with_a_timeout_noticed_by_a_sweep_can_wait_again_on_that_channel(
    make_app: Callable[..., perdure.App], store_url: str, request: pytest.FixtureRequest
) -> None:
    clock = FakeClock()
    app = make_app(clock=clock)

    @app.workflow()
    def poll(ctx: perdure.Context) -> dict[str, Any]:
        try:
            first: Any = ctx.receive("events", timeout=timedelta(minutes=1)).payload
        except perdure.WaitTimedOut:
            first = "timed_out"
        later = ctx.receive("events")
        return {"first": first, "later": [later.key, later.payload]}

    rid = park(app, poll)
    clock.advance(minutes=2)
    app.store.sweep()
    assert app.store.outcomes(rid) == []  # a channel wait has no outcome record
    assert app.get(rid).state == "queued"
    with app.worker(**WORKER):
        wait_state(app, rid, "waiting", timeout=3)
        assert app.waits(rid) == [Wait(f"{rid}/events", rid, "events", None, "channel")]
        app.send(rid, "events", "e1", "hello")
        assert app.handle(rid).result(timeout=LIMIT) == {
            "first": "timed_out",
            "later": ["e1", "hello"],
        }


CONSUMER = textwrap.dedent(
    """
    import os

    import perdure

    app = perdure.App(os.environ["SIG_STORE"], name=os.environ["SIG_APP"])


    def log(variable: str, line: str) -> None:
        fd = os.open(os.environ[variable], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (line + "\\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)


    @app.step()
    def record(key: str, payload: dict) -> str:
        log("SIG_ATTEMPTS", key)
        if os.environ.get("SIG_CRASH_ON") == key:
            os._exit(137)
        log("SIG_EFFECTS", key)
        return key


    @app.workflow()
    def consume(ctx: perdure.Context, n: int) -> list:
        out = []
        for _ in range(n):
            message = ctx.receive("events")
            out.append([record(message.key, message.payload), message.payload])
        return out


    def serve() -> None:
        app.worker(concurrency=1, lease_ttl=1, heartbeat=0.3, poll_interval=0.1).run()
    """
)


def test_a_crash_after_a_receive_redelivers_the_same_message_exactly_once(
    make_app: Callable[..., perdure.App], store_url: str, tmp_path: Path
) -> None:
    app = make_app()
    (tmp_path / "sigconsumer.py").write_text(CONSUMER, encoding="utf-8")
    attempts, effects = tmp_path / "attempts.log", tmp_path / "effects.log"
    env = {
        **os.environ,
        "SIG_STORE": store_url,
        "SIG_APP": app.name,
        "SIG_ATTEMPTS": str(attempts),
        "SIG_EFFECTS": str(effects),
        "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
    }
    env.pop("SIG_CRASH_ON", None)
    rid = app.client.start("consume", "1", [3]).run_id
    for n in (1, 2, 3):
        assert app.send(rid, "events", f"k{n}", {"n": n}) is True
    command = [sys.executable, "-c", "import sigconsumer; sigconsumer.serve()"]

    def worker(name: str, **extra: str) -> subprocess.Popen[bytes]:
        with open(tmp_path / f"{name}.log", "wb") as log:
            return subprocess.Popen(
                command, cwd=tmp_path, env={**env, **extra}, stdout=log, stderr=subprocess.STDOUT
            )

    def logs() -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')}" for p in tmp_path.glob("*.log")
        )

    first = worker("crashing", SIG_CRASH_ON="k2")
    try:
        assert first.wait(timeout=60) == 137, logs()
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    # k1 was received and recorded; the receive of k2 was buffered for the
    # write of its step, which never happened.
    assert journal(app, rid) == [
        (1, "receive", "events", "ok"),
        (2, "step", "record", "ok"),
    ], logs()
    assert attempts.read_text().split() == ["k1", "k2"]
    assert effects.read_text().split() == ["k1"]

    second = worker("second")
    try:
        info = wait_state(app, rid, "succeeded", "failed", "needs_attention", timeout=30)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{logs()}") from None
    finally:
        second.terminate()
        second.wait(timeout=30)
    assert info.state == "succeeded", (info.error, logs())
    assert info.result == [["k1", {"n": 1}], ["k2", {"n": 2}], ["k3", {"n": 3}]]
    assert attempts.read_text().split() == ["k1", "k2", "k2", "k3"]
    assert effects.read_text().split() == ["k1", "k2", "k3"]
    entries = app.store.journal(rid)
    assert [(e.kind, e.status) for e in entries] == [("receive", "ok"), ("step", "ok")] * 3
    received = [codec.decode(e.output or "null") for e in entries if e.kind == "receive"]
    assert [(r["key"], r["sequence"]) for r in received] == [("k1", 1), ("k2", 2), ("k3", 3)]
    assert "recovered" in kinds(app, rid)
    no_records(app, rid, "events")


# -- clean-up and refusals ---------------------------------------------------------------------


def test_records_of_an_ended_run_are_gone_and_the_journal_keeps_payloads(
    make_app: Callable[..., perdure.App],
) -> None:
    app = make_app()

    @app.workflow()
    def both(ctx: perdure.Context) -> list[Any]:
        first = ctx.receive("events")
        return [first.payload, ctx.wait("go")]

    handle = app.start(both)
    rid = handle.run_id
    app.send(rid, "events", "e1", {"a": 1})
    app.send(rid, "events", "e2", {"unused": True})  # never received
    app.signal(rid, "go", {"b": 2}, signal_id="g")
    assert app.store.next_message(rid, "events", 0) is not None
    assert len(app.store.outcomes(rid)) == 1
    with app.worker(**WORKER):
        assert handle.result(timeout=LIMIT) == [{"a": 1}, {"b": 2}]
    no_records(app, rid, "events")
    outputs = [codec.decode(e.output or "null") for e in app.store.journal(rid)]
    assert outputs[0]["payload"] == {"a": 1}
    assert outputs[1]["payload"] == {"b": 2} and outputs[1]["signal_id"] == "g"


def _drop_run_row(store_url: str, run_id: str) -> None:
    """Delete the run's row behind the store's back: its records become orphans."""
    if store_url.startswith("sqlite"):
        path = store_url.removeprefix("sqlite:///")
        with sqlite3.connect(path) as lite:
            lite.execute("DELETE FROM runs WHERE run_id = ?", (run_id,))
        lite.close()
    else:
        import psycopg

        with psycopg.connect(store_url, autocommit=True) as conn:
            conn.execute("DELETE FROM perdure.runs WHERE run_id = %s", (run_id,))


def test_a_sweep_removes_records_of_runs_that_no_longer_exist(
    make_app: Callable[..., perdure.App], store_url: str
) -> None:
    app = make_app()
    approval = approval_workflow(app, timeout=timedelta(hours=1))
    rid = park(app, approval)
    app.send(rid, "events", "e1", 1)
    other = app.start(approval).run_id
    app.signal(other, "go", "kept")
    assert app.store.waits(app.name, rid) != []
    _drop_run_row(store_url, rid)
    assert app.store.sweep() >= 2
    assert app.store.waits(app.name, rid) == []
    assert app.store.next_message(rid, "events", 0) is None
    assert app.store.outcomes(rid) == []
    # A live run keeps its records.
    assert [o.payload for o in app.store.outcomes(other)] == [codec.encode("kept")]


def test_a_run_that_needs_attention_keeps_its_messages_through_a_sweep(
    make_app: Callable[..., perdure.App],
) -> None:
    app = make_app()

    @app.step(effect="once", retry=perdure.Retry(max_attempts=1))
    def charge() -> str:
        raise RuntimeError("gateway timed out")

    @app.workflow()
    def pay(ctx: perdure.Context) -> list[Any]:
        charged = charge()
        return [charged, ctx.receive("events").payload, ctx.wait("go")]

    handle = app.start(pay)
    rid = handle.run_id
    app.send(rid, "events", "e1", "message")
    app.signal(rid, "go", "signal")
    with app.worker(**WORKER):
        info = wait_state(app, rid, "needs_attention")
    assert info.error is not None and info.error["code"] == "effect_outcome_unknown"
    app.store.sweep()
    assert app.store.next_message(rid, "events", 0) is not None
    assert [o.outcome for o in app.store.outcomes(rid)] == ["signaled"]
    app.resolve(rid, "charge", output="ch_1")
    with app.worker(**WORKER):
        assert handle.result(timeout=LIMIT) == ["ch_1", "message", "signal"]


def test_unknown_runs_and_runs_of_another_app_are_not_found(
    make_app: Callable[..., perdure.App],
) -> None:
    app = make_app()
    approval = approval_workflow(app)
    stranger = make_app()
    rid = app.start(approval).run_id
    for client in (app, stranger):
        target = "no-such-run" if client is app else rid
        with pytest.raises(perdure.RunNotFound) as missing:
            client.signal(target, "go", 1)
        assert missing.value.code == "run_not_found"
        with pytest.raises(perdure.RunNotFound):
            client.send(target, "events", "k", 1)
        with pytest.raises(perdure.RunNotFound):
            client.waits(target)
        with pytest.raises(perdure.RunNotFound):
            client.resume(target)
        with pytest.raises(perdure.RunNotFound):
            client.cancel(target)
    assert app.store.outcomes(rid) == []
    assert app.store.next_message(rid, "events", 0) is None
    assert app.get(rid).state == "queued"


def test_signals_and_sends_to_ended_runs_are_refused(make_app: Callable[..., perdure.App]) -> None:
    app = make_app()
    approval = approval_workflow(app)

    @app.workflow()
    def boom(ctx: perdure.Context) -> None:
        raise RuntimeError("no")

    with app.worker(**WORKER):
        done = app.start(approval)
        app.signal(done.run_id, "go", 1)
        assert done.result(timeout=LIMIT) == {"branch": "signaled", "payload": 1}
        failed = app.start(boom)
        wait_state(app, failed.run_id, "failed")
    canceled = app.start(approval)
    assert app.cancel(canceled.run_id) is True
    # The succeeded run applied a signal for "go": its journal answers.
    with pytest.raises(perdure.WaitSettled) as settled:
        app.signal(done.run_id, "go", 2, signal_id="x")
    assert (settled.value.receipt.outcome, settled.value.receipt.run_id) == (
        "signaled",
        done.run_id,
    )
    for handle, state in ((done, "succeeded"), (failed, "failed"), (canceled, "canceled")):
        if handle is not done:
            # No wait "go" was ever applied by these runs: they are simply over.
            with pytest.raises(perdure.RunFinished) as finished:
                app.signal(handle.run_id, "go", 2, signal_id="x")
            assert (finished.value.state, finished.value.run_id) == (state, handle.run_id)
        with pytest.raises(perdure.RunFinished):
            app.send(handle.run_id, "events", "k", 2)
        with pytest.raises(perdure.RunFinished):
            app.resume(handle.run_id)
        assert app.cancel(handle.run_id) is False
        assert app.get(handle.run_id).state == state
        no_records(app, handle.run_id, "events")


def test_a_deadline_is_journaled_once_and_kept_by_a_replay(
    make_app: Callable[..., perdure.App],
) -> None:
    clock = FakeClock()
    app = make_app(clock=clock)
    approval = approval_workflow(app, timeout=timedelta(minutes=5))
    rid = park(app, approval)
    deadline = T0 + timedelta(minutes=5)

    clock.advance(minutes=3)
    assert app.store.wake(rid) is True  # the code runs again, three minutes later
    with app.worker(**WORKER):
        wait_for(lambda: kinds(app, rid).count("parked") == 2, "the run to park again")
    # The replay races against the journaled instant, not now + 5 minutes.
    assert app.waits(rid) == [Wait(f"{rid}/go", rid, "go", deadline, "signal")]
    assert app.store.get_run(rid).ready_at == deadline  # type: ignore[union-attr]
    assert journal(app, rid) == [(1, "wait", "go", "started")]
    clock.set(deadline)
    with pytest.raises(perdure.WaitExpired):
        app.signal(rid, "go", "late")


def test_signals_for_two_waits_may_arrive_in_any_order(
    make_app: Callable[..., perdure.App],
) -> None:
    app = make_app()

    @app.workflow()
    def two(ctx: perdure.Context) -> list[Any]:
        return [ctx.wait("first"), ctx.wait("second")]

    with app.worker(**WORKER):
        handle = app.start(two)
        wait_state(app, handle.run_id, "waiting")
        assert [w.name for w in app.waits(handle.run_id)] == ["first"]
        app.signal(handle.run_id, "second", 2)  # early: kept for the second wait
        app.signal(handle.run_id, "first", 1)
        assert handle.result(timeout=LIMIT) == [1, 2]
    assert journal(app, handle.run_id) == [(1, "wait", "first", "ok"), (2, "wait", "second", "ok")]
    assert kinds(app, handle.run_id).count("outcome_applied") == 2


def test_malformed_signals_and_messages_are_refused_and_store_nothing(
    make_app: Callable[..., perdure.App],
) -> None:
    app = make_app()
    approval = approval_workflow(app)
    rid = app.start(approval).run_id
    for name in ("", "a/b"):
        with pytest.raises(perdure.InvalidInput):
            app.signal(rid, name, 1)
    with pytest.raises(perdure.InvalidPayload):
        app.signal(rid, "go", object())
    with pytest.raises(perdure.InvalidPayload):
        app.signal(rid, "go", float("nan"))
    for channel, key in (("", "k"), ("events", "")):
        with pytest.raises(perdure.InvalidInput):
            app.send(rid, channel, key, 1)
    with pytest.raises(perdure.InvalidPayload):
        app.send(rid, "events", "k", {1, 2j})
    assert app.store.outcomes(rid) == []
    assert app.store.next_message(rid, "events", 0) is None
    assert app.signal(rid, "go", "fine").outcome == "signaled"


def test_a_signal_cannot_settle_a_child_wait(make_app: Callable[..., perdure.App]) -> None:
    app = make_app()

    @app.workflow()
    def child(ctx: perdure.Context) -> Any:
        return ctx.wait("go")

    @app.workflow()
    def parent(ctx: perdure.Context) -> Any:
        return {"child": ctx.start_child(child).result()}

    handle = app.start(parent)
    with app.worker(**WORKER):
        wait_state(app, handle.run_id, "waiting")
        (kid,) = [r.run_id for r in app.runs() if r.parent_id == handle.run_id]
        wait_state(app, kid, "waiting")
        forged = {"run_id": kid, "state": "succeeded", "result": "forged", "error": None}
        try:
            with pytest.raises(perdure.InvalidInput):
                app.signal(handle.run_id, f"child:{kid}", forged)
        finally:
            assert app.store.outcomes(handle.run_id) == []
            assert app.get(handle.run_id).state == "waiting"
        app.signal(kid, "go", "real")
        assert handle.result(timeout=LIMIT) == {"child": "real"}


def test_a_cancel_of_a_running_run_settles_its_open_wait(
    make_app: Callable[..., perdure.App], store_url: str, request: pytest.FixtureRequest
) -> None:
    app = make_app()
    approval = approval_workflow(app)
    rid = park(app, approval)
    assert app.store.wake(rid) is True
    # A worker claims the run and dies: running, its wait registered and open.
    (ghost,) = app.store.claim(app.name, "ghost", app.workflow_versions(), lease_ttl=60)
    assert ghost.claim.run_id == rid
    assert app.cancel(rid) is True
    info = app.get(rid)
    assert (info.state, info.cancel_requested) == ("running", True)
    with pytest.raises(perdure.WaitSettled) as refused:
        app.signal(rid, "go", "too late", signal_id="s")
    assert refused.value.receipt.outcome == "canceled"
    assert [o.outcome for o in app.store.outcomes(rid)] == ["canceled"]
