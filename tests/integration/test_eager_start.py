"""Eager starts (perdure.starts): a run started where a worker of its app has room is created
claimed by that worker and handed to it in memory; anything else is claimed the ordinary
way, and the worker never runs more at once than its concurrency (both stores).

Which way a run went is read from its ledger: a run created claimed has its ``claimed``
receipt written by the statement that created it, at the same instant; an ordinary claim
comes in a later transaction. The workers poll once a minute, so that a claim of theirs
(which holds every free slot while it runs) comes only when a start announced a run.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

import perdure

WAIT = 30
POLL = 60.0


def _until(predicate: Callable[[], bool], timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def _created_claimed(app: perdure.App, run_id: str) -> bool:
    """Whether the run's first claim came with its creation (same instant, same write)."""
    history = app.history(run_id)
    assert [h.kind for h in history[:2]] == ["initialized", "claimed"]
    return history[1].at == app.get(run_id).created_at


def _app(make_app: Callable[..., perdure.App]) -> tuple[perdure.App, Any]:
    app = make_app()

    @app.workflow()
    def double(ctx: perdure.Context, n: int) -> int:
        return n * 2

    return app, double


def test_a_run_started_beside_its_worker_is_created_claimed_by_it(
    make_app: Callable[..., perdure.App],
) -> None:
    app, double = _app(make_app)
    with app.worker(poll_interval=POLL) as worker:
        _until(lambda: worker.takes_starts)
        handles = [app.start(double, n) for n in range(5)]
        assert [h.result(timeout=WAIT) for h in handles] == [0, 2, 4, 6, 8]
    for handle in handles:
        assert _created_claimed(app, handle.run_id)
        claimed = app.history(handle.run_id)[1]
        assert (claimed.worker, claimed.generation) == (worker.worker_id, 1)
        assert [h.kind for h in app.history(handle.run_id)][-1] == "finished"
    assert not worker.takes_starts  # stopped


def test_what_a_claim_must_judge_and_eager_false_are_claimed_the_ordinary_way(
    make_app: Callable[..., perdure.App],
) -> None:
    app, double = _app(make_app)
    app.queue("line", concurrency=1)
    with app.worker(eager=False, poll_interval=POLL) as worker:
        _until(lambda: worker._claims_open)
        assert not worker.takes_starts
        plain = app.start(double, 1)
        assert plain.result(timeout=WAIT) == 2
    assert not _created_claimed(app, plain.run_id)
    with app.worker(poll_interval=POLL) as worker:
        _until(lambda: worker.takes_starts)
        queued = app.start(double, 2, queue="line")
        assert queued.result(timeout=WAIT) == 4
        dry = app.start(double, 3, dry_run=True)  # only a dry-run worker takes it
        assert app.get(dry.run_id).state == "queued"
        _until(lambda: worker.takes_starts)  # done with the claim the dry run's start woke
        keyed = app.start(double, 4, key="k")
        again = app.start(double, 4, key="k")
        assert again.run_id == keyed.run_id
        assert keyed.result(timeout=WAIT) == 8
    assert not _created_claimed(app, queued.run_id)
    assert _created_claimed(app, keyed.run_id)
    assert [h.kind for h in app.history(keyed.run_id)].count("claimed") == 1
    with app.worker(dry_run=True, poll_interval=POLL) as dry_worker:
        _until(lambda: dry_worker.takes_starts)
        assert dry.result(timeout=WAIT) == 6
        _until(lambda: dry_worker.takes_starts)
        second = app.start(double, 5, dry_run=True)
        assert second.result(timeout=WAIT) == 10
    assert not _created_claimed(app, dry.run_id)
    assert _created_claimed(app, second.run_id)


def test_starts_beyond_the_free_slots_wait_for_an_ordinary_claim(
    make_app: Callable[..., perdure.App],
) -> None:
    app = make_app()
    gate = threading.Event()

    @app.step()
    def held(n: int) -> int:
        assert gate.wait(WAIT)
        return n

    @app.workflow()
    def gated(ctx: perdure.Context, n: int) -> int:
        return held(n)

    with app.worker(concurrency=2, poll_interval=POLL) as worker:
        _until(lambda: worker.takes_starts)
        handles = [app.start(gated, n) for n in range(6)]
        # Both slots were free for the first two only; the rest were announced.
        assert [app.get(h.run_id).state for h in handles[2:]] == ["queued"] * 4
        gate.set()
        assert [h.result(timeout=WAIT) for h in handles] == list(range(6))
    assert [_created_claimed(app, h.run_id) for h in handles] == [True] * 2 + [False] * 4


@pytest.mark.parametrize("concurrency", [1, 2])
def test_eager_starts_and_claims_together_never_exceed_the_concurrency(
    make_app: Callable[..., perdure.App], concurrency: int
) -> None:
    app = make_app()
    lock = threading.Lock()
    inside = [0]
    most = [0]

    @app.step()
    def counted(n: int) -> int:
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        time.sleep(0.002)
        with lock:
            inside[0] -= 1
        return n

    @app.workflow()
    def one(ctx: perdure.Context, n: int) -> int:
        return counted(n)

    handles: list[perdure.RunHandle[int]] = []

    def starter(base: int) -> None:
        for n in range(base, base + 8):
            handles.append(app.start(one, n))

    with app.worker(concurrency=concurrency, poll_interval=POLL) as worker:
        _until(lambda: worker.takes_starts)
        threads = [threading.Thread(target=starter, args=(b * 100,)) for b in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(WAIT)
        assert sorted(h.result(timeout=WAIT) for h in handles) == sorted(
            n for b in range(4) for n in range(b * 100, b * 100 + 8)
        )
    assert 1 <= most[0] <= concurrency
    eager = sum(_created_claimed(app, h.run_id) for h in handles)
    assert eager >= 1  # the first start found the worker idle


def test_a_stop_while_a_run_is_created_claimed_leaves_it_to_run_once(
    make_app: Callable[..., perdure.App], monkeypatch: pytest.MonkeyPatch
) -> None:
    app = make_app()
    ran: list[int] = []

    @app.step()
    def record(n: int) -> int:
        ran.append(n)
        return n

    @app.workflow()
    def once(ctx: perdure.Context, n: int) -> int:
        return record(n)

    created = threading.Event()
    go = threading.Event()
    create_claimed = app.store.create_claimed  # type: ignore[attr-defined]

    def committed_then_held(*args: Any, **kwargs: Any) -> object:
        made = create_claimed(*args, **kwargs)
        created.set()
        assert go.wait(WAIT)
        return made

    monkeypatch.setattr(app.store, "create_claimed", committed_then_held)
    worker = app.worker(poll_interval=POLL)
    worker.start()
    _until(lambda: worker.takes_starts)
    started: list[perdure.RunHandle[int]] = []
    starter = threading.Thread(target=lambda: started.append(app.start(once, 7)))
    starter.start()
    assert created.wait(WAIT)
    stopped: list[bool] = []
    stopper = threading.Thread(target=lambda: stopped.append(worker.stop(timeout=WAIT)))
    stopper.start()
    _until(lambda: worker.stopping)
    # The stop waits for the slot held for this run: it is handed over, run or handed back.
    time.sleep(0.05)
    assert stopper.is_alive()
    go.set()
    starter.join(WAIT)
    stopper.join(WAIT)
    assert stopped == [True]
    (handle,) = started
    monkeypatch.undo()
    with app.worker(poll_interval=POLL):
        assert handle.result(timeout=WAIT) == 7
    assert ran == [7]
