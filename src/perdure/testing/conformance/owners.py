"""Conformance: app owner records, the refusals between postures, and takeovers."""

from __future__ import annotations

import pytest

from perdure import errors
from perdure.store import ownerport, port
from perdure.testing import clock as clocks
from perdure.testing.conformance.harness import APP, OTHER_WORKER, TTL, WORKER, Suite, get, start

OWNER_TTL = 10.0


def _owners(store: port.Store) -> ownerport.OwnerStore:
    return ownerport.require(store)


class OwnerTests(Suite):
    """The conformance tests of ``own`` and ``disown``."""

    def test_the_first_worker_takes_the_record_and_renews_it(self, store: port.Store) -> None:
        owners = _owners(store)
        first = owners.own(APP, "none", WORKER, ttl=OWNER_TTL)
        assert (first.posture, first.holder, first.generation, first.taken_from) == (
            "none",
            WORKER,
            1,
            None,
        )
        assert owners.own(APP, "none", WORKER, ttl=OWNER_TTL).generation == 1

    @pytest.mark.parametrize(
        ("held", "asked"),
        [
            ("none", "none"),
            ("none", "run-lease"),
            ("run-lease", "none"),
            ("store-lease", "run-lease"),
            ("run-lease", "store-lease"),
        ],
    )
    def test_a_live_record_refuses_another_posture_or_a_second_single_holder(
        self, store: port.Store, held: ownerport.Posture, asked: ownerport.Posture
    ) -> None:
        owners = _owners(store)
        owners.own(APP, held, WORKER, ttl=OWNER_TTL)
        with pytest.raises(errors.OwnershipConflict) as refused:
            owners.own(APP, asked, OTHER_WORKER, ttl=OWNER_TTL)
        assert (refused.value.holder, refused.value.held_posture) == (WORKER, held)
        assert 0 < refused.value.expires_in <= OWNER_TTL
        assert WORKER in str(refused.value) and OTHER_WORKER in str(refused.value)

    def test_run_lease_workers_share_the_record(self, store: port.Store) -> None:
        owners = _owners(store)
        owners.own(APP, "run-lease", WORKER, ttl=OWNER_TTL)
        shared = owners.own(APP, "run-lease", OTHER_WORKER, ttl=OWNER_TTL)
        assert (shared.holder, shared.generation, shared.taken_from) == (OTHER_WORKER, 1, None)

    def test_other_apps_are_apart(self, store: port.Store) -> None:
        owners = _owners(store)
        owners.own(APP, "none", WORKER, ttl=OWNER_TTL)
        assert owners.own("another-app", "run-lease", OTHER_WORKER, ttl=OWNER_TTL).generation == 1

    def test_an_expired_holder_is_taken_over_and_its_running_runs_lapse_under_a_new_generation(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        owners = _owners(store)
        owners.own(APP, "none", WORKER, ttl=OWNER_TTL)
        run = start(store, workflow="wf")
        [held] = store.claim(APP, WORKER, [("wf", "1")], lease_ttl=10_000.0)
        clock.advance(OWNER_TTL + 1)
        taken = owners.own(APP, "none", OTHER_WORKER, ttl=OWNER_TTL)
        assert (taken.generation, taken.taken_from, taken.lapsed) == (2, WORKER, (run.run_id,))
        # The old holder's writes are fenced off; the ordinary claim recovers the run.
        with pytest.raises(errors.LeaseLost):
            store.renew(held.claim, lease_ttl=TTL)
        [again] = store.claim(APP, OTHER_WORKER, [("wf", "1")], lease_ttl=TTL)
        assert again.recovered and again.claim.generation == held.claim.generation + 2
        assert get(store, run.run_id).worker == OTHER_WORKER

    def test_disown_frees_the_app_only_for_its_holder(self, store: port.Store) -> None:
        owners = _owners(store)
        owners.own(APP, "none", WORKER, ttl=OWNER_TTL)
        owners.disown(APP, OTHER_WORKER)
        with pytest.raises(errors.OwnershipConflict):
            owners.own(APP, "none", OTHER_WORKER, ttl=OWNER_TTL)
        owners.disown(APP, WORKER)
        assert owners.own(APP, "run-lease", OTHER_WORKER, ttl=OWNER_TTL).holder == OTHER_WORKER
