"""Conformance: retention, the pruning of runs that ended before a cutoff."""

from __future__ import annotations

from datetime import timedelta

import pytest

from perdure import errors
from perdure.store import liveport, port, retention
from perdure.testing import clock as clocks
from perdure.testing.conformance.harness import (
    APP,
    OTHER_APP,
    Suite,
    claim_run,
    entry,
    get,
    signaled,
    start,
)


def _prunable(store: port.Store) -> retention.PrunableStore:
    assert isinstance(store, retention.PrunableStore), "the store has no prune operation"
    return store


def _ended(store: port.Store, state: port.RunState, **kwargs: object) -> port.Run:
    """A run of the suite's app that ended in ``state`` now, with a journal and a message."""
    run = start(store, **kwargs)
    claim = claim_run(store, run).claim
    assert store.send(port.NewMessage(run.run_id, "inbox", "m", "1"))
    error = '{"code": "boom", "message": "no"}' if state != "succeeded" else None
    store.finish(claim, [entry(1)], state=state, result="1" if not error else None, error=error)
    return get(store, run.run_id)


class RetentionTests(Suite):
    """The conformance tests of prune."""

    def test_prune_deletes_ended_runs_with_all_their_records(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        old = [_ended(store, s) for s in ("succeeded", "failed", "canceled")]
        kept_signal = start(store)
        kept_claim = claim_run(store, kept_signal).claim
        store.settle_wait(kept_signal.run_id, "x", signaled(kept_signal.run_id, "x", clock.now()))
        store.finish(kept_claim, [], state="canceled")
        clock.advance(60)
        cutoff = clock.now()
        clock.advance(60)
        young = _ended(store, "succeeded")
        assert _prunable(store).prune(APP, cutoff) == 4
        for run in [*old, kept_signal]:
            assert store.get_run(run.run_id) is None
            assert store.journal(run.run_id) == []
            assert store.history(run.run_id) == []
            assert store.outcomes(run.run_id) == []
            assert store.next_message(run.run_id, "inbox", 0) is None
        assert get(store, young.run_id).state == "succeeded"
        assert [e.position for e in store.journal(young.run_id)] == [1]
        assert _prunable(store).prune(APP, cutoff) == 0

    def test_prune_deletes_the_updates_sent_to_the_run(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        live = liveport.require(store)
        run = start(store)
        claim = claim_run(store, run).claim
        live.deliver_update(liveport.NewUpdate(run.run_id, "u1", "bump", "1"))
        store.finish(claim, [], state="succeeded", result="1")
        # Kept past the run's end, for the sender's retries; not past the run.
        assert live.get_update(run.run_id, "u1") is not None
        clock.advance(60)
        assert _prunable(store).prune(APP, clock.now()) == 1
        assert live.get_update(run.run_id, "u1") is None
        assert live.list_updates(run.run_id) == []

    def test_prune_never_touches_live_or_needs_attention_runs_or_other_apps(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        queued = start(store)
        running = start(store)
        claim_run(store, running)
        waiting = start(store)
        waiting_claim = claim_run(store, waiting).claim
        store.park(waiting_claim, [], [port.WaitSpec("go", "signal", None)], wake_at=None)
        attention = start(store)
        attention_claim = claim_run(store, attention).claim
        store.finish(attention_claim, [], state="needs_attention", error='{"code": "x"}')
        other = _ended(store, "succeeded", app=OTHER_APP)
        clock.advance(3600)
        assert _prunable(store).prune(APP, clock.now()) == 0
        for run, state in (
            (queued, "queued"),
            (running, "running"),
            (waiting, "waiting"),
            (attention, "needs_attention"),
            (other, "succeeded"),
        ):
            assert get(store, run.run_id).state == state
        assert _prunable(store).prune(OTHER_APP, clock.now()) == 1

    def test_prune_deletes_at_most_limit_runs_per_call_oldest_first(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        ended = []
        for _ in range(5):
            ended.append(_ended(store, "succeeded"))
            clock.advance(1)
        clock.advance(60)
        assert _prunable(store).prune(APP, clock.now(), limit=2) == 2
        assert [store.get_run(r.run_id) is None for r in ended] == [True, True] + [False] * 3
        assert _prunable(store).prune(APP, clock.now(), limit=10) == 3
        assert store.list_runs(APP, limit=100) == []

    def test_a_run_that_ended_after_the_cutoff_is_kept_however_old(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run = start(store)
        claim = claim_run(store, run).claim
        clock.advance(3600)
        cutoff = clock.now()
        clock.advance(1)
        store.finish(claim, [], state="succeeded", result="1")
        assert _prunable(store).prune(APP, cutoff) == 0
        assert _prunable(store).prune(APP, clock.now() + timedelta(seconds=1)) == 1

    def test_prune_refuses_a_bad_limit_or_a_naive_cutoff(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        with pytest.raises(errors.InvalidInput):
            _prunable(store).prune(APP, clock.now(), limit=0)
        with pytest.raises(errors.InvalidInput):
            _prunable(store).prune(APP, clock.now().replace(tzinfo=None))
