"""Conformance: the claim of a warm-parked run by key, and what wake-ups name."""

from __future__ import annotations

from datetime import timedelta

from perdure.store import liveport, port, warmport
from perdure.testing import clock as clocks
from perdure.testing.conformance.harness import (
    APP,
    OTHER_APP,
    OTHER_WORKER,
    TTL,
    WORKER,
    StoreHandle,
    Suite,
    claim_run,
    entry,
    get,
    kinds,
    run_threads,
    signaled,
    snapshot,
    start,
)


def _warm(store: port.Store) -> warmport.WarmClaims:
    assert isinstance(store, warmport.WarmClaims), "the store must claim warm-parked runs"
    return store


class WarmClaimTests(Suite):
    """The conformance tests of ``claim_warm`` and ``woken``."""

    def _parked(
        self, store: port.Store, **kwargs: str
    ) -> tuple[port.Run, tuple[port.JournalEntry, ...]]:
        """Return a run parked on a signal by its first claim (generation 1), and its journal."""
        run = start(store, **kwargs)
        first = claim_run(store, run)
        entries = (entry(1), entry(2, "started", name="approval", kind="wait"))
        assert store.park(first.claim, entries, [port.WaitSpec("approval", "signal")], wake_at=None)
        return run, entries

    def _woken(
        self, store: port.Store, clock: clocks.FakeClock, **kwargs: str
    ) -> tuple[port.Run, tuple[port.JournalEntry, ...], port.Outcome]:
        run, entries = self._parked(store, **kwargs)
        stored, _ = store.settle_wait(
            run.run_id, "approval", signaled(run.run_id, "approval", clock.now())
        )
        return run, entries, stored

    def _claim_warm(
        self, store: port.Store, run: port.Run, known: port.KnownJournal, **kwargs: object
    ) -> port.Claimed | None:
        options: dict[str, object] = {"app": run.app, "worker": WORKER, "dry_run": False}
        options.update(kwargs)
        return _warm(store).claim_warm(
            str(options["app"]),
            str(options["worker"]),
            [(run.workflow, run.version)],
            run_id=run.run_id,
            known=known,
            lease_ttl=TTL,
            dry_run=bool(options["dry_run"]),
        )

    def test_claim_warm_takes_a_woken_run_with_the_journal_held(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run, entries, stored = self._woken(store, clock)
        # Unlike the stored journal where it is settled: taking it, not reading it, shows.
        held = (entry(1, name="as-held"), entries[1])
        claimed = self._claim_warm(store, run, port.KnownJournal(1, held))
        assert claimed is not None
        assert (claimed.claim.generation, claimed.recovered) == (2, False)
        assert (claimed.journal, claimed.outcomes) == (list(held), [stored])
        after = get(store, run.run_id)
        assert (after.state, after.worker, after.generation) == ("running", WORKER, 2)
        assert after.lease_expires_at == clock.now() + timedelta(seconds=TTL)
        assert kinds(store, run.run_id)[-2:] == ["woken", "claimed"]
        # The claim fences as any other: the next write under it lands.
        store.finish_step(claimed.claim, [entry(3)])

    def _two_settled(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> tuple[port.Run, port.KnownJournal, port.Outcome, port.Outcome]:
        """Return a woken run, its journal held with the first of its two outcomes, and both."""
        run = start(store)
        first = claim_run(store, run)
        entries = (
            entry(1, "started", name="early", kind="wait"),
            entry(2, "started", name="late", kind="wait"),
        )
        specs = [port.WaitSpec("early", "signal"), port.WaitSpec("late", "signal")]
        assert store.park(first.claim, entries, specs, wake_at=None)
        held, _ = store.settle_wait(run.run_id, "early", signaled(run.run_id, "early", clock.now()))
        clock.advance(1)
        fresh, _ = store.settle_wait(
            run.run_id, "late", signaled(run.run_id, "late", clock.now(), signal_id="sig-2")
        )
        return run, port.KnownJournal(1, entries, frozenset({"early"})), held, fresh

    def test_claim_warm_may_leave_out_the_outcomes_held(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run, known, held, fresh = self._two_settled(store, clock)
        claimed = self._claim_warm(store, run, known)
        assert claimed is not None
        # What is not held always comes back; what is held may (it never changes).
        assert fresh in claimed.outcomes and set(claimed.outcomes) <= {held, fresh}

    def test_the_claim_may_leave_out_the_outcomes_held(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run, known, held, fresh = self._two_settled(store, clock)
        versions = [(run.workflow, run.version)]
        (claimed,) = store.claim(APP, WORKER, versions, lease_ttl=TTL, known={run.run_id: known})
        assert claimed.journal == list(known.journal)
        assert fresh in claimed.outcomes and set(claimed.outcomes) <= {held, fresh}

    def _asked(self, store: port.Store) -> tuple[port.Run, port.KnownJournal]:
        """Return a run parked on updates ``ask`` and ``tell``, woken by two of ``ask``.

        It has consumed none (after 0) of ``ask`` and one (after 1) of
        ``tell``; the known journal its parker holds names both waits.
        """
        run = start(store)
        first = claim_run(store, run)
        live = liveport.require(store)
        live.deliver_update(liveport.NewUpdate(run.run_id, "t-1", "tell", "1"))
        entries = (entry(1, name="tell", kind="update"),)
        specs = [port.WaitSpec("ask", "update", None, 0), port.WaitSpec("tell", "update", None, 1)]
        assert store.park(first.claim, entries, specs, wake_at=None)
        for update_id, payload in (("a-1", "10"), ("a-2", "20")):
            live.deliver_update(liveport.NewUpdate(run.run_id, update_id, "ask", payload))
        known = port.KnownJournal(1, entries, frozenset(), (("ask", 0), ("tell", 1)))
        return run, known

    def _ahead_as_read(self, store: port.Store, run: port.Run) -> dict[tuple[str, int], object]:
        """What a claim reads ahead for ``_asked``'s run: the first ``ask`` update, no more."""
        live = liveport.require(store)
        first = live.next_update(run.run_id, "ask", 0)
        assert first is not None and first.update_id == "a-1"
        assert live.next_update(run.run_id, "tell", 1) is None
        return {("ask", 0): first}

    def test_claim_warm_reads_ahead_only_what_next_update_would_read(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run, known = self._asked(store)
        claimed = self._claim_warm(store, run, known)
        assert claimed is not None
        # Reading ahead is the adapter's choice here (a cost in its one statement).
        assert claimed.updates in ({}, self._ahead_as_read(store, run))

    def test_the_claim_reads_ahead_the_updates_of_a_journal_it_proves_current(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run, known = self._asked(store)
        versions = [(run.workflow, run.version)]
        (claimed,) = store.claim(APP, WORKER, versions, lease_ttl=TTL, known={run.run_id: known})
        assert claimed.journal == list(known.journal)
        assert claimed.updates == self._ahead_as_read(store, run)

    def test_a_claim_reads_no_updates_ahead_for_a_journal_it_does_not_prove(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run, known = self._asked(store)
        # Held at another generation: the claim cannot vouch for it, nor read for it.
        stale = port.KnownJournal(2, known.journal, frozenset(), known.updates)
        versions = [(run.workflow, run.version)]
        (claimed,) = store.claim(APP, WORKER, versions, lease_ttl=TTL, known={run.run_id: stale})
        assert claimed.updates == {}

    def test_claim_warm_refuses_a_run_whose_started_tail_differs(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run, entries, _ = self._woken(store, clock)
        held = (entry(1), entry(2, "started", name="another", kind="wait"))
        before = snapshot(store)
        # Its worker would go on from a journal that is not the run's: not claimed by key.
        assert self._claim_warm(store, run, port.KnownJournal(1, held)) is None
        assert snapshot(store) == before
        # The journal as stored is claimed.
        claimed = self._claim_warm(store, run, port.KnownJournal(1, entries))
        assert claimed is not None and claimed.journal == list(entries)

    def test_claim_warm_refuses_a_run_claimed_since(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run, entries, _ = self._woken(store, clock)
        other = claim_run(store, run, worker=OTHER_WORKER)
        assert store.park(other.claim, [], [], wake_at=clock.now() + timedelta(seconds=1))
        clock.advance(2)
        before = snapshot(store)
        # Ready again, but at generation 2: the held journal may be stale.
        assert self._claim_warm(store, run, port.KnownJournal(1, entries)) is None
        assert snapshot(store) == before

    def test_claim_warm_refuses_a_run_that_is_not_ready(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run, entries = self._parked(store)
        before = snapshot(store)
        assert self._claim_warm(store, run, port.KnownJournal(1, entries)) is None
        assert snapshot(store) == before

    def test_claim_warm_refuses_another_app_workflow_or_kind_of_run(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run, entries, _ = self._woken(store, clock)
        known = port.KnownJournal(1, entries)
        before = snapshot(store)
        assert self._claim_warm(store, run, known, app=OTHER_APP) is None
        assert self._claim_warm(store, run, known, dry_run=True) is None
        elsewhere = _warm(store).claim_warm(
            APP, WORKER, [("another-workflow", "1")], run_id=run.run_id, known=known, lease_ttl=TTL
        )
        assert elsewhere is None
        assert snapshot(store) == before

    def test_claim_warm_and_the_claim_take_a_run_once(
        self, handle: StoreHandle, clock: clocks.FakeClock
    ) -> None:
        store, other = handle.store, handle.reopen()
        run, entries, _ = self._woken(store, clock)
        versions = [(run.workflow, run.version)]
        found = run_threads(
            [
                lambda: self._claim_warm(store, run, port.KnownJournal(1, entries)),
                lambda: other.claim(APP, OTHER_WORKER, versions, lease_ttl=TTL),
            ]
        )
        taken = [found[0]] if found[0] is not None else []
        taken += found[1]
        assert [c.claim.generation for c in taken] == [2]
        assert get(store, run.run_id).worker == taken[0].claim.worker
        assert kinds(store, run.run_id).count("claimed") == 2

    def test_a_wake_up_is_named_or_counts_as_naming_nothing(
        self, handle: StoreHandle, clock: clocks.FakeClock
    ) -> None:
        store = handle.store
        run, _ = self._parked(store)
        store.wait_ready(0)  # listening from here on
        _warm(store).woken()
        handle.reopen().settle_wait(
            run.run_id, "approval", signaled(run.run_id, "approval", clock.now())
        )
        assert store.wait_ready(10)
        woken = _warm(store).woken()
        # Never lost: a wake-up that is not named says that something else may be ready.
        assert woken.others or run.run_id in woken.runs
