"""Retries leave a trace: each failed attempt is stored, survives a restart and is shown.

Runs on SQLite and PostgreSQL with a real worker; ordering waits for stored
states or events, never for time to pass.
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Any

import pytest
from click.testing import CliRunner
from test_runs import WORKER, wait_for, wait_state

import perdure
from perdure import cli


def test_a_step_that_failed_twice_then_succeeded_shows_both_failures(
    make_app: Any, store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    app = make_app()
    calls = {"n": 0}

    @app.step(retry=perdure.Retry(max_attempts=5, initial_delay=0))
    def fetch(order_id: str) -> str:
        calls["n"] += 1
        if calls["n"] <= 2:
            raise ConnectionError(f"refused {calls['n']}")
        return f"ok {order_id}"

    @app.workflow(version="3")
    def orders(ctx: perdure.Context, order_id: str) -> str:
        result: str = fetch(order_id)
        return result

    caplog.set_level(logging.INFO, logger="perdure.worker")
    handle = app.start(orders, "o-1")
    with app.worker(**WORKER):
        assert handle.result(timeout=15) == "ok o-1"
    found = app.attempts(handle.run_id)
    assert [(a.step, a.position, a.attempt, a.code, a.type, a.message) for a in found] == [
        ("fetch", 1, 1, "step_failed", "ConnectionError", "refused 1"),
        ("fetch", 1, 2, "step_failed", "ConnectionError", "refused 2"),
    ]
    assert all(a.duration is not None and a.duration >= 0 for a in found)
    assert all(a.traceback and "in fetch" in a.traceback for a in found)
    # The engine's frames (the attempt loop) are left out of the summary.
    assert all("perdure/steps.py" not in (a.traceback or "") for a in found)
    [entry] = app.store.journal(handle.run_id)
    assert (entry.status, entry.attempt) == ("ok", 3)

    # The log names the run, app, workflow, step and attempt of each failure.
    failures = [r for r in caplog.records if getattr(r, "step", None) == "fetch"]
    assert [(r.levelname, r.attempt) for r in failures] == [("WARNING", 1), ("WARNING", 2)]
    for record in failures:
        assert (record.run_id, record.app, record.workflow) == (handle.run_id, app.name, "orders")
        text = record.getMessage()
        assert f"run {handle.run_id} (app {app.name}, workflow orders v3, step fetch" in text
        assert "ConnectionError: refused" in text
    about_run = [r for r in caplog.records if getattr(r, "run_id", None) == handle.run_id]
    assert any("claimed by" in r.getMessage() for r in about_run)
    assert all("workflow orders" in r.getMessage() for r in about_run)

    runner = CliRunner()
    shown = runner.invoke(cli.cli, ["show", handle.run_id, "--store", store_url])
    assert shown.exit_code == 0, shown.output
    assert "failed attempts" in shown.output
    assert "step fetch attempt 1 after" in shown.output
    assert "[step_failed] ConnectionError: refused 2" in shown.output
    doc = json.loads(
        runner.invoke(cli.cli, ["show", handle.run_id, "--store", store_url, "--json"]).output
    )
    assert [(a["attempt"], a["message"]) for a in doc["failed_attempts"]] == [
        (1, "refused 1"),
        (2, "refused 2"),
    ]
    assert {"step", "position", "code", "type", "traceback", "duration"} <= set(
        doc["failed_attempts"][0]
    )


def test_a_step_that_failed_every_attempt_keeps_each_failure(make_app: Any) -> None:
    app = make_app()

    @app.step(retry=perdure.Retry(max_attempts=3, initial_delay=0))
    def fetch() -> None:
        raise TimeoutError("upstream slow")

    @app.workflow()
    def poll(ctx: perdure.Context) -> None:
        fetch()

    handle = app.start(poll)
    with app.worker(**WORKER):
        info = wait_state(app, handle.run_id, "failed")
    assert info.error is not None and info.error["step"] == "fetch"
    assert [(a.attempt, a.type) for a in app.attempts(handle.run_id)] == [
        (1, "TimeoutError"),
        (2, "TimeoutError"),
        (3, "TimeoutError"),
    ]


def test_a_failure_is_stored_before_the_retry_and_survives_a_restart(make_app: Any) -> None:
    app = make_app()
    first_failed = threading.Event()
    calls = {"n": 0}

    # The pause before the retry outlasts the first worker, which stops during it.
    @app.step(retry=perdure.Retry(max_attempts=3, initial_delay=600, jitter=False, park_after=900))
    def charge() -> str:
        calls["n"] += 1
        if calls["n"] == 1:
            first_failed.set()
            raise ConnectionError("reset")
        return "charged"

    @app.workflow()
    def pay(ctx: perdure.Context) -> str:
        result: str = charge()
        return result

    handle = app.start(pay)
    worker = app.worker(**WORKER).start()
    try:
        assert first_failed.wait(15)
        stored = wait_for(lambda: app.attempts(handle.run_id), "the first failure to be stored")
        assert [(a.attempt, a.message) for a in stored] == [(1, "reset")]
    finally:
        worker.stop(timeout=15)
    assert app.get(handle.run_id).state == "queued"
    # A new worker counts on from the stored attempt: attempt 2 succeeds.
    with app.worker(**WORKER):
        assert handle.result(timeout=15) == "charged"
    [entry] = app.store.journal(handle.run_id)
    assert (entry.status, entry.attempt) == ("ok", 2)
    assert [(a.attempt, a.message) for a in app.attempts(handle.run_id)] == [(1, "reset")]


def test_an_ambiguous_once_step_keeps_its_error_for_the_operator(make_app: Any) -> None:
    app = make_app()

    @app.step(effect="once", retry=perdure.Retry(max_attempts=3, initial_delay=0))
    def charge() -> str:
        raise RuntimeError("socket closed mid-request")

    @app.workflow()
    def pay(ctx: perdure.Context) -> str:
        result: str = charge()
        return result

    handle = app.start(pay)
    with app.worker(**WORKER):
        info = wait_state(app, handle.run_id, "needs_attention")
    assert info.error is not None and info.error["code"] == "effect_outcome_unknown"
    [kept] = app.attempts(handle.run_id)
    assert (kept.attempt, kept.type, kept.message) == (
        1,
        "RuntimeError",
        "socket closed mid-request",
    )
    assert kept.traceback and "in charge" in kept.traceback
    app.resolve(handle.run_id, "charge", output="ch_1")
    with app.worker(**WORKER):
        assert handle.result(timeout=15) == "ch_1"
    # The resolved outcome keeps the attempt that made it ambiguous.
    assert [(a.attempt, a.type) for a in app.attempts(handle.run_id)] == [(1, "RuntimeError")]


def test_a_fork_keeps_the_attempts_it_copies_and_retries_the_failed_step_afresh(
    make_app: Any,
) -> None:
    app = make_app()
    broken = {"on": True}
    calls = {"reserve": 0}

    @app.step(retry=perdure.Retry(max_attempts=3, initial_delay=0))
    def reserve() -> str:
        calls["reserve"] += 1
        if calls["reserve"] == 1:
            raise ConnectionError("flaky")
        return "held"

    @app.step(retry=perdure.Retry(max_attempts=2, initial_delay=0))
    def ship() -> str:
        if broken["on"]:
            raise ValueError("no carrier")
        return "shipped"

    @app.workflow()
    def order(ctx: perdure.Context) -> str:
        return f"{reserve()} {ship()}"

    handle = app.start(order)
    with app.worker(**WORKER):
        wait_state(app, handle.run_id, "failed")
    assert [(a.step, a.attempt) for a in app.attempts(handle.run_id)] == [
        ("reserve", 1),
        ("ship", 1),
        ("ship", 2),
    ]
    broken["on"] = False
    forked = app.fork(handle.run_id)
    with app.worker(**WORKER):
        assert forked.result(timeout=15) == "held shipped"
    # reserve's entry was copied with its failure; ship ran afresh and did not fail.
    assert [(a.step, a.attempt) for a in app.attempts(forked.run_id)] == [("reserve", 1)]
    assert calls["reserve"] == 2
