"""Conformance: apps and timers, the read-only views for operators."""

from __future__ import annotations

from datetime import timedelta

from perdure.store import port
from perdure.testing import clock as clocks
from perdure.testing.conformance.harness import (
    APP,
    OTHER_APP,
    Suite,
    claim_run,
    entry,
    get,
    start,
)


class OverviewTests(Suite):
    """The conformance tests of apps and timers."""

    # == apps ==============================================================

    def test_apps_lists_each_app_with_runs_once_sorted(self, store: port.Store) -> None:
        assert store.apps() == []
        start(store, app=OTHER_APP)
        start(store)
        start(store)
        assert store.apps() == sorted([APP, OTHER_APP])

    # == timers ============================================================

    def test_a_sleeping_run_is_a_sleep_timer_until_claimed(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run = start(store)
        claimed = claim_run(store, run)
        due = clock.now() + timedelta(days=1)
        assert store.park(claimed.claim, [entry(1, kind="sleep", name="sleep")], [], wake_at=due)
        before = store.history(run.run_id)
        assert store.timers(APP) == [port.Timer(run.run_id, APP, "sleep", due, run.workflow)]
        assert store.timers(APP, run.run_id) == store.timers(APP)
        assert store.timers(OTHER_APP) == []
        # Due but not claimed yet: still listed, so it is never invisible.
        clock.advance(days=2)
        assert [t.run_id for t in store.timers(APP)] == [run.run_id]
        assert store.history(run.run_id) == before  # listing writes nothing
        claim_run(store, get(store, run.run_id))
        assert store.timers(APP) == []

    def test_a_run_waiting_on_a_signal_is_not_a_timer(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run = start(store)
        claimed = claim_run(store, run)
        waits = [port.WaitSpec("go", "signal", clock.now() + timedelta(hours=1))]
        assert store.park(claimed.claim, [], waits, wake_at=None)
        assert store.timers(APP) == []
        assert [w.name for w in store.waits(APP)] == ["go"]

    def test_a_queued_run_held_back_is_a_timer_until_due(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run = start(store)
        ready = start(store)
        claimed = claim_run(store, run)
        store.release(claimed.claim, delay=30, failed=True)
        due = get(store, run.run_id).ready_at
        assert due is not None
        assert store.timers(APP) == [port.Timer(run.run_id, APP, "timer", due, run.workflow)]
        assert store.timers(APP, ready.run_id) == []
        clock.advance(31)
        assert store.timers(APP) == []  # claimable now: an ordinary queued run
