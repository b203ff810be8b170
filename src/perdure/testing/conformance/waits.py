"""Conformance: park, wake, settle_wait and waits(): waits and their outcome records."""

from __future__ import annotations

import dataclasses
import functools
import json
import uuid
from datetime import timedelta

import pytest

from perdure import errors
from perdure.store import port
from perdure.testing import clock as clocks
from perdure.testing.conformance.harness import (
    APP,
    OTHER_APP,
    TTL,
    WORKER,
    StoreHandle,
    Suite,
    claim_run,
    entry,
    get,
    kinds,
    new_run,
    run_threads,
    signaled,
    snapshot,
    start,
)


class WaitTests(Suite):
    """The conformance tests of park, wake, settle_wait and waits()."""

    # == park and wake =====================================================

    def test_park_registers_waits_and_makes_the_run_waiting(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run = start(store)
        claim = claim_run(store, run).claim
        clock.advance(1)
        deadline = clock.now() + timedelta(seconds=50)
        waits = [port.WaitSpec("approval", "signal", deadline), port.WaitSpec("inbox", "channel")]
        parked = store.park(claim, [entry(1)], waits, wake_at=clock.now() + timedelta(seconds=100))
        assert parked is True
        after = get(store, run.run_id)
        assert (after.state, after.worker, after.lease_expires_at) == ("waiting", None, None)
        assert after.ready_at == deadline
        assert store.journal(run.run_id) == [entry(1)]
        assert set(store.waits(APP, run.run_id)) == {
            port.WaitRecord(run.run_id, APP, "approval", "signal", deadline, clock.now()),
            port.WaitRecord(run.run_id, APP, "inbox", "channel", None, clock.now()),
        }
        assert kinds(store, run.run_id)[-1] == "parked"

    def test_park_replaces_earlier_registrations(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run = start(store)
        claim = claim_run(store, run).claim
        first = [port.WaitSpec("a", "signal"), port.WaitSpec("b", "signal")]
        assert store.park(claim, [], first, wake_at=None)
        clock.advance(5)
        assert store.wake(run.run_id)
        claim = claim_run(store, run).claim
        second = [port.WaitSpec("b", "signal"), port.WaitSpec("c", "signal")]
        assert store.park(claim, [], second, wake_at=None)
        found = store.waits(APP, run.run_id)
        assert [w.name for w in found] == ["b", "c"]
        assert found[0].created_at < found[1].created_at  # b kept its first registration

    def test_park_without_deadline_has_no_ready_at(self, store: port.Store) -> None:
        run = start(store)
        claim = claim_run(store, run).claim
        assert store.park(claim, [], [port.WaitSpec("go", "signal")], wake_at=None) is True
        assert get(store, run.run_id).ready_at is None

    def test_wake_is_conditional_on_waiting(self, store: port.Store) -> None:
        run = start(store)
        assert store.wake(run.run_id) is False
        claim = claim_run(store, run).claim
        assert store.wake(run.run_id) is False
        assert get(store, run.run_id).state == "running"
        assert store.park(claim, [], [port.WaitSpec("go", "signal")], wake_at=None) is True
        assert store.wake(run.run_id) is True
        assert get(store, run.run_id).state == "queued"
        assert store.wake(run.run_id) is False
        again = claim_run(store, run)
        assert again.claim.generation == 2
        store.finish(again.claim, [], state="succeeded", result="1")
        assert store.wake(run.run_id) is False
        assert get(store, run.run_id).state == "succeeded"

    def _assert_not_parked(
        self, store: port.Store, claimed: port.Claimed, entries: list[port.JournalEntry]
    ) -> None:
        run_id = claimed.run.run_id
        after = get(store, run_id)
        assert (after.state, after.generation, after.worker) == ("running", 1, WORKER)
        assert store.journal(run_id) == entries
        assert "parked" not in kinds(store, run_id)
        store.renew(claimed.claim, lease_ttl=TTL)
        store.finish_step(claimed.claim, [entry(len(entries) + 1)])

    def test_outcome_recorded_before_park_keeps_the_run(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run = start(store)
        claimed = claim_run(store, run)
        stored, created = store.settle_wait(
            run.run_id, "approval", signaled(run.run_id, "approval", clock.now())
        )
        assert created
        assert get(store, run.run_id).state == "running"
        entries = [entry(1, kind="wait", name="approval")]
        parked = store.park(
            claimed.claim, entries, [port.WaitSpec("approval", "signal")], wake_at=None
        )
        assert parked is False
        self._assert_not_parked(store, claimed, entries)
        assert store.outcomes(run.run_id) == [stored]

    def test_message_sent_before_park_keeps_the_run(self, store: port.Store) -> None:
        run = start(store)
        claimed = claim_run(store, run)
        assert store.send(port.NewMessage(run.run_id, "inbox", "m1", '"hi"')) is True
        first = store.next_message(run.run_id, "inbox", 0)
        assert first is not None
        waits = [port.WaitSpec("inbox", "channel", after_sequence=0)]
        entries = [entry(1, kind="receive", name="inbox")]
        assert store.park(claimed.claim, entries, waits, wake_at=None) is False
        self._assert_not_parked(store, claimed, entries)
        consumed = [port.WaitSpec("inbox", "channel", after_sequence=first.sequence)]
        assert store.park(claimed.claim, [], consumed, wake_at=None) is True
        assert get(store, run.run_id).state == "waiting"

    @pytest.mark.parametrize("due", ["wake_at_now", "wake_at_past", "deadline_past"])
    def test_due_instant_at_park_keeps_the_run(
        self, store: port.Store, clock: clocks.FakeClock, due: str
    ) -> None:
        run = start(store)
        claimed = claim_run(store, run)
        clock.advance(10)
        now = clock.now()
        entries = [entry(1, kind="sleep")]
        if due == "deadline_past":
            waits = [port.WaitSpec("approval", "signal", deadline=now - timedelta(seconds=1))]
            parked = store.park(claimed.claim, entries, waits, wake_at=None)
        else:
            wake_at = now if due == "wake_at_now" else now - timedelta(seconds=5)
            parked = store.park(claimed.claim, entries, [], wake_at=wake_at)
        assert parked is False
        self._assert_not_parked(store, claimed, entries)

    def test_finished_child_before_park_keeps_the_run(self, store: port.Store) -> None:
        parent = start(store)
        claimed = claim_run(store, parent)
        [child] = store.create_children(claimed.claim, [new_run(key="c", parent_id=parent.run_id)])
        child_claim = claim_run(store, child).claim
        store.finish(child_claim, [], state="succeeded", result='"done"')
        name = f"child:{child.run_id}"
        entries = [entry(1, kind="child", name=name)]
        parked = store.park(claimed.claim, entries, [port.WaitSpec(name, "child")], wake_at=None)
        assert parked is False
        self._assert_not_parked(store, claimed, entries)

    def test_settle_wait_after_park_wakes_the_run(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run = start(store)
        claim = claim_run(store, run).claim
        assert store.park(claim, [], [port.WaitSpec("approval", "signal")], wake_at=None)
        clock.advance(1)
        stored, created = store.settle_wait(
            run.run_id, "approval", signaled(run.run_id, "approval", clock.now())
        )
        assert created
        assert stored == signaled(run.run_id, "approval", clock.now())
        woken = get(store, run.run_id)
        assert woken.state == "queued"
        assert kinds(store, run.run_id)[-2:] == ["parked", "woken"]
        assert store.waits(APP, run.run_id) == []
        assert store.journal(run.run_id) == []

    def test_send_after_park_wakes_a_run_waiting_on_that_channel(self, store: port.Store) -> None:
        run = start(store)
        claim = claim_run(store, run).claim
        waits = [port.WaitSpec("a", "channel")]
        assert store.park(claim, [], waits, wake_at=None) is True
        assert store.send(port.NewMessage(run.run_id, "ab", "m1", "1")) is True
        assert store.send(port.NewMessage(run.run_id, "other", "m1", "1")) is True
        assert get(store, run.run_id).state == "waiting"
        assert store.send(port.NewMessage(run.run_id, "a", "m1", "2")) is True
        assert get(store, run.run_id).state == "queued"
        assert store.journal(run.run_id) == []

    def test_park_racing_settle_wait_never_loses_the_wake(
        self, handle: StoreHandle, clock: clocks.FakeClock
    ) -> None:
        store, other = handle.store, handle.reopen()
        for _ in range(8):
            run = start(store)
            claimed = claim_run(store, run)
            waits = [port.WaitSpec("go", "signal")]
            outcome = signaled(run.run_id, "go", clock.now())
            parked, (_, created) = run_threads(
                [
                    functools.partial(store.park, claimed.claim, [], waits, wake_at=None),
                    functools.partial(other.settle_wait, run.run_id, "go", outcome),
                ]
            )
            assert created is True
            after = get(store, run.run_id)
            assert after.state == ("queued" if parked else "running"), (parked, after.state)

    def test_park_racing_send_never_loses_the_wake(self, handle: StoreHandle) -> None:
        store, other = handle.store, handle.reopen()
        for _ in range(8):
            run = start(store)
            claimed = claim_run(store, run)
            waits = [port.WaitSpec("inbox", "channel")]
            message = port.NewMessage(run.run_id, "inbox", "m", "1")
            parked, sent = run_threads(
                [
                    functools.partial(store.park, claimed.claim, [], waits, wake_at=None),
                    functools.partial(other.send, message),
                ]
            )
            assert sent is True
            after = get(store, run.run_id)
            assert after.state == ("queued" if parked else "running"), (parked, after.state)

    # == settle_wait =======================================================

    def test_settle_wait_is_put_if_absent(self, store: port.Store, clock: clocks.FakeClock) -> None:
        run = start(store)
        first = signaled(run.run_id, "approval", clock.now(), signal_id="s1", payload="1")
        stored, created = store.settle_wait(run.run_id, "approval", first)
        assert (stored, created) == (first, True)
        clock.advance(1)
        later = signaled(run.run_id, "approval", clock.now(), signal_id="s2", payload="2")
        assert store.settle_wait(run.run_id, "approval", later) == (first, False)
        timeout = dataclasses.replace(later, outcome="timed_out", signal_id=None, payload=None)
        assert store.settle_wait(run.run_id, "approval", timeout) == (first, False)
        assert store.outcomes(run.run_id) == [first]
        assert get(store, run.run_id).state == "queued"
        assert store.journal(run.run_id) == []

    def test_concurrent_settle_wait_has_exactly_one_winner(
        self, handle: StoreHandle, clock: clocks.FakeClock
    ) -> None:
        store = handle.store
        run = start(store)
        claim = claim_run(store, run).claim
        assert store.park(claim, [], [port.WaitSpec("approval", "signal")], wake_at=None)
        kinds_cycle: list[port.OutcomeKind] = ["signaled", "timed_out", "canceled"]
        candidates = []
        for i in range(self.thread_count):
            kind = kinds_cycle[i % 3]
            candidates.append(
                port.Outcome(
                    run_id=run.run_id,
                    name="approval",
                    outcome=kind,
                    signal_id=f"sig-{i}" if kind == "signaled" else None,
                    payload=json.dumps({"i": i}) if kind == "signaled" else None,
                    payload_digest=f"d-{i}" if kind == "signaled" else None,
                    at=clock.now(),
                )
            )
        stores = [handle.reopen() for _ in candidates]
        results = run_threads(
            [
                functools.partial(s.settle_wait, run.run_id, "approval", o)
                for s, o in zip(stores, candidates, strict=True)
            ]
        )
        assert sum(created for _, created in results) == 1
        winner = next(stored for stored, created in results if created)
        assert winner in candidates
        assert all(stored == winner for stored, _ in results)
        assert store.outcomes(run.run_id) == [winner]
        assert get(store, run.run_id).state == "queued"
        assert kinds(store, run.run_id).count("woken") == 1

    def test_signal_after_deadline_is_stored_as_timed_out(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run = start(store)
        claim = claim_run(store, run).claim
        deadline = clock.now() + timedelta(seconds=10)
        waits = [port.WaitSpec("approval", "signal", deadline)]
        assert store.park(claim, [], waits, wake_at=None) is True
        clock.advance(11)
        stored, created = store.settle_wait(
            run.run_id, "approval", signaled(run.run_id, "approval", clock.now())
        )
        assert created is True
        assert (stored.run_id, stored.name, stored.outcome) == (run.run_id, "approval", "timed_out")
        assert stored.payload is None
        assert store.outcomes(run.run_id) == [stored]
        assert get(store, run.run_id).state == "queued"
        late = signaled(run.run_id, "approval", clock.now(), signal_id="s2")
        assert store.settle_wait(run.run_id, "approval", late) == (stored, False)

    def test_signal_before_deadline_is_stored_as_sent(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run = start(store)
        claim = claim_run(store, run).claim
        deadline = clock.now() + timedelta(seconds=10)
        assert store.park(claim, [], [port.WaitSpec("approval", "signal", deadline)], wake_at=None)
        clock.advance(9)
        sent = signaled(run.run_id, "approval", clock.now())
        assert store.settle_wait(run.run_id, "approval", sent) == (sent, True)

    def test_settle_wait_refusals(self, store: port.Store, clock: clocks.FakeClock) -> None:
        missing = str(uuid.uuid4())
        with pytest.raises(errors.RunNotFound) as not_found:
            store.settle_wait(missing, "w", signaled(missing, "w", clock.now()))
        assert not_found.value.run_id == missing
        run = start(store)
        claim = claim_run(store, run).claim
        store.finish(claim, [], state="succeeded", result="1")
        before = snapshot(store)
        with pytest.raises(errors.RunFinished) as finished:
            store.settle_wait(run.run_id, "w", signaled(run.run_id, "w", clock.now()))
        assert (finished.value.run_id, finished.value.state) == (run.run_id, "succeeded")
        assert snapshot(store) == before

    def test_settle_wait_on_running_run_does_not_wake_it(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run = start(store)
        claimed = claim_run(store, run)
        outcome = signaled(run.run_id, "later", clock.now())
        assert store.settle_wait(run.run_id, "later", outcome) == (outcome, True)
        after = get(store, run.run_id)
        assert (after.state, after.generation, after.worker) == ("running", 1, WORKER)
        assert "woken" not in kinds(store, run.run_id)
        store.renew(claimed.claim, lease_ttl=TTL)

    # == waits() ===========================================================

    def test_waits_lists_open_waits_by_app_and_run(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        first, second = start(store), start(store)
        elsewhere = start(store, app=OTHER_APP)
        records = []
        for run, name in ((first, "a"), (second, "b"), (elsewhere, "c")):
            claim = claim_run(store, run).claim
            deadline = clock.now() + timedelta(hours=1)
            assert store.park(claim, [], [port.WaitSpec(name, "signal", deadline)], wake_at=None)
            records.append(
                port.WaitRecord(run.run_id, run.app, name, "signal", deadline, clock.now())
            )
            clock.advance(1)
        assert store.waits(APP) == records[:2]
        assert store.waits(APP, second.run_id) == [records[1]]
        assert store.waits(APP, elsewhere.run_id) == []
        assert store.waits(OTHER_APP) == [records[2]]
        store.settle_wait(first.run_id, "a", signaled(first.run_id, "a", clock.now()))
        assert store.waits(APP) == [records[1]]
