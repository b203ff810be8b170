"""Conformance: dry runs are kept apart from ordinary claims, and children inherit them."""

from __future__ import annotations

import dataclasses
import uuid

from perdure.store import port
from perdure.testing import clock as clocks
from perdure.testing.conformance.harness import (
    APP,
    OTHER_WORKER,
    TTL,
    WORKER,
    Suite,
    get,
    new_run,
)


def _start(store: port.Store, *, dry_run: bool, workflow: str = "wf") -> port.Run:
    run, created = store.create_run(
        dataclasses.replace(new_run(workflow=workflow), dry_run=dry_run)
    )
    assert created
    return run


class DryRunTests(Suite):
    """The conformance tests of ``dry_run`` on create_run, claim, create_children, list_runs."""

    def test_a_run_is_created_real_unless_asked_and_keeps_what_it_was_given(
        self, store: port.Store
    ) -> None:
        real = _start(store, dry_run=False)
        dry = _start(store, dry_run=True)
        assert (real.dry_run, dry.dry_run) == (False, True)
        assert (get(store, real.run_id).dry_run, get(store, dry.run_id).dry_run) == (False, True)

    def test_an_ordinary_claim_never_takes_a_dry_run_and_a_dry_claim_nothing_else(
        self, store: port.Store
    ) -> None:
        dry = _start(store, dry_run=True)
        real = _start(store, dry_run=False)
        wanted = [("wf", "1")]
        taken = store.claim(APP, WORKER, wanted, lease_ttl=TTL, limit=10)
        assert [c.run.run_id for c in taken] == [real.run_id]
        assert store.claim(APP, WORKER, wanted, lease_ttl=TTL, limit=10) == []
        assert get(store, dry.run_id).state == "queued"
        got = store.claim(APP, OTHER_WORKER, wanted, lease_ttl=TTL, limit=10, dry_run=True)
        assert [(c.run.run_id, c.run.dry_run) for c in got] == [(dry.run_id, True)]

    def test_a_lapsed_dry_run_is_recovered_by_a_dry_claim_only(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        dry = _start(store, dry_run=True)
        wanted = [("wf", "1")]
        [first] = store.claim(APP, WORKER, wanted, lease_ttl=TTL, dry_run=True)
        clock.advance(TTL + 1)
        assert store.claim(APP, OTHER_WORKER, wanted, lease_ttl=TTL, limit=10) == []
        [again] = store.claim(APP, OTHER_WORKER, wanted, lease_ttl=TTL, dry_run=True)
        assert (again.run.run_id, again.recovered) == (dry.run_id, True)
        assert again.claim.generation == first.claim.generation + 1

    def test_the_children_of_a_dry_run_are_dry_and_those_of_a_real_run_are_not(
        self, store: port.Store
    ) -> None:
        for dry in (True, False):
            parent = _start(store, dry_run=dry, workflow=f"parent-{dry}")
            [claimed] = store.claim(
                APP, WORKER, [(parent.workflow, "1")], lease_ttl=TTL, dry_run=dry
            )
            # A child asked for as real is still dry under a dry parent.
            kid = dataclasses.replace(
                new_run(workflow="kid", parent_id=parent.run_id),
                key=f"{parent.run_id}/1",
                run_id=uuid.uuid4().hex,
            )
            [child] = store.create_children(claimed.claim, [kid])
            assert get(store, child.run_id).dry_run is dry

    def test_list_runs_keeps_only_dry_or_only_real_runs_when_asked(self, store: port.Store) -> None:
        dry = _start(store, dry_run=True)
        real = _start(store, dry_run=False)
        assert {r.run_id for r in store.list_runs(APP)} == {dry.run_id, real.run_id}
        assert [r.run_id for r in store.list_runs(APP, dry_run=True)] == [dry.run_id]
        assert [r.run_id for r in store.list_runs(APP, dry_run=False)] == [real.run_id]
