"""A caller waiting on a run's result wakes when a worker of its process ends the run."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import perdure
from perdure import client as client_api
from perdure import endings


def _until(condition: Callable[[], bool], within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.005)


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
        _until(lambda: bool(endings.of(app.store)._waiters))
        started = time.monotonic()
        release.set()
        waiter.join(20)
        assert got == [7]
        assert time.monotonic() - started < 15
    app.close()


def test_a_let_go_wakes_the_watchers_of_that_run() -> None:
    hub = endings.Endings()
    with hub.watch("r1") as watch, hub.watch("r2") as other:
        assert not hub.held("r1")
        hub.hold("r1")
        # A hold wakes nobody: a waiter finds it when its pause ends.
        assert hub.held("r1") and not watch.is_set() and not other.is_set()
        hub.let_go("r1")
        assert not hub.held("r1") and watch.is_set()
        assert not watch.reported and watch.ended is None


def test_an_end_is_handed_to_every_watcher_of_the_run() -> None:
    hub = endings.Endings()
    with hub.watch("r1") as first, hub.watch("r1") as second:
        hub.ended("r1", endings.Ended('"done"'))
        assert first.reported and second.reported
        assert first.ended == second.ended == endings.Ended('"done"')
    with hub.watch("r1") as plain:
        hub.ended("r1")  # an end not handed over: the caller reads the store
        assert plain.reported and plain.ended is None


def _counting_reads(app: perdure.App, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    reads: list[str] = []
    store = app.store
    original = store.get_run

    def get_run(run_id: str) -> object:
        reads.append(run_id)
        return original(run_id)

    monkeypatch.setattr(store, "get_run", get_run)
    return reads


def _unread(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """An event set once a result() call finds its run held here and waits without a read."""
    seen = threading.Event()
    unread = client_api._ResultWait.unread

    def recorded(self: Any) -> str | None:
        state = unread(self)
        if state is not None:
            seen.set()
        return state

    monkeypatch.setattr(client_api._ResultWait, "unread", recorded)
    return seen


def _gated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[perdure.App, Any, threading.Event, threading.Event]:
    """An app whose run holds its one step at a gate; result() polls every millisecond."""
    monkeypatch.setattr(client_api, "POLL_FIRST", 0.001)
    monkeypatch.setattr(client_api, "POLL_MAX", 0.001)
    monkeypatch.setattr(client_api, "HELD_PAUSE", 60.0)
    app = perdure.App(f"sqlite:///{tmp_path / 's.db'}", name="endings")
    inside, release = threading.Event(), threading.Event()

    @app.step()
    def gate() -> dict[str, int]:
        inside.set()
        release.wait(30)
        return {"n": 7}

    @app.workflow()
    def flow(ctx: perdure.Context) -> dict[str, int]:
        return gate()

    return app, flow, inside, release


def test_result_reads_nothing_while_a_worker_here_runs_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Polling every millisecond would read the run hundreds of times while
    # its step is held at the gate; the worker's word makes reads needless.
    app, flow, inside, release = _gated(tmp_path, monkeypatch)
    unread = _unread(monkeypatch)
    with app.worker():
        handle = app.start(flow)
        assert inside.wait(30)
        reads = _counting_reads(app, monkeypatch)
        got: list[dict[str, int]] = []
        waiter = threading.Thread(target=lambda: got.append(handle.result(timeout=120)))
        waiter.start()
        assert unread.wait(30)  # it found the run held here: no read before the wait
        time.sleep(0.2)  # room for two hundred reads, had result() polled
        release.set()
        waiter.join(20)
        assert got == [{"n": 7}]
        # No read: the end was handed over, not read back.
        assert reads == []
    app.close()


def test_result_reads_a_run_no_worker_here_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = perdure.App(f"sqlite:///{tmp_path / 's.db'}", name="endings")

    @app.workflow()
    def flow(ctx: perdure.Context) -> int:
        return 3

    handle = app.start(flow)  # no worker here yet: announced, not taken
    with app.worker():
        assert handle.result(timeout=60) == 3
    reads = _counting_reads(app, monkeypatch)
    assert handle.result(timeout=60) == 3  # ended: read once
    assert reads == [handle.run_id]
    app.close()


def test_result_reads_again_once_the_worker_here_lets_the_run_go(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(client_api, "HELD_PAUSE", 60.0)
    app = perdure.App(f"sqlite:///{tmp_path / 's.db'}", name="endings")

    @app.workflow()
    def flow(ctx: perdure.Context) -> str:
        return str(ctx.wait("go", timeout=60))

    with app.worker():
        handle = app.start(flow)
        got: list[str] = []
        waiter = threading.Thread(target=lambda: got.append(handle.result(timeout=120)))
        waiter.start()
        _until(lambda: app.get(handle.run_id).state == "waiting")
        # Parked: the worker let it go, so result() polls the store again and
        # sees the end the signal brings (HELD_PAUSE alone would be a minute).
        started = time.monotonic()
        app.signal(handle.run_id, "go", "yes")
        waiter.join(20)
        assert got == ["yes"]
        assert time.monotonic() - started < 15
    app.close()


def test_a_failed_end_is_read_from_the_store(tmp_path: Path) -> None:
    app = perdure.App(f"sqlite:///{tmp_path / 's.db'}", name="endings")

    @app.workflow()
    def flow(ctx: perdure.Context) -> None:
        raise ValueError("no")

    with app.worker():
        handle = app.start(flow)
        with pytest.raises(perdure.RunFailed) as failed:
            handle.result(timeout=60)
        assert failed.value.state == "failed"
    app.close()


def test_aresult_reads_nothing_while_a_worker_here_runs_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The async form waits on the event loop for the same word: no read.
    app, flow, inside, release = _gated(tmp_path, monkeypatch)
    unread = _unread(monkeypatch)

    async def main(handle: perdure.RunHandle[dict[str, int]]) -> dict[str, int]:
        waiting = asyncio.ensure_future(handle.aresult(timeout=120))
        while not unread.is_set():  # it found the run held here
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.2)  # room for two hundred reads, had it polled
        release.set()
        return await asyncio.wait_for(waiting, 20)

    with app.worker():
        handle = app.start(flow)
        assert inside.wait(30)
        reads = _counting_reads(app, monkeypatch)
        assert asyncio.run(main(handle)) == {"n": 7}
        assert reads == []
    app.close()


def test_an_awaited_watch_wakes_when_another_thread_sets_it() -> None:
    async def main() -> tuple[bool, bool]:
        hub = endings.Endings()
        with hub.watch("r1", asyncio.get_running_loop()) as watch:
            quiet = await watch.await_set(0.01)
            threading.Timer(0.05, lambda: hub.ended("r1", endings.Ended("1"))).start()
            woken = await watch.await_set(20)
            return quiet, woken

    assert asyncio.run(main()) == (False, True)
