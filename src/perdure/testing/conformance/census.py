"""Conformance: census, the read that metrics take of an app's runs."""

from __future__ import annotations

from datetime import timedelta

from perdure.store import port
from perdure.testing import clock as clocks
from perdure.testing.conformance.harness import (
    APP,
    OTHER_APP,
    Suite,
    claim_run,
    new_run,
    start,
)


class CensusTests(Suite):
    """The conformance tests of census."""

    def test_census_of_an_app_without_runs_is_empty(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        found = store.census(APP)
        assert found == port.Census({}, None, clock.now())

    def test_census_counts_the_apps_runs_by_state(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        start(store)
        start(store)
        running = start(store)
        claim_run(store, running)
        store.create_run(new_run(app=OTHER_APP))
        found = store.census(APP)
        assert found.states == {"queued": 2, "running": 1}
        assert found.oldest_due is None
        assert store.census(OTHER_APP).states == {"queued": 1}

    def test_census_finds_the_most_overdue_waiting_run(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        soon, later, never = start(store), start(store), start(store)
        for run, wake in ((soon, 10), (later, 20)):
            claim = claim_run(store, run).claim
            assert store.park(claim, [], [], wake_at=clock.now() + timedelta(seconds=wake))
        claim = claim_run(store, never).claim
        assert store.park(claim, [], [port.WaitSpec("go", "signal")], wake_at=None)
        first = clock.now() + timedelta(seconds=10)
        # Nothing is due yet: no lag.
        assert store.census(APP) == port.Census({"waiting": 3}, None, clock.now())
        clock.advance(15)
        assert store.census(APP) == port.Census({"waiting": 3}, first, clock.now())
        clock.advance(10)
        assert store.census(APP).oldest_due == first
