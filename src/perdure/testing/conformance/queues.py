"""Conformance: queues and their limits at claim time (:mod:`perdure.store.queueport`)."""

from __future__ import annotations

import functools
import uuid
from collections import Counter

import pytest

from perdure import errors
from perdure.store import pages, port, queueport
from perdure.testing import clock as clocks
from perdure.testing.conformance.harness import (
    APP,
    OTHER_APP,
    TTL,
    WORKER,
    StoreHandle,
    Suite,
    get,
    run_threads,
    start,
)


def _queues(store: port.Store) -> queueport.QueueStore:
    assert isinstance(store, queueport.QueueStore), "the store keeps no queues"
    return store


def _enqueue(
    store: port.Store,
    clock: clocks.FakeClock,
    workflow: str,
    queue: str,
    *,
    queue_key: str | None = None,
    priority: int = 0,
    app: str = APP,
) -> port.Run:
    new = port.NewRun(
        run_id=str(uuid.uuid4()),
        app=app,
        workflow=workflow,
        version="1",
        input="{}",
        queue=queue,
        queue_key=queue_key,
        priority=priority,
    )
    run, created = store.create_run(new)
    assert created
    clock.advance(0.001)  # first come, first served needs distinct instants
    return run


def _claim(
    store: port.Store, workflow: str, limit: int = 100, worker: str = WORKER
) -> list[port.Claimed]:
    return store.claim(APP, worker, [(workflow, "1")], lease_ttl=TTL, limit=limit)


def _finish(store: port.Store, claimed: port.Claimed) -> None:
    store.finish(claimed.claim, [], state="succeeded", result="null")


def _wf() -> str:
    return f"wf-{uuid.uuid4().hex[:10]}"


