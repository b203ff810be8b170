"""The lease keeper: what it takes as a sign of life, and how it renews and reports."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest

from perdure import errors, keeper
from perdure.store import open_store, port


def wait_for(check: Callable[[], Any], what: str, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)
    return value


@pytest.fixture
def busy() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    yield proc
    proc.kill()
    proc.wait()


def test_a_process_burning_cpu_counts_as_progress_and_a_stopped_one_does_not(
    busy: subprocess.Popen[bytes],
) -> None:
    progress = keeper._Progress(busy.pid)
    assert not progress.advanced()  # the first look only takes a baseline
    assert wait_for(progress.advanced, "CPU time to grow")
    busy.send_signal(signal.SIGSTOP)
    try:
        time.sleep(0.05)
        progress.advanced()  # a baseline taken after the stop
        time.sleep(0.2)
        assert not progress.advanced()
    finally:
        busy.send_signal(signal.SIGCONT)


def test_an_idle_or_missing_process_is_no_progress() -> None:
    idle = subprocess.Popen(["sleep", "30"])
    try:
        progress = keeper._Progress(idle.pid)
        progress.advanced()
        time.sleep(0.2)
        assert not progress.advanced()
    finally:
        idle.kill()
        idle.wait()
    assert not keeper._Progress(idle.pid).advanced()


def _claim(run_id: str, generation: int) -> dict[str, Any]:
    line = keeper._claim_line(
        port.Claim(
            run_id, "w", generation, keeper.datetime.fromisoformat("2026-01-01T00:00:00+00:00")
        )
    )
    return line


def test_a_newer_generation_replaces_an_older_one_and_drops_match_the_generation() -> None:
    state = keeper._KeeperState()
    state.apply(_claim("r1", 2))
    state.apply(_claim("r1", 1))
    assert state.held["r1"].generation == 2
    state.apply({"op": "drop", "run_id": "r1", "generation": 1})
    assert "r1" in state.held
    state.apply({"op": "drop", "run_id": "r1", "generation": 2})
    assert "r1" not in state.held
    before = state.last_beat
    time.sleep(0.01)
    state.apply({"op": "beat"})
    assert state.last_beat > before


class _Pipe:
    """Stands for the keeper process: records each write to its stdin."""

    def __init__(self) -> None:
        self.writes: list[str] = []
        self.stdin = self

    def write(self, text: str) -> None:
        self.writes.append(text)

    def flush(self) -> None:
        pass


def test_a_settled_drop_rides_with_the_next_line_and_any_other_goes_at_once() -> None:
    kept = keeper.Keeper("sqlite:///unused.db", lease_ttl=2.0, heartbeat=0.5, on_lost=print)
    pipe = _Pipe()
    kept._process = pipe  # type: ignore[assignment]
    kept.drop("r1", 3, settled=True)
    assert pipe.writes == []  # the keeper is not woken for it
    kept.beat()
    assert [line for write in pipe.writes for line in write.splitlines()] == [
        '{"op": "drop", "run_id": "r1", "generation": 3}',
        '{"op": "beat"}',
    ]
    # A run given up on may still be running in the store: its lease must lapse on time.
    kept.drop("r2", 1)
    assert pipe.writes[-1] == '{"op": "drop", "run_id": "r2", "generation": 1}\n'


def test_the_claims_of_one_batch_reach_the_keeper_in_one_write() -> None:
    kept = keeper.Keeper("sqlite:///unused.db", lease_ttl=2.0, heartbeat=0.5, on_lost=print)
    pipe = _Pipe()
    kept._process = pipe  # type: ignore[assignment]
    kept.drop("r0", 1, settled=True)
    at = keeper.datetime.fromisoformat("2026-01-01T00:00:00+00:00")
    kept.hold_all([port.Claim("r1", "w", 2, at), port.Claim("r2", "w", 5, at)])
    [write] = pipe.writes
    lines = [json.loads(line) for line in write.splitlines()]
    assert [(m["op"], m["run_id"], m["generation"]) for m in lines] == [
        ("drop", "r0", 1),
        ("hold", "r1", 2),
        ("hold", "r2", 5),
    ]
    # What the keeper makes of them: the two claims held, none dropped.
    state = keeper._KeeperState()
    for message in lines:
        state.apply(message)
    assert sorted(state.held) == ["r1", "r2"]


@pytest.fixture
def claimed(store_url: str) -> Iterator[tuple[port.Store, port.Claim]]:
    store = open_store(store_url)
    store.create_run(port.NewRun("r1", "keep", "wf", "1", '{"args": [], "kwargs": {}}'))
    [got] = store.claim("keep", "w1", [("wf", "1")], lease_ttl=2.0)
    yield store, got.claim
    store.close()


def test_the_keeper_renews_while_the_worker_beats_and_reports_what_it_lost(
    claimed: tuple[port.Store, port.Claim], store_url: str
) -> None:
    store, claim = claimed
    lost: list[tuple[str, int, errors.LeaseLost]] = []
    seen = threading.Event()

    def on_lost(run_id: str, generation: int, why: errors.LeaseLost) -> None:
        lost.append((run_id, generation, why))
        seen.set()

    kept = keeper.Keeper(store_url, lease_ttl=2.0, heartbeat=0.1, on_lost=on_lost)
    kept.start()
    try:
        assert kept.ready.wait(20)
        kept.hold(claim)

        def renewed_past(instant: Any) -> bool:
            kept.beat()
            run = store.get_run("r1")
            assert run is not None and run.lease_expires_at is not None
            return run.lease_expires_at > instant

        wait_for(lambda: renewed_past(claim.lease_expires_at + timedelta(seconds=0.2)), "renewal")

        # A requested cancel is reported once; the lease still lasts while the
        # worker settles it.
        assert store.request_cancel("r1")
        assert seen.wait(20)
        assert [(r, g, type(w)) for r, g, w in lost] == [("r1", claim.generation, errors.Canceled)]
        run = store.get_run("r1")
        assert run is not None and run.lease_expires_at is not None
        wait_for(lambda: renewed_past(run.lease_expires_at), "renewal after the cancel")
        assert len(lost) == 1

        # Another claim owns the run now: the keeper says so and lets go.
        seen.clear()
        store.finish(
            port.Claim(claim.run_id, claim.worker, claim.generation, claim.lease_expires_at, True),
            [],
            state="canceled",
        )
        assert seen.wait(20)
        assert type(lost[-1][2]) is errors.StaleClaim
    finally:
        kept.close()
    assert not kept.alive


def test_a_claim_held_before_the_keeper_is_ready_is_renewed_once_it_is(
    claimed: tuple[port.Store, port.Claim], store_url: str, busy: subprocess.Popen[bytes]
) -> None:
    """A worker with a long lease claims while its keeper starts: the claim waits
    in the pipe and is renewed with no beat from the worker, whose CPU time grows
    (a step holding the GIL sends no beat)."""
    store, claim = claimed
    kept = keeper.Keeper(
        store_url, lease_ttl=2.0, heartbeat=0.1, on_lost=lambda *a: None, watch=busy.pid
    )
    kept.start()
    try:
        kept.hold(claim)
        # The keeper is a new interpreter: it cannot have opened the store yet.
        assert not kept.ready.is_set()
        assert kept.ready.wait(20)

        def renewed() -> bool:
            run = store.get_run("r1")
            assert run is not None and run.lease_expires_at is not None
            return run.lease_expires_at > claim.lease_expires_at

        wait_for(renewed, "the renewal of a claim held before the keeper was ready")
    finally:
        kept.close()


def test_the_keeper_stops_renewing_when_the_worker_neither_beats_nor_works(
    claimed: tuple[port.Store, port.Claim], store_url: str
) -> None:
    store, claim = claimed
    # The keeper watches an idle process: this one may burn CPU in threads that
    # other tests left behind.
    idle = subprocess.Popen(["sleep", "60"])
    kept = keeper.Keeper(
        store_url, lease_ttl=2.0, heartbeat=0.1, on_lost=lambda *a: None, watch=idle.pid
    )
    kept.start()
    try:
        assert kept.ready.wait(20)
        kept.hold(claim)
        # The keeper counts its own start as a beat; after that, no beats, and
        # the watched process sleeps: no sign of life.
        time.sleep(0.5)
        run = store.get_run("r1")
        assert run is not None
        time.sleep(1.0)
        later = store.get_run("r1")
        assert later is not None
        assert later.lease_expires_at == run.lease_expires_at
    finally:
        kept.close()
        idle.kill()
        idle.wait()
