"""Conformance: suspend, unsuspend, let_go and expire_deadlines (perdure.store.controlport)."""

from __future__ import annotations

import dataclasses
import json
from datetime import timedelta

import pytest

from perdure import errors
from perdure.store import controlport, port
from perdure.testing import clock as clocks
from perdure.testing.conformance.harness import (
    APP,
    TTL,
    Suite,
    child_payload,
    claim_run,
    entry,
    get,
    kinds,
    new_run,
    signaled,
    start,
)


def _control(store: port.Store) -> controlport.ControlStore:
    return controlport.require(store)


def _claims(store: port.Store, run: port.Run) -> list[str]:
    found = store.claim(run.app, "worker-x", [(run.workflow, run.version)], lease_ttl=TTL)
    return [c.run.run_id for c in found]


class ControlTests(Suite):
    """The conformance tests of suspending and resuming runs, and of run deadlines."""

    # == suspend =============================================================

    def test_a_suspended_queued_run_is_not_claimed_until_resumed(self, store: port.Store) -> None:
        run = start(store)
        assert _control(store).suspend(run.run_id) == "suspended"
        assert _control(store).suspend(run.run_id) == "already"
        stored = get(store, run.run_id)
        assert (stored.state, stored.suspended_from) == ("suspended", "queued")
        assert _claims(store, run) == []
        assert _control(store).unsuspend(run.run_id) == "queued"
        assert get(store, run.run_id).suspended_from is None
        assert _claims(store, run) == [run.run_id]
        assert kinds(store, run.run_id)[-3:] == ["suspended", "resumed", "claimed"]

    def test_a_signal_to_a_suspended_waiting_run_is_kept_for_its_resume(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run = start(store)
        claim = claim_run(store, run).claim
        deadline = clock.now() + timedelta(seconds=30)
        assert store.park(claim, [], [port.WaitSpec("go", "signal", deadline)], wake_at=None)
        assert _control(store).suspend(run.run_id) == "suspended"
        _, created = store.settle_wait(run.run_id, "go", signaled(run.run_id, "go", clock.now()))
        assert created
        assert get(store, run.run_id).state == "suspended"
        assert _claims(store, run) == []
        assert _control(store).unsuspend(run.run_id) == "queued"
        [outcome] = store.outcomes(run.run_id)
        assert outcome.outcome == "signaled"

    def test_a_suspended_runs_deadlines_are_kept_and_fire_after_resume(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        sleeper, waiter = start(store), start(store)
        sleep_claim = claim_run(store, sleeper).claim
        wait_claim = claim_run(store, waiter).claim
        due = clock.now() + timedelta(seconds=10)
        assert store.park(sleep_claim, [entry(1, kind="sleep")], [], wake_at=due)
        assert store.park(wait_claim, [], [port.WaitSpec("go", "signal", due)], wake_at=None)
        for run in (sleeper, waiter):
            assert _control(store).suspend(run.run_id) == "suspended"
        clock.advance(60)
        # Due timers of suspended runs are neither fired nor counted as work,
        # sweep after sweep: they wait for the resume.
        assert store.sweep() == 0
        assert store.sweep() == 0
        for run in (sleeper, waiter):
            stored = get(store, run.run_id)
            assert (stored.state, stored.ready_at) == ("suspended", due)
            assert _claims(store, run) == []
        # Nothing fired while suspended: the wait is still open.
        assert store.outcomes(waiter.run_id) == []
        assert [w.name for w in store.waits(APP, waiter.run_id)] == ["go"]
        # Resumed, a passed deadline makes the run claimable at once.
        assert _control(store).unsuspend(sleeper.run_id) == "queued"
        assert _claims(store, sleeper) == [sleeper.run_id]
        assert _control(store).unsuspend(waiter.run_id) == "queued"
        assert _claims(store, waiter) == [waiter.run_id]

    def test_a_resumed_run_whose_deadline_is_ahead_waits_again(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run = start(store)
        claim = claim_run(store, run).claim
        due = clock.now() + timedelta(seconds=100)
        assert store.park(claim, [entry(1, kind="sleep")], [], wake_at=due)
        assert _control(store).suspend(run.run_id) == "suspended"
        clock.advance(10)
        assert _control(store).unsuspend(run.run_id) == "waiting"
        assert get(store, run.run_id).ready_at == due
        assert _claims(store, run) == []
        clock.advance(100)
        assert _claims(store, run) == [run.run_id]

    def test_a_running_run_is_suspended_at_its_owners_next_write(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run = start(store)
        claim = claim_run(store, run).claim
        assert _control(store).suspend(run.run_id) == "requested"
        assert _control(store).suspend(run.run_id) == "already"
        assert get(store, run.run_id).suspend_requested
        # The step in flight keeps its lease.
        claim = store.renew(claim, lease_ttl=TTL)
        with pytest.raises(errors.Suspended):
            store.finish_step(claim, [entry(1)])
        assert store.journal(run.run_id) == []
        marks = [port.Mark("step_completed", "step-1")]
        assert _control(store).let_go(claim, [entry(1)], marks, reset=True) is True
        stored = get(store, run.run_id)
        assert (stored.state, stored.suspended_from, stored.suspend_requested) == (
            "suspended",
            "queued",
            False,
        )
        assert (stored.worker, stored.lease_expires_at) == (None, None)
        assert [e.position for e in store.journal(run.run_id)] == [1]
        assert kinds(store, run.run_id)[-3:] == ["suspend_requested", "step_completed", "suspended"]
        with pytest.raises(errors.Suspended):
            store.renew(claim, lease_ttl=TTL)
        assert _claims(store, run) == []
        assert _control(store).unsuspend(run.run_id) == "queued"
        again = claim_run(store, run)
        assert again.claim.generation == claim.generation + 1
        assert [e.position for e in again.journal] == [1]

    def test_a_suspend_withdrawn_before_the_owner_took_it_lets_the_run_go_on(
        self, store: port.Store
    ) -> None:
        run = start(store)
        claim = claim_run(store, run).claim
        assert _control(store).suspend(run.run_id) == "requested"
        assert _control(store).unsuspend(run.run_id) == "running"
        store.finish_step(claim, [entry(1)])
        assert _control(store).suspend(run.run_id) == "requested"
        with pytest.raises(errors.Suspended):
            store.begin_effect(claim, [entry(2, "started")])
        assert _control(store).unsuspend(run.run_id) == "running"
        # A let_go that finds the suspend withdrawn only records.
        assert _control(store).let_go(claim, [entry(2)]) is False
        stored = get(store, run.run_id)
        assert (stored.state, stored.worker) == ("running", claim.worker)
        assert [e.position for e in store.journal(run.run_id)] == [1, 2]
        store.finish(claim, [], state="succeeded", result="1")

    def test_a_release_gives_a_run_asked_to_suspend_back_suspended(self, store: port.Store) -> None:
        run = start(store)
        claim = claim_run(store, run).claim
        assert _control(store).suspend(run.run_id) == "requested"
        store.release(claim, delay=0, failed=False)
        stored = get(store, run.run_id)
        assert (stored.state, stored.suspended_from, stored.suspend_requested) == (
            "suspended",
            "queued",
            False,
        )
        assert _claims(store, run) == []

    def test_a_cancel_ends_a_suspended_run_and_wins_over_a_suspend(self, store: port.Store) -> None:
        suspended, running = start(store), start(store)
        assert _control(store).suspend(suspended.run_id) == "suspended"
        assert store.request_cancel(suspended.run_id) is True
        assert get(store, suspended.run_id).state == "canceled"
        claim = claim_run(store, running).claim
        assert _control(store).suspend(running.run_id) == "requested"
        assert store.request_cancel(running.run_id) is True
        with pytest.raises(errors.Canceled):
            store.finish_step(claim, [entry(1)])
        with pytest.raises(errors.Canceled):
            _control(store).let_go(claim, [entry(1)])
        canceling = dataclasses.replace(claim, canceling=True)
        store.finish_step(canceling, [entry(1)])
        store.finish(canceling, [], state="canceled")
        assert get(store, running.run_id).state == "canceled"

    def test_suspend_refuses_ended_runs_and_runs_that_need_attention(
        self, store: port.Store
    ) -> None:
        done, stuck = start(store), start(store)
        store.finish(claim_run(store, done).claim, [], state="succeeded", result="1")
        store.finish(claim_run(store, stuck).claim, [], state="needs_attention", error="{}")
        for run in (done, stuck):
            with pytest.raises(errors.RunFinished):
                _control(store).suspend(run.run_id)
        with pytest.raises(errors.RunFinished):
            _control(store).unsuspend(done.run_id)
        with pytest.raises(errors.RunNotFound):
            _control(store).suspend("no-such-run")
        assert _control(store).unsuspend(start(store).run_id) is None

    def test_a_child_that_ends_while_its_parent_is_suspended_reports_to_it(
        self, store: port.Store
    ) -> None:
        parent = start(store)
        parent_claim = claim_run(store, parent).claim
        [child] = store.create_children(parent_claim, [new_run(key="c", parent_id=parent.run_id)])
        name = f"child:{child.run_id}"
        assert store.park(parent_claim, [], [port.WaitSpec(name, "child")], wake_at=None)
        assert _control(store).suspend(parent.run_id) == "suspended"
        store.finish(claim_run(store, child).claim, [], state="succeeded", result="7")
        assert get(store, parent.run_id).state == "suspended"
        [outcome] = store.outcomes(parent.run_id)
        assert child_payload(outcome)["state"] == "succeeded"
        assert _control(store).unsuspend(parent.run_id) == "queued"

    # == run deadlines ========================================================

    def test_runs_past_their_deadline_are_canceled_with_deadline_exceeded(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        deadline = clock.now() + timedelta(seconds=10)
        queued, _ = store.create_run(dataclasses.replace(new_run(), deadline=deadline))
        sleeper, _ = store.create_run(dataclasses.replace(new_run(), deadline=deadline))
        running, _ = store.create_run(dataclasses.replace(new_run(), deadline=deadline))
        calm = start(store)
        assert get(store, queued.run_id).deadline == deadline
        sleep_claim = claim_run(store, sleeper).claim
        assert store.park(sleep_claim, [], [], wake_at=clock.now() + timedelta(hours=1))
        assert _control(store).suspend(sleeper.run_id) == "suspended"
        run_claim = claim_run(store, running).claim
        [child] = store.create_children(run_claim, [new_run(key="c", parent_id=running.run_id)])
        assert _control(store).expire_deadlines() == 0
        clock.advance(11)
        assert _control(store).expire_deadlines(app="another-app") == 0
        assert _control(store).expire_deadlines(run_id=queued.run_id) == 1
        assert store.sweep() >= 2
        for run in (queued, sleeper):
            stored = get(store, run.run_id)
            assert stored.state == "canceled"
            assert json.loads(stored.error or "{}")["code"] == controlport.DEADLINE_EXCEEDED
        stored = get(store, running.run_id)
        assert (stored.state, stored.cancel_requested, stored.error) == ("running", True, None)
        # Descendants are canceled as by request_cancel.
        assert get(store, child.run_id).state == "canceled"
        assert get(store, calm.run_id).state == "queued"
        with pytest.raises(errors.Canceled):
            store.finish_step(run_claim, [entry(1)])
        # Each run is expired once.
        assert _control(store).expire_deadlines() == 0
