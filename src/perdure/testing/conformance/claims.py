"""Conformance: claim, the fence on every claimed-run write, renew and release."""

from __future__ import annotations

import dataclasses
import functools
from datetime import timedelta

import pytest

from perdure import errors
from perdure.store import port
from perdure.testing import clock as clocks
from perdure.testing.conformance.harness import (
    APP,
    FENCED_WRITES,
    FINISHES,
    OTHER_APP,
    OTHER_WORKER,
    SETTLES_CANCELED,
    TTL,
    WORKER,
    StoreHandle,
    Suite,
    claim_in_process,
    claim_run,
    entry,
    get,
    kinds,
    new_run,
    run_processes,
    run_threads,
    signaled,
    snapshot,
    start,
)


class ClaimTests(Suite):
    """The conformance tests of claim, the fence on every claimed-run write, renew and release."""

    # == claim =============================================================

    def test_claim_takes_only_ready_runs_of_the_app_and_listed_workflows(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        target = start(store, workflow="wf", version="1")
        start(store, workflow="wf", version="2")
        start(store, workflow="other", version="1")
        start(store, app=OTHER_APP, workflow="wf", version="1")
        claimed = store.claim(APP, WORKER, [("wf", "1")], lease_ttl=TTL, limit=10)
        assert [c.run.run_id for c in claimed] == [target.run_id]
        got = claimed[0]
        assert got.claim == port.Claim(
            run_id=target.run_id,
            worker=WORKER,
            generation=1,
            lease_expires_at=clock.now() + timedelta(seconds=TTL),
        )
        assert (got.run.state, got.run.worker, got.run.generation) == ("running", WORKER, 1)
        assert got.run.lease_expires_at == got.claim.lease_expires_at
        assert (got.journal, got.outcomes, got.recovered) == ([], [], False)
        assert get(store, target.run_id) == got.run
        assert store.claim(APP, WORKER, [("wf", "1")], lease_ttl=TTL, limit=10) == []
        assert store.claim(APP, WORKER, [], lease_ttl=TTL, limit=10) == []

    def test_claim_respects_limit(self, store: port.Store) -> None:
        ids = {start(store, workflow="wf").run_id for _ in range(5)}
        first = store.claim(APP, WORKER, [("wf", "1")], lease_ttl=TTL, limit=3)
        second = store.claim(APP, WORKER, [("wf", "1")], lease_ttl=TTL, limit=3)
        assert (len(first), len(second)) == (3, 2)
        assert {c.run.run_id for c in first + second} == ids
        assert store.claim(APP, WORKER, [("wf", "1")], lease_ttl=TTL, limit=3) == []

    def test_claim_appends_claimed_receipt(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run = start(store)
        clock.advance(2)
        claim_run(store, run)
        history = store.history(run.run_id)
        assert [(r.sequence, r.kind) for r in history] == [(1, "initialized"), (2, "claimed")]
        assert (history[1].generation, history[1].worker, history[1].at) == (
            1,
            WORKER,
            clock.now(),
        )
        assert get(store, run.run_id).ledger_sequence == 2

    def test_concurrent_claims_take_each_run_once(self, handle: StoreHandle) -> None:
        ids = {start(handle.store, workflow="wf").run_id for _ in range(24)}
        stores = [handle.reopen() for _ in range(self.thread_count)]

        def drain(s: port.Store) -> list[tuple[str, int]]:
            got: list[tuple[str, int]] = []
            while claimed := s.claim(APP, WORKER, [("wf", "1")], lease_ttl=TTL, limit=2):
                got.extend((c.run.run_id, c.claim.generation) for c in claimed)
            return got

        results = run_threads([functools.partial(drain, s) for s in stores])
        taken = [pair for got in results for pair in got]
        assert sorted(run_id for run_id, _ in taken) == sorted(ids)
        assert {generation for _, generation in taken} == {1}
        assert {r.state for r in handle.store.list_runs(APP)} == {"running"}

    def test_claims_from_several_processes_take_each_run_once(
        self, handle: StoreHandle, clock: clocks.FakeClock
    ) -> None:
        if not self.processes:
            pytest.skip("this adapter is not tested across processes")
        ids = {start(handle.store, workflow="wf").run_id for _ in range(30)}
        common = (handle.opener, handle.url, clock.now(), handle.ledger_limit)
        results = run_processes(
            claim_in_process,
            [(*common, APP, [("wf", "1")], f"proc-{i}") for i in range(3)],
        )
        taken = [pair for (got, _) in results for pair in got]
        assert sorted(run_id for run_id, _ in taken) == sorted(ids)
        assert {generation for _, generation in taken} == {1}

    def test_claim_takes_runs_in_the_order_they_became_ready(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        first = start(store, workflow="wf")
        clock.advance(1)
        second = start(store, workflow="wf")
        claim = claim_run(store, first).claim
        store.release(claim, delay=10, failed=True)
        taken = store.claim(APP, WORKER, [("wf", "1")], lease_ttl=TTL, limit=5)
        assert [c.run.run_id for c in taken] == [second.run_id]
        clock.advance(10)
        [again] = store.claim(APP, WORKER, [("wf", "1")], lease_ttl=TTL)
        assert (again.run.run_id, again.run.failures, again.run.generation) == (first.run_id, 1, 2)

    def test_generation_grows_by_one_per_claim(self, store: port.Store) -> None:
        run = start(store)
        for expected in (1, 2, 3):
            claimed = claim_run(store, run)
            assert claimed.claim.generation == expected
            assert claimed.run.generation == expected
            store.release(claimed.claim, delay=0, failed=False)
        generations = [r.generation for r in store.history(run.run_id) if r.kind == "claimed"]
        assert generations == [1, 2, 3]

    def test_lapsed_lease_is_recovered_by_the_next_claim(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run = start(store)
        first = claim_run(store, run, lease_ttl=10)
        clock.advance(9)
        assert store.claim(APP, OTHER_WORKER, [(run.workflow, "1")], lease_ttl=TTL) == []
        clock.advance(2)
        again = claim_run(store, run, worker=OTHER_WORKER)
        assert again.recovered is True
        assert again.claim.generation == first.claim.generation + 1 == 2
        assert (again.run.state, again.run.worker, again.run.failures) == (
            "running",
            OTHER_WORKER,
            1,
        )
        assert again.claim.lease_expires_at == clock.now() + timedelta(seconds=TTL)
        assert kinds(store, run.run_id) == ["initialized", "claimed", "recovered"]
        recovered = store.history(run.run_id)[-1]
        assert (recovered.generation, recovered.worker) == (2, OTHER_WORKER)
        clock.advance(TTL + 1)
        third = claim_run(store, run)
        assert (third.recovered, third.run.failures, third.claim.generation) == (True, 2, 3)

    def test_next_lapse_is_the_earliest_lease_of_the_apps_running_runs_to_come(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        assert store.next_lapse(APP) is None
        start(store)  # queued: holds no lease
        short = claim_run(store, start(store, workflow="short"), lease_ttl=10)
        claim_run(store, start(store, workflow="long"), lease_ttl=20)
        claim_run(store, start(store, app=OTHER_APP, workflow="other"), lease_ttl=5)
        assert store.next_lapse(APP) == short.claim.lease_expires_at
        assert store.next_lapse(OTHER_APP) == clock.now() + timedelta(seconds=5)
        clock.advance(11)
        # Lapsed already: a claim may recover it now; the next to lapse is the other.
        assert store.next_lapse(APP) == clock.now() + timedelta(seconds=9)
        clock.advance(10)
        assert store.next_lapse(APP) is None

    def test_queued_run_with_future_ready_at_waits_for_the_clock(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run = start(store)
        claimed = claim_run(store, run)
        store.release(claimed.claim, delay=60, failed=False)
        assert get(store, run.run_id).ready_at == clock.now() + timedelta(seconds=60)
        assert store.claim(APP, WORKER, [(run.workflow, "1")], lease_ttl=TTL) == []
        clock.advance(59)
        assert store.claim(APP, WORKER, [(run.workflow, "1")], lease_ttl=TTL) == []
        clock.advance(2)
        again = claim_run(store, run)
        assert (again.recovered, again.claim.generation) == (False, 2)

    def test_waiting_run_is_claimable_once_its_ready_at_passes(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run = start(store)
        claimed = claim_run(store, run)
        wake_at = clock.now() + timedelta(seconds=100)
        assert store.park(claimed.claim, [entry(1, kind="sleep")], [], wake_at=wake_at) is True
        assert store.claim(APP, WORKER, [(run.workflow, "1")], lease_ttl=TTL) == []
        clock.advance(101)
        again = claim_run(store, run)
        assert (again.recovered, again.claim.generation, again.run.failures) == (False, 2, 0)
        assert again.journal == [entry(1, kind="sleep")]
        assert kinds(store, run.run_id)[-1] == "claimed"

    def test_claimed_carries_journal_and_outcomes(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run = start(store)
        first = claim_run(store, run)
        entries = [entry(1), entry(2, name="approval", kind="wait")]
        assert store.park(first.claim, entries, [port.WaitSpec("approval", "signal")], wake_at=None)
        stored, created = store.settle_wait(
            run.run_id, "approval", signaled(run.run_id, "approval", clock.now())
        )
        assert created
        again = claim_run(store, run)
        assert again.journal == entries
        assert again.outcomes == [stored]
        assert again.run.state == "running"

    def test_a_first_claim_carries_what_came_before_it(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        # A run created with a journal, and signaled before anyone claimed it.
        entries = [entry(1), entry(2, "started", name="approval", kind="wait")]
        run, _ = store.create_run(new_run(), entries)
        stored, created = store.settle_wait(
            run.run_id, "approval", signaled(run.run_id, "approval", clock.now())
        )
        assert created
        bare = start(store, workflow=run.workflow)
        claimed = {
            c.run.run_id: c
            for c in store.claim(APP, WORKER, [(run.workflow, run.version)], lease_ttl=TTL, limit=5)
        }
        assert set(claimed) == {run.run_id, bare.run_id}
        assert (claimed[run.run_id].journal, claimed[run.run_id].outcomes) == (entries, [stored])
        assert (claimed[bare.run_id].journal, claimed[bare.run_id].outcomes) == ([], [])

    # == a journal the claimer holds =====================================

    def _woken_at_generation_one(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> tuple[port.Run, list[port.JournalEntry], port.Outcome]:
        """Return a run parked by its first claim and woken since, its journal and outcome."""
        run = start(store)
        first = claim_run(store, run)
        # As the engine parks: the wait's entry stays started until it is met.
        entries = [entry(1), entry(2, "started", name="approval", kind="wait")]
        assert store.park(first.claim, entries, [port.WaitSpec("approval", "signal")], wake_at=None)
        stored, _ = store.settle_wait(
            run.run_id, "approval", signaled(run.run_id, "approval", clock.now())
        )
        return run, entries, stored

    def test_a_journal_held_at_the_parked_generation_is_taken_not_read(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run, _, stored = self._woken_at_generation_one(store, clock)
        # Unlike the stored journal where it is settled, so that reading it would show;
        # its started entry is read back and found as stored.
        held = (entry(1, name="as-held"), entry(2, "started", name="approval", kind="wait"))
        known = {run.run_id: port.KnownJournal(1, held), "another-run": port.KnownJournal(1, ())}
        (again,) = store.claim(
            APP, WORKER, [(run.workflow, run.version)], lease_ttl=TTL, known=known
        )
        assert (again.claim.generation, again.recovered) == (2, False)
        assert again.journal == list(held)
        assert again.outcomes == [stored]
        assert kinds(store, run.run_id)[-1] == "claimed"

    def test_a_journal_held_at_an_older_generation_is_read_again(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run, entries, _ = self._woken_at_generation_one(store, clock)
        # Another claimer took the run meanwhile and parked it again.
        other = claim_run(store, run, worker=OTHER_WORKER)
        more = [entry(3, name="later", kind="sleep")]
        assert store.park(other.claim, more, [], wake_at=clock.now() + timedelta(seconds=10))
        clock.advance(11)
        known = {run.run_id: port.KnownJournal(1, (entry(1, name="as-held"),))}
        (again,) = store.claim(
            APP, WORKER, [(run.workflow, run.version)], lease_ttl=TTL, known=known
        )
        assert again.claim.generation == 3
        assert again.journal == [*entries, *more]

    def test_a_journal_held_whose_started_entries_differ_is_read_again(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        # resolve may settle a started entry without a claim: one that differs is read.
        run, entries, _ = self._woken_at_generation_one(store, clock)
        held = (entry(1, "started"), entry(2, "started", name="approval", kind="wait"))
        (again,) = store.claim(
            APP,
            WORKER,
            [(run.workflow, run.version)],
            lease_ttl=TTL,
            known={run.run_id: port.KnownJournal(1, held)},
        )
        assert again.journal == entries

    def test_a_journal_held_for_a_lapsed_run_is_read_again(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run = start(store)
        first = claim_run(store, run, lease_ttl=10)
        store.finish_step(first.claim, [entry(1)])
        clock.advance(11)
        known = {run.run_id: port.KnownJournal(1, ())}
        (again,) = store.claim(
            APP, WORKER, [(run.workflow, run.version)], lease_ttl=TTL, known=known
        )
        assert (again.recovered, again.claim.generation) == (True, 2)
        assert again.journal == [entry(1)]

    # == claims under clock steps ========================================

    def _lapsed(self, store: port.Store, clock: clocks.FakeClock) -> port.Run:
        """Return a running run whose lease (10 s) lapsed one second ago."""
        run = start(store)
        claim_run(store, run, lease_ttl=10)
        clock.advance(11)
        return run

    def test_claim_with_recover_until_none_recovers_nothing(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        lapsed = self._lapsed(store, clock)
        wanted = [(lapsed.workflow, "1")]
        sleeper = start(store, workflow=lapsed.workflow)
        [sleeping] = store.claim(APP, WORKER, wanted, lease_ttl=TTL, recover_until=None)
        assert (sleeping.run.run_id, sleeping.recovered) == (sleeper.run_id, False)
        assert store.park(sleeping.claim, [], [], wake_at=clock.now() + timedelta(seconds=1))
        clock.advance(2)
        fresh = start(store, workflow=lapsed.workflow)
        before = get(store, lapsed.run_id)

        got = store.claim(APP, OTHER_WORKER, wanted, lease_ttl=TTL, limit=5, recover_until=None)

        # The due waiting run and the queued one are claimed as always; the
        # lapsed one is left alone.
        assert sorted(c.run.run_id for c in got) == sorted([sleeper.run_id, fresh.run_id])
        assert not any(c.recovered for c in got)
        assert get(store, lapsed.run_id) == before
        assert kinds(store, lapsed.run_id) == ["initialized", "claimed"]

    def test_claim_recovers_only_at_or_before_recover_until(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run = self._lapsed(store, clock)
        wanted = [(run.workflow, "1")]
        before = get(store, run.run_id)
        for bound in (clock.now() - timedelta(microseconds=1), clock.now() - timedelta(hours=1)):
            assert store.claim(APP, OTHER_WORKER, wanted, lease_ttl=TTL, recover_until=bound) == []
        assert get(store, run.run_id) == before

        [at_bound] = store.claim(
            APP, OTHER_WORKER, wanted, lease_ttl=TTL, recover_until=clock.now()
        )
        assert (at_bound.recovered, at_bound.claim.generation) == (True, 2)

        clock.advance(TTL + 1)
        later = clock.now() + timedelta(seconds=5)
        [again] = store.claim(APP, WORKER, wanted, lease_ttl=TTL, recover_until=later)
        assert (again.recovered, again.claim.generation, again.run.failures) == (True, 3, 2)
        assert kinds(store, run.run_id) == ["initialized", "claimed", "recovered", "recovered"]

    # == fencing ===========================================================

    def _stale_claim(self, store: port.Store, clock: clocks.FakeClock, how: str) -> port.Claim:
        run = start(store)
        claimed = claim_run(store, run)
        old = claimed.claim
        if how == "lease_lapsed_and_reclaimed":
            clock.advance(TTL + 1)
            claim_run(store, run, worker=OTHER_WORKER)
        elif how == "released_and_reclaimed":
            store.release(old, delay=0, failed=False)
            claim_run(store, run, worker=OTHER_WORKER)
        elif how == "released":
            store.release(old, delay=0, failed=False)
        elif how == "parked":
            assert store.park(old, [], [port.WaitSpec("other", "signal")], wake_at=None)
        elif how == "finished":
            store.finish(old, [], state="succeeded", result="0")
        elif how == "canceled_and_reclaimed":
            assert store.request_cancel(run.run_id) is True
            clock.advance(TTL + 1)
            again = claim_run(store, run, worker=OTHER_WORKER)
            assert again.run.cancel_requested is True
        else:  # pragma: no cover - a typo in the parametrization
            raise AssertionError(how)
        return old

    @pytest.mark.parametrize("write", sorted(FENCED_WRITES))
    @pytest.mark.parametrize(
        "how",
        [
            "lease_lapsed_and_reclaimed",
            "released_and_reclaimed",
            "released",
            "parked",
            "finished",
            "canceled_and_reclaimed",
        ],
    )
    def test_stale_claim_writes_nothing(
        self, store: port.Store, clock: clocks.FakeClock, how: str, write: str
    ) -> None:
        old = self._stale_claim(store, clock, how)
        before = snapshot(store)
        with pytest.raises(errors.StaleClaim):
            FENCED_WRITES[write](store, old)
        assert snapshot(store) == before

    @pytest.mark.parametrize("write", sorted(FENCED_WRITES))
    def test_cancel_requested_fences_writes(
        self, store: port.Store, clock: clocks.FakeClock, write: str
    ) -> None:
        run = start(store)
        claimed = claim_run(store, run)
        assert store.request_cancel(run.run_id) is True
        current = get(store, run.run_id)
        assert (current.state, current.cancel_requested) == ("running", True)
        before = snapshot(store)
        if write in SETTLES_CANCELED:
            FENCED_WRITES[write](store, claimed.claim)
            ended = get(store, run.run_id)
            assert ended.state == FINISHES[write]
            assert (ended.worker, ended.lease_expires_at) == (None, None)
            expected = "canceled" if write == "finish_canceled" else "finished"
            assert kinds(store, run.run_id)[-1] == expected
        else:
            with pytest.raises(errors.Canceled):
                FENCED_WRITES[write](store, claimed.claim)
            assert snapshot(store) == before

    @pytest.mark.parametrize("write", sorted(FENCED_WRITES))
    def test_canceling_claim_may_still_write(
        self, store: port.Store, clock: clocks.FakeClock, write: str
    ) -> None:
        run = start(store)
        claimed = claim_run(store, run)
        assert store.request_cancel(run.run_id) is True
        canceling = dataclasses.replace(claimed.claim, canceling=True)
        if write == "transaction_step":
            recorded = store.transaction_step(canceling, [], lambda _: entry(1))
            assert recorded == entry(1)
        else:
            FENCED_WRITES[write](store, canceling)
        after = get(store, run.run_id)
        if write in ("begin_effect", "finish_step", "transaction_step", "renew"):
            assert (after.state, after.generation) == ("running", 1)
        if write in ("begin_effect", "finish_step", "transaction_step"):
            assert [e.position for e in store.journal(run.run_id)] == [1]
        if write in FINISHES:
            assert after.state == FINISHES[write]

    def test_renew_tells_stale_from_canceled(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        stale = self._stale_claim(store, clock, "lease_lapsed_and_reclaimed")
        with pytest.raises(errors.StaleClaim) as raised:
            store.renew(stale, lease_ttl=TTL)
        assert not isinstance(raised.value, errors.Canceled)
        run = start(store)
        claimed = claim_run(store, run)
        store.request_cancel(run.run_id)
        with pytest.raises(errors.Canceled) as canceled:
            store.renew(claimed.claim, lease_ttl=TTL)
        assert not isinstance(canceled.value, errors.StaleClaim)
        assert canceled.value.run_id == run.run_id

    def test_a_lapsed_lease_still_writes_while_nobody_took_over(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run = start(store)
        claim = claim_run(store, run).claim
        clock.advance(TTL * 100)
        renewed = store.renew(claim, lease_ttl=TTL)
        assert renewed.lease_expires_at == clock.now() + timedelta(seconds=TTL)
        store.finish_step(renewed, [entry(1)])
        assert store.journal(run.run_id) == [entry(1)]

    def test_a_claim_on_a_missing_run_is_stale(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        ghost = port.Claim("no-such-run", WORKER, 1, clock.now())
        with pytest.raises(errors.StaleClaim):
            store.renew(ghost, lease_ttl=TTL)
        with pytest.raises(errors.StaleClaim):
            store.finish_step(ghost, [entry(1)])

    def test_renew_extends_the_lease_of_the_current_claim(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run = start(store)
        claimed = claim_run(store, run, lease_ttl=10)
        clock.advance(8)
        renewed = store.renew(claimed.claim, lease_ttl=10)
        assert renewed == dataclasses.replace(
            claimed.claim, lease_expires_at=clock.now() + timedelta(seconds=10)
        )
        clock.advance(8)
        assert store.claim(APP, OTHER_WORKER, [(run.workflow, "1")], lease_ttl=TTL) == []
        assert get(store, run.run_id).generation == 1

    # == release ===========================================================

    def test_release_requeues_and_counts_failures(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run = start(store)
        claimed = claim_run(store, run)
        store.release(claimed.claim, delay=0, failed=False)
        released = get(store, run.run_id)
        assert (released.state, released.failures, released.worker) == ("queued", 0, None)
        assert released.lease_expires_at is None
        assert kinds(store, run.run_id)[-1] == "released"

        claimed = claim_run(store, run)
        store.release(claimed.claim, delay=30, failed=True)
        backoff = get(store, run.run_id)
        assert (backoff.state, backoff.failures) == ("queued", 1)
        assert backoff.ready_at == clock.now() + timedelta(seconds=30)
        assert store.claim(APP, WORKER, [(run.workflow, "1")], lease_ttl=TTL) == []
        clock.advance(31)
        claimed = claim_run(store, run)
        assert claimed.run.failures == 1
        store.release(claimed.claim, delay=0, failed=True)
        assert get(store, run.run_id).failures == 2
        claimed = claim_run(store, run)
        store.finish_step(claimed.claim, [entry(1)])
        assert get(store, run.run_id).failures == 0

    def test_finish_step_resets_failures_after_recovery(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run = start(store)
        claim_run(store, run, lease_ttl=5)
        clock.advance(6)
        recovered = claim_run(store, run)
        assert recovered.run.failures == 1
        store.finish_step(recovered.claim, [entry(1)])
        assert get(store, run.run_id).failures == 0

    def test_release_appends_marks(self, store: port.Store) -> None:
        run = start(store)
        claimed = claim_run(store, run)
        store.release(
            claimed.claim, delay=0, failed=True, marks=[port.Mark("step_failed", step="s")]
        )
        history = store.history(run.run_id)
        assert [r.sequence for r in history] == [1, 2, 3, 4]
        assert sorted(r.kind for r in history[2:]) == ["released", "step_failed"]
