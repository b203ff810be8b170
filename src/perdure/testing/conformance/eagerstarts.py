"""Conformance: a run created already claimed by its starter's worker (``create_claimed``)."""

from __future__ import annotations

import functools
from dataclasses import replace
from datetime import timedelta

import pytest

from perdure import errors
from perdure.store import eagerport, planport, port
from perdure.testing import clock as clocks
from perdure.testing.conformance.harness import (
    APP,
    OTHER_WORKER,
    TTL,
    WORKER,
    Suite,
    claim_run,
    entry,
    get,
    kinds,
    new_run,
    run_threads,
    snapshot,
    start,
)


def _eager(store: port.Store) -> eagerport.EagerStarts:
    assert isinstance(store, eagerport.EagerStarts), "the store must create runs claimed"
    return store


class EagerStartTests(Suite):
    """The conformance tests of ``create_claimed``."""

    def test_create_claimed_stores_the_run_as_a_claim_leaves_it(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        new = new_run(workflow="wf")
        run, claimed = _eager(store).create_claimed(new, WORKER, lease_ttl=TTL)
        assert claimed is not None
        expires = clock.now() + timedelta(seconds=TTL)
        assert claimed.claim == port.Claim(new.run_id, WORKER, 1, expires)
        assert (claimed.run, claimed.journal, claimed.outcomes) == (run, [], [])
        assert claimed.recovered is False
        assert (run.state, run.worker, run.generation, run.failures) == ("running", WORKER, 1, 0)
        assert (run.lease_expires_at, run.created_at, run.updated_at) == (
            expires,
            clock.now(),
            clock.now(),
        )
        assert (run.workflow, run.input, run.key, run.ready_at) == ("wf", new.input, None, None)
        assert get(store, new.run_id) == run
        history = store.history(new.run_id)
        assert [(r.sequence, r.kind, r.generation, r.worker) for r in history] == [
            (1, "initialized", 0, None),
            (2, "claimed", 1, WORKER),
        ]
        assert run.ledger_sequence == 2
        # Nothing is left to claim: the run is this worker's.
        assert store.claim(APP, OTHER_WORKER, [("wf", "1")], lease_ttl=TTL, limit=10) == []

    def test_a_run_created_claimed_is_written_under_its_claim(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run, claimed = _eager(store).create_claimed(new_run(), WORKER, lease_ttl=TTL)
        assert claimed is not None
        clock.advance(5)
        renewed = store.renew(claimed.claim, lease_ttl=TTL)
        assert renewed.lease_expires_at == clock.now() + timedelta(seconds=TTL)
        store.finish(renewed, [entry(1)], state="succeeded", result="3")
        ended = get(store, run.run_id)
        assert (ended.state, ended.result, ended.worker) == ("succeeded", "3", None)
        assert [e.position for e in store.journal(run.run_id)] == [1]
        assert kinds(store, run.run_id)[:2] == ["initialized", "claimed"]

    def test_a_run_created_claimed_lapses_and_is_recovered(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        new = new_run()
        run, claimed = _eager(store).create_claimed(new, WORKER, lease_ttl=10)
        assert claimed is not None
        assert claimed.claim.lease_expires_at == clock.now() + timedelta(seconds=10)
        clock.advance(9)
        assert store.claim(APP, OTHER_WORKER, [(run.workflow, "1")], lease_ttl=TTL) == []
        clock.advance(2)
        again = claim_run(store, run, worker=OTHER_WORKER)
        assert (again.recovered, again.claim.generation, again.run.failures) == (True, 2, 1)
        assert kinds(store, run.run_id) == ["initialized", "claimed", "recovered"]
        # The first claim is fenced off: its writes are refused and change nothing.
        with pytest.raises(errors.StaleClaim):
            store.finish(claimed.claim, [entry(1)], state="succeeded", result="1")
        assert get(store, run.run_id) == again.run

    def test_create_claimed_under_a_stored_key_returns_that_run_unclaimed(
        self, store: port.Store
    ) -> None:
        queued, created = store.create_run(new_run(workflow="wf", key="order-1"))
        assert created
        before = snapshot(store)
        found, claimed = _eager(store).create_claimed(
            new_run(workflow="wf", key="order-1"), WORKER, lease_ttl=TTL
        )
        assert (found, claimed) == (queued, None)
        assert snapshot(store) == before
        # And the other way round: a key created claimed is found by create_run.
        running, claimed = _eager(store).create_claimed(
            new_run(workflow="wf", key="order-2"), WORKER, lease_ttl=TTL
        )
        assert claimed is not None
        assert store.create_run(new_run(workflow="wf", key="order-2")) == (running, False)

    def test_create_claimed_with_one_key_from_threads_creates_one_claimed_run(
        self, store: port.Store
    ) -> None:
        news = [new_run(workflow="wf", key="once") for _ in range(self.thread_count)]

        def create(index: int) -> tuple[port.Run, port.Claimed | None]:
            return _eager(store).create_claimed(news[index], f"worker-{index}", lease_ttl=TTL)

        results = run_threads([functools.partial(create, i) for i in range(len(news))])
        made = [claimed for _, claimed in results if claimed is not None]
        assert len(made) == 1
        assert {run.run_id for run, _ in results} == {made[0].run.run_id}
        assert get(store, made[0].run.run_id).worker == made[0].claim.worker
        assert kinds(store, made[0].run.run_id) == ["initialized", "claimed"]

    def test_create_claimed_refuses_what_a_claim_must_judge_and_bad_input(
        self, store: port.Store
    ) -> None:
        taken = start(store)
        before = snapshot(store)
        eager = _eager(store)
        refused = [
            replace(new_run(), queue="emails"),
            replace(new_run(), plan=planport.PlanSpec(digest="d", policy=0, tasks=())),
        ]
        for new in refused:
            with pytest.raises(errors.InvalidInput, match="claimed under its limits"):
                eager.create_claimed(new, WORKER, lease_ttl=TTL)
        with pytest.raises(errors.InvalidInput, match="worker id"):
            eager.create_claimed(new_run(), "two words", lease_ttl=TTL)
        with pytest.raises(errors.InvalidInput):
            eager.create_claimed(new_run(), WORKER, lease_ttl=0)
        with pytest.raises(errors.InvalidInput, match="already taken"):
            eager.create_claimed(replace(new_run(), run_id=taken.run_id), WORKER, lease_ttl=TTL)
        assert snapshot(store) == before
