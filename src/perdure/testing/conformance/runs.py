"""Conformance: create_run, get_run and list_runs."""

from __future__ import annotations

import dataclasses
import functools
import uuid

import pytest

from perdure import errors
from perdure.store import port
from perdure.testing import clock as clocks
from perdure.testing.conformance.harness import (
    APP,
    OTHER_APP,
    StoreHandle,
    Suite,
    claim_run,
    create_in_process,
    entry,
    get,
    kinds,
    new_run,
    run_processes,
    run_threads,
    start,
)


class RunTests(Suite):
    """The conformance tests of create_run, get_run and list_runs."""

    # == create_run ========================================================

    def test_create_run_stores_a_queued_run(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        new = new_run(key="order-1", input='{"order": 1}')
        run, created = store.create_run(new)
        assert created is True
        assert (run.run_id, run.app, run.workflow, run.version) == (
            new.run_id,
            APP,
            new.workflow,
            "1",
        )
        assert (run.state, run.input, run.key, run.parent_id) == (
            "queued",
            '{"order": 1}',
            "order-1",
            None,
        )
        assert (run.result, run.error, run.worker, run.lease_expires_at) == (None, None, None, None)
        assert (run.generation, run.failures, run.cancel_requested) == (0, 0, False)
        assert run.ready_at is None or run.ready_at <= clock.now()
        assert run.ledger_sequence == 1
        assert get(store, run.run_id) == run
        assert store.journal(run.run_id) == []
        assert store.outcomes(run.run_id) == []

    def test_get_run_of_unknown_id_is_none(self, store: port.Store) -> None:
        assert store.get_run(str(uuid.uuid4())) is None

    def test_create_run_is_idempotent_by_app_and_key(self, store: port.Store) -> None:
        first, created = store.create_run(new_run(workflow="wf", key="k"))
        again, created_again = store.create_run(new_run(workflow="wf", key="k", input="2"))
        assert (created, created_again) == (True, False)
        assert again == first
        assert [r.run_id for r in store.list_runs(APP)] == [first.run_id]
        assert kinds(store, first.run_id) == ["initialized"]

    def test_runs_without_key_are_distinct(self, store: port.Store) -> None:
        one = start(store, workflow="wf")
        two = start(store, workflow="wf")
        assert one.run_id != two.run_id
        assert {r.run_id for r in store.list_runs(APP)} == {one.run_id, two.run_id}

    def test_a_taken_run_id_without_key_is_refused(self, store: port.Store) -> None:
        run = start(store)
        again = dataclasses.replace(new_run(), run_id=run.run_id)
        with pytest.raises(errors.InvalidInput, match="already taken"):
            store.create_run(again)
        assert get(store, run.run_id) == run

    def test_create_run_stores_a_forks_journal_only_when_it_creates(
        self, store: port.Store
    ) -> None:
        prefix = [entry(1), entry(2, kind="now", name="now")]
        wanted = new_run(key="fork")
        run, created = store.create_run(wanted, prefix)
        assert created and store.journal(run.run_id) == prefix
        other = dataclasses.replace(new_run(key="fork"), workflow=wanted.workflow)
        again, created = store.create_run(other, [entry(1, name="other")])
        assert (again, created) == (run, False)
        assert store.journal(run.run_id) == prefix
        assert store.get_run(other.run_id) is None

    def test_same_key_in_two_apps_makes_two_runs(self, store: port.Store) -> None:
        mine, created = store.create_run(new_run(app=APP, key="shared"))
        theirs, created_theirs = store.create_run(new_run(app=OTHER_APP, key="shared"))
        assert (created, created_theirs) == (True, True)
        assert mine.run_id != theirs.run_id
        assert [r.run_id for r in store.list_runs(APP)] == [mine.run_id]
        assert [r.run_id for r in store.list_runs(OTHER_APP)] == [theirs.run_id]

    def test_concurrent_create_run_with_one_key_creates_one_run(self, handle: StoreHandle) -> None:
        stores = [handle.reopen() for _ in range(self.thread_count)]
        news = [new_run(workflow="wf", key="same") for _ in stores]
        results = run_threads(
            [functools.partial(s.create_run, n) for s, n in zip(stores, news, strict=True)]
        )
        assert sum(created for _, created in results) == 1
        assert len({run.run_id for run, _ in results}) == 1
        winner = next(run for run, created in results if created)
        assert winner.run_id in {n.run_id for n in news}
        assert [r.run_id for r in handle.store.list_runs(APP)] == [winner.run_id]
        assert kinds(handle.store, winner.run_id) == ["initialized"]

    def test_create_run_from_several_processes_creates_one_run(
        self, handle: StoreHandle, clock: clocks.FakeClock
    ) -> None:
        if not self.processes:
            pytest.skip("this adapter is not tested across processes")
        common = (handle.opener, handle.url, clock.now(), handle.ledger_limit)
        news = [new_run(workflow="wf", key="same") for _ in range(3)]
        results = run_processes(create_in_process, [(*common, n) for n in news])
        assert sorted(created for _, created in results) == [False, False, True]
        assert len({run_id for run_id, _ in results}) == 1
        assert [r.run_id for r in handle.store.list_runs(APP)] == [results[0][0]]

    def test_list_runs_newest_first_with_filters(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        made = []
        for workflow in ("a", "b", "a"):
            made.append(start(store, workflow=workflow))
            clock.advance(1)
        start(store, app=OTHER_APP, workflow="a")
        ids = [r.run_id for r in made]
        assert [r.run_id for r in store.list_runs(APP)] == ids[::-1]
        assert [r.run_id for r in store.list_runs(APP, limit=2)] == [ids[2], ids[1]]
        assert [r.run_id for r in store.list_runs(APP, workflow="a")] == [ids[2], ids[0]]
        claim_run(store, made[1])
        assert [r.run_id for r in store.list_runs(APP, state="running")] == [ids[1]]
        assert [r.run_id for r in store.list_runs(APP, state="queued")] == [ids[2], ids[0]]
        assert store.list_runs(APP, state="succeeded") == []
