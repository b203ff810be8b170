"""Conformance: sweep: deadlines with no worker running, records of ended runs, leases."""

from __future__ import annotations

from datetime import timedelta

from perdure.store import port
from perdure.testing import clock as clocks
from perdure.testing.conformance.harness import (
    APP,
    OTHER_WORKER,
    TTL,
    Suite,
    claim_run,
    entry,
    get,
    signaled,
    start,
)


class SweepTests(Suite):
    """The conformance tests of sweep: deadlines met with no worker, ended runs' records,
    leases further ahead than their TTL."""

    # == sweep =============================================================

    def test_sweep_times_out_expired_waits(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run = start(store)
        calm = start(store)
        claim = claim_run(store, run).claim
        calm_claim = claim_run(store, calm).claim
        deadline = clock.now() + timedelta(seconds=10)
        assert store.park(claim, [], [port.WaitSpec("approval", "signal", deadline)], wake_at=None)
        far = clock.now() + timedelta(hours=1)
        assert store.park(calm_claim, [], [port.WaitSpec("approval", "signal", far)], wake_at=None)
        assert store.sweep() == 0
        assert get(store, run.run_id).state == "waiting"
        clock.advance(11)
        assert store.sweep() >= 1
        [outcome] = store.outcomes(run.run_id)
        assert (outcome.name, outcome.outcome, outcome.payload, outcome.signal_id) == (
            "approval",
            "timed_out",
            None,
            None,
        )
        assert get(store, run.run_id).state == "queued"
        assert store.waits(APP, run.run_id) == []
        assert get(store, calm.run_id).state == "waiting"
        assert store.outcomes(calm.run_id) == []
        assert store.sweep() == 0
        assert store.journal(run.run_id) == []

    def test_sweep_requeues_waiting_runs_whose_time_came(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run = start(store)
        claim = claim_run(store, run).claim
        wake_at = clock.now() + timedelta(seconds=30)
        assert store.park(claim, [entry(1, kind="sleep")], [], wake_at=wake_at)
        assert store.sweep() == 0
        clock.advance(31)
        assert store.sweep() >= 1
        assert get(store, run.run_id).state == "queued"
        assert store.sweep() == 0

    def test_sweep_leaves_no_records_of_ended_runs_but_their_unapplied_signals(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run = start(store)
        claim = claim_run(store, run).claim
        assert store.send(port.NewMessage(run.run_id, "inbox", "m", "1"))
        now = clock.now()
        applied = signaled(run.run_id, "y", now, signal_id="sig-y")
        store.settle_wait(run.run_id, "x", signaled(run.run_id, "x", now))
        store.settle_wait(run.run_id, "y", applied)
        timed_out = port.Outcome(run.run_id, "z", "timed_out", None, None, None, now)
        store.settle_wait(run.run_id, "z", timed_out)
        child = port.Outcome(run.run_id, "child:c1", "signaled", None, '"r"', None, now)
        store.settle_wait(run.run_id, "child:c1", child)
        store.finish(claim, [entry(1, "ok", name="y", kind="wait")], state="succeeded", result="1")
        store.sweep()
        assert store.sweep() == 0
        # Only the signal the run never applied is kept, to answer its sender.
        assert [(o.name, o.signal_id) for o in store.outcomes(run.run_id)] == [("x", "sig-1")]
        assert store.waits(APP) == []
        assert store.next_message(run.run_id, "inbox", 0) is None

    # == leases under clock steps =========================================

    def test_sweep_pulls_a_lease_back_to_now_plus_its_ttl(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run = start(store)
        claimed = claim_run(store, run, lease_ttl=10)
        clock.step(-3600)  # the host's clock is set back an hour
        wanted = [(run.workflow, "1")]
        assert store.sweep() == 1
        held = get(store, run.run_id)
        assert held.lease_expires_at == clock.now() + timedelta(seconds=10)
        assert (held.generation, held.ledger_sequence, held.updated_at) == (
            claimed.run.generation,
            claimed.run.ledger_sequence,
            claimed.run.updated_at,
        )
        assert store.sweep() == 0
        clock.advance(9)
        assert store.claim(APP, OTHER_WORKER, wanted, lease_ttl=TTL) == []
        clock.advance(1)
        [recovered] = store.claim(APP, OTHER_WORKER, wanted, lease_ttl=TTL)
        assert (recovered.run.run_id, recovered.recovered) == (run.run_id, True)

    def test_sweep_keeps_leases_within_their_ttl(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run = start(store)
        claim = claim_run(store, run, lease_ttl=10).claim
        clock.advance(4)
        assert store.sweep() == 0
        assert get(store, run.run_id).lease_expires_at == claim.lease_expires_at
        # A live owner that renews after the step back is not touched either.
        clock.step(-3600)
        renewed = store.renew(claim, lease_ttl=10)
        assert renewed.lease_expires_at == clock.now() + timedelta(seconds=10)
        assert store.sweep() == 0
        assert get(store, run.run_id).lease_expires_at == renewed.lease_expires_at

    def test_sweep_clamps_to_the_ttl_of_the_latest_renewal(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run = start(store)
        claim = claim_run(store, run, lease_ttl=10).claim
        store.renew(claim, lease_ttl=20)
        clock.step(-3600)
        assert store.sweep() == 1
        assert get(store, run.run_id).lease_expires_at == clock.now() + timedelta(seconds=20)
