"""A worker's first claims while its lease keeper starts.

A keeper process takes a moment to start (the interpreter and the store
adapter). A worker whose lease outlasts that start by far claims at once and
renews from its heartbeat thread until the keeper renews; one with a short
lease claims nothing until then. A keeper that exits before it is ready is
given up on. The keeper here is a stand-in whose readiness the test sets, so
every step is ordered by the test, not by a process's start-up time.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

import perdure
from perdure import keeper

LIMIT = 15.0  # seconds: an upper bound for anything to happen, never a pause


def wait_for(check: Callable[[], Any], what: str, timeout: float = LIMIT) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.01)


class _Ready(threading.Event):
    """The keeper's readiness, counting how often the worker waited on it."""

    def __init__(self) -> None:
        super().__init__()
        self.waits = 0

    def wait(self, timeout: float | None = None) -> bool:
        self.waits += 1
        return super().wait(timeout)


class StandInKeeper(keeper.Keeper):
    """A keeper with no process: it records what it is told and is ready when told."""

    def __init__(self) -> None:
        super().__init__("sqlite:///unused", lease_ttl=30, heartbeat=5, on_lost=lambda *a: None)
        self.ready = _Ready()
        self.lines: list[str] = []
        self.running = True
        self.closed = False

    def start(self) -> None:
        pass

    @property
    def alive(self) -> bool:
        return self.running

    def close(self, timeout: float = 5.0) -> None:
        self.closed = True

    def _send_lines(self, lines: list[str]) -> None:
        self.lines.extend(lines)


def _app(url: str) -> perdure.App:
    app = perdure.App(url, name="starts")

    @app.workflow(name="hello")
    def hello(ctx: perdure.Context, who: str) -> str:
        return f"hello {who}"

    return app


def _worker(app: perdure.App, stand_in: StandInKeeper, **options: Any) -> perdure.Worker:
    worker = app.worker(concurrency=2, poll_interval=0.05, **options)
    assert worker._keeper is not None, "a worker on a store URL starts a keeper"
    worker._keeper = stand_in
    return worker


def test_a_long_lease_claims_before_the_keeper_is_ready(sqlite_url: str) -> None:
    app = _app(sqlite_url)
    stand_in = StandInKeeper()
    handle = app.start("hello", "a")
    with _worker(app, stand_in, lease_ttl=30, heartbeat=5) as worker:
        assert handle.result(timeout=LIMIT) == "hello a"
        assert not stand_in.ready.is_set()
        # The claim reached the keeper before the run started.
        assert any(handle.run_id in line and '"hold"' in line for line in stand_in.lines)
        assert worker.liveness == "process"
    app.close()


def test_a_short_lease_claims_nothing_until_the_keeper_is_ready(sqlite_url: str) -> None:
    app = _app(sqlite_url)
    stand_in = StandInKeeper()
    handle = app.start("hello", "b")
    with _worker(app, stand_in, lease_ttl=3, heartbeat=1):
        # The claim loop has looked at the keeper several times (0.05 s each)
        # and claimed nothing meanwhile.
        wait_for(lambda: stand_in.ready.waits >= 5, "the claim loop to wait on the keeper")
        assert app.get(handle.run_id).state == "queued"
        assert stand_in.lines == []
        stand_in.ready.set()
        assert handle.result(timeout=LIMIT) == "hello b"
    app.close()


@pytest.mark.parametrize("lease", [(30.0, 0.2), (3.0, 0.2)], ids=["long", "short"])
def test_a_keeper_that_exits_before_it_is_ready_is_given_up_on(
    sqlite_url: str, lease: tuple[float, float], caplog: pytest.LogCaptureFixture
) -> None:
    app = _app(sqlite_url)
    stand_in = StandInKeeper()
    stand_in.running = False
    handle = app.start("hello", "c")
    lease_ttl, heartbeat = lease
    caplog.set_level(logging.WARNING, logger="perdure.worker")
    with _worker(app, stand_in, lease_ttl=lease_ttl, heartbeat=heartbeat) as worker:
        assert handle.result(timeout=LIMIT) == "hello c"
        wait_for(lambda: worker.liveness == "thread", "the worker to renew from a thread")
        assert worker._keeper is None
        assert stand_in.closed
    app.close()
    warned = [r.getMessage() for r in caplog.records if "did not start" in r.getMessage()]
    assert len(warned) == 1, warned
