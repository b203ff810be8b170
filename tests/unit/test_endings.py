"""A caller waiting on a run's result wakes when a worker of its process ends the run."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

import perdure
from perdure import client as client_api
from perdure import endings


def test_an_end_wakes_the_watchers_of_that_run_only() -> None:
    hub = endings.Endings()
    with hub.watch("r1") as first, hub.watch("r1") as second, hub.watch("r2") as other:
        hub.ended("r1")
        assert first.is_set() and second.is_set()
        assert not other.is_set()
    # Watches are dropped on exit: an end with no one waiting is a no-op.
    assert hub._waiters == {}
    hub.ended("r1")


def test_stores_share_endings_by_object() -> None:
    a, b = object.__new__(type("S", (), {})), object.__new__(type("S", (), {}))
    assert endings.of(a) is endings.of(a)
    assert endings.of(a) is not endings.of(b)


def test_a_store_without_weak_references_gets_endings_of_its_own() -> None:
    class Slotted:
        __slots__ = ()

    store = Slotted()
    assert endings.of(store) is not endings.of(store)  # nothing shared: callers poll


def test_result_returns_on_the_local_end_without_waiting_for_a_poll(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # With pauses of a minute, only the worker's report can make result()
    # return within the bound below.
    monkeypatch.setattr(client_api, "POLL_FIRST", 60.0)
    monkeypatch.setattr(client_api, "POLL_MAX", 60.0)
    app = perdure.App(f"sqlite:///{tmp_path / 's.db'}", name="endings")
    release = threading.Event()

    @app.step()
    def gate() -> int:
        release.wait(30)
        return 7

    @app.workflow()
    def flow(ctx: perdure.Context) -> int:
        return gate()

    with app.worker():
        handle = app.start(flow)
        got: list[int] = []
        waiter = threading.Thread(target=lambda: got.append(handle.result(timeout=120)))
        waiter.start()
        # result() has read the run (not ended) and now waits its first pause.
        deadline = time.monotonic() + 10
        while not endings.of(app.store)._waiters and time.monotonic() < deadline:
            time.sleep(0.005)
        started = time.monotonic()
        release.set()
        waiter.join(20)
        assert got == [7]
        assert time.monotonic() - started < 15
    app.close()