class QueueTests(Suite):
    """The conformance tests of queues: rows, and claims under their limits."""

    def test_save_get_and_list_queues(self, store: port.Store, clock: clocks.FakeClock) -> None:
        queues = _queues(store)
        first = clock.now()
        [saved] = queues.save_queues(APP, [queueport.QueueSpec("emails", 10, 1, 100, 60.0)])
        assert (saved.name, saved.concurrency, saved.per_key) == ("emails", 10, 1)
        assert (saved.rate_limit, saved.rate_seconds) == (100, 60.0)
        assert saved.created_at == first
        clock.advance(5)
        # A declaration again replaces the limits (None removes one).
        [again] = queues.save_queues(APP, [queueport.QueueSpec("emails", concurrency=3)])
        assert (again.concurrency, again.per_key, again.rate_limit) == (3, None, None)
        assert again.created_at == first and again.updated_at == clock.now()
        queues.save_queues(OTHER_APP, [queueport.QueueSpec("bulk")])
        found = queues.get_queue(APP, "emails")
        assert found is not None and found.concurrency == 3
        assert queues.get_queue(APP, "bulk") is None
        assert [(q.app, q.name) for q in queues.list_queues()] == [
            (APP, "emails"),
            (OTHER_APP, "bulk"),
        ]

    def test_list_counts_running_and_waiting_runs(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        _queues(store).save_queues(APP, [queueport.QueueSpec("q", concurrency=1)])
        wf = _wf()
        for _ in range(3):
            _enqueue(store, clock, wf, "q")
        assert len(_claim(store, wf)) == 1
        [row] = _queues(store).list_queues(APP)
        assert (row.running, row.waiting) == (1, 2)

    def test_refuses_limits_it_cannot_enforce(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        queues = _queues(store)
        for bad in (
            queueport.QueueSpec("q", concurrency=0),
            queueport.QueueSpec("q", per_key=-1),
            queueport.QueueSpec("q", rate_limit=5),
            queueport.QueueSpec("q", rate_limit=5, rate_seconds=0.0),
        ):
            with pytest.raises(errors.InvalidQueue):
                queues.save_queues(APP, [bad])
        assert queues.list_queues(APP) == []

    def test_claims_never_exceed_the_concurrency(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        _queues(store).save_queues(APP, [queueport.QueueSpec("q", concurrency=2)])
        wf = _wf()
        runs = [_enqueue(store, clock, wf, "q") for _ in range(5)]
        first = _claim(store, wf)
        assert [c.run.run_id for c in first] == [r.run_id for r in runs[:2]]
        assert all(c.run.queue == "q" and c.claim.generation == 1 for c in first)
        assert _claim(store, wf) == []
        _finish(store, first[0])
        [third] = _claim(store, wf)
        assert third.run.run_id == runs[2].run_id
        assert _claim(store, wf) == []

    def test_claims_respect_the_limit_per_key(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        _queues(store).save_queues(APP, [queueport.QueueSpec("q", per_key=1)])
        wf = _wf()
        a1, a2 = (
            _enqueue(store, clock, wf, "q", queue_key="a"),
            _enqueue(store, clock, wf, "q", queue_key="a"),
        )
        b1, _ = (
            _enqueue(store, clock, wf, "q", queue_key="b"),
            _enqueue(store, clock, wf, "q", queue_key="b"),
        )
        loose = _enqueue(store, clock, wf, "q")  # no key: counted by no key's limit
        claimed = _claim(store, wf)
        assert {c.run.run_id for c in claimed} == {a1.run_id, b1.run_id, loose.run_id}
        assert _claim(store, wf) == []
        _finish(store, next(c for c in claimed if c.run.run_id == a1.run_id))
        [next_a] = _claim(store, wf)
        assert next_a.run.run_id == a2.run_id

    def test_rate_caps_starts_within_any_window(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        _queues(store).save_queues(APP, [queueport.QueueSpec("q", rate_limit=2, rate_seconds=60)])
        wf = _wf()
        runs = [_enqueue(store, clock, wf, "q") for _ in range(5)]
        first = _claim(store, wf)
        assert [c.run.run_id for c in first] == [r.run_id for r in runs[:2]]
        for claimed in first:
            _finish(store, claimed)
        clock.advance(30)
        assert _claim(store, wf) == []  # ended runs still count: they started in the window
        clock.advance(29)
        assert _claim(store, wf) == []
        clock.advance(2)
        assert [c.run.run_id for c in _claim(store, wf)] == [r.run_id for r in runs[2:4]]
        assert _claim(store, wf) == []

    def test_a_run_claimed_again_is_not_a_new_start(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        _queues(store).save_queues(APP, [queueport.QueueSpec("q", rate_limit=1, rate_seconds=60)])
        wf = _wf()
        run, other = _enqueue(store, clock, wf, "q"), _enqueue(store, clock, wf, "q")
        [claimed] = _claim(store, wf)
        assert claimed.run.run_id == run.run_id
        store.release(claimed.claim, delay=0, failed=False)
        [again] = _claim(store, wf)
        assert again.run.run_id == run.run_id and again.claim.generation == 2
        assert get(store, other.run_id).state == "queued"

    def test_lower_priority_numbers_first_then_first_come(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        _queues(store).save_queues(APP, [queueport.QueueSpec("q", concurrency=1)])
        wf = _wf()
        late = _enqueue(store, clock, wf, "q", priority=5)
        urgent_a = _enqueue(store, clock, wf, "q", priority=1)
        middle = _enqueue(store, clock, wf, "q", priority=3)
        urgent_b = _enqueue(store, clock, wf, "q", priority=1)
        first = _enqueue(store, clock, wf, "q", priority=-2)
        order = []
        for _ in range(5):
            [claimed] = _claim(store, wf)
            order.append(claimed.run.run_id)
            _finish(store, claimed)
        expected = [first, urgent_a, urgent_b, middle, late]
        assert order == [r.run_id for r in expected]

    def test_a_parked_run_frees_its_slot_and_claims_one_again(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        _queues(store).save_queues(APP, [queueport.QueueSpec("q", concurrency=1)])
        wf = _wf()
        waiter, other = _enqueue(store, clock, wf, "q"), _enqueue(store, clock, wf, "q")
        [held] = _claim(store, wf)
        assert held.run.run_id == waiter.run_id
        assert store.park(held.claim, [], [port.WaitSpec("go", "signal")], wake_at=None)
        [taken] = _claim(store, wf)
        assert taken.run.run_id == other.run_id
        assert store.wake(waiter.run_id)
        assert _claim(store, wf) == []  # woken, but the slot is taken
        _finish(store, taken)
        [resumed] = _claim(store, wf)
        assert resumed.run.run_id == waiter.run_id and resumed.claim.generation == 2

    def test_a_lapsed_run_keeps_its_slot_until_recovered(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        _queues(store).save_queues(APP, [queueport.QueueSpec("q", concurrency=1)])
        wf = _wf()
        run, other = _enqueue(store, clock, wf, "q"), _enqueue(store, clock, wf, "q")
        assert len(_claim(store, wf)) == 1
        clock.advance(TTL + 1)
        [recovered] = _claim(store, wf, worker="worker-b")
        assert recovered.run.run_id == run.run_id and recovered.recovered
        assert get(store, other.run_id).state == "queued"

    def test_runs_in_no_queue_pass_a_full_queue(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        _queues(store).save_queues(APP, [queueport.QueueSpec("q", concurrency=1)])
        wf = _wf()
        queued = [_enqueue(store, clock, wf, "q") for _ in range(3)]
        free = [start(store, workflow=wf) for _ in range(2)]
        claimed = {c.run.run_id for c in _claim(store, wf)}
        assert claimed == {queued[0].run_id, *(r.run_id for r in free)}

    def test_new_limits_apply_to_the_next_claims(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        queues = _queues(store)
        queues.save_queues(APP, [queueport.QueueSpec("q", concurrency=1)])
        wf = _wf()
        for _ in range(4):
            _enqueue(store, clock, wf, "q")
        assert len(_claim(store, wf)) == 1
        queues.save_queues(APP, [queueport.QueueSpec("q", concurrency=3)])
        assert len(_claim(store, wf)) == 2
        queues.save_queues(APP, [queueport.QueueSpec("q")])
        assert len(_claim(store, wf)) == 1

    def test_concurrent_claims_never_exceed_the_limits(
        self, handle: StoreHandle, clock: clocks.FakeClock
    ) -> None:
        store = handle.store
        _queues(store).save_queues(APP, [queueport.QueueSpec("q", concurrency=3, per_key=1)])
        wf = _wf()
        for index in range(24):
            _enqueue(store, clock, wf, "q", queue_key=f"k{index % 4}")
        others = [handle.reopen() for _ in range(self.thread_count)]

        def claimer(index: int) -> list[port.Claimed]:
            return _claim(others[index], wf, limit=2, worker=f"worker-{index}")

        try:
            found = run_threads([functools.partial(claimer, i) for i in range(len(others))])
        finally:
            for other in others:
                other.close()
        claimed = [c for got in found for c in got]
        assert len(claimed) == 3
        assert max(Counter(c.run.queue_key for c in claimed).values()) == 1

    def test_pages_of_one_queue(self, store: port.Store, clock: clocks.FakeClock) -> None:
        assert isinstance(store, pages.PagedStore), "the store pages no runs"
        _queues(store).save_queues(APP, [queueport.QueueSpec("q"), queueport.QueueSpec("r")])
        wf = _wf()
        in_q = [_enqueue(store, clock, wf, "q") for _ in range(3)]
        _enqueue(store, clock, wf, "r")
        start(store, workflow=wf)
        newest = [r.run_id for r in reversed(in_q)]
        assert [r.run_id for r in store.page_runs(APP, queue="q")] == newest
        first = store.page_runs(APP, queue="q", limit=2)
        after = pages.After(first[-1].created_at, first[-1].run_id)
        assert [r.run_id for r in store.page_runs(APP, queue="q", after=after)] == newest[2:]
        assert store.page_runs(APP, queue="q", state="running") == []
        assert store.page_runs(APP, queue="none") == []
