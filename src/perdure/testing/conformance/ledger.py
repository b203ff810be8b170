"""Conformance: The provenance ledger every transition appends to."""

from __future__ import annotations

import pytest

from perdure import errors
from perdure.store import port
from perdure.testing import clock as clocks
from perdure.testing.conformance.harness import (
    Suite,
    claim_run,
    entry,
    get,
    signaled,
    snapshot,
    start,
)


class LedgerTests(Suite):
    """The conformance tests of the provenance ledger every transition appends to."""

    # == ledger ============================================================

    def test_ledger_starts_at_initialized(self, store: port.Store, clock: clocks.FakeClock) -> None:
        run = start(store)
        assert store.history(run.run_id) == [
            port.LedgerEntry(
                run_id=run.run_id,
                sequence=1,
                kind="initialized",
                at=clock.now(),
                generation=0,
                worker=None,
                step=None,
                digest=None,
                note=None,
            )
        ]

    def test_ledger_records_each_transition(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run = start(store)
        expected_at = [clock.now()]

        def tick() -> None:
            expected_at.append(clock.advance(1))

        tick()
        claim = claim_run(store, run).claim
        tick()
        store.begin_effect(
            claim, [entry(1, "started")], marks=[port.Mark("effect_started", step="step-1")]
        )
        tick()
        store.finish_step(claim, [entry(1)], marks=[port.Mark("step_completed", step="step-1")])
        tick()
        assert store.park(claim, [], [port.WaitSpec("go", "signal")], wake_at=None)
        tick()
        store.settle_wait(run.run_id, "go", signaled(run.run_id, "go", clock.now()))
        tick()
        claim = claim_run(store, run).claim
        tick()
        store.release(claim, delay=0, failed=False)
        tick()
        claim = claim_run(store, run).claim
        tick()
        store.finish(claim, [], state="succeeded", result="1", marks=[])
        history = store.history(run.run_id)
        assert [r.kind for r in history] == [
            "initialized",
            "claimed",
            "effect_started",
            "step_completed",
            "parked",
            "woken",
            "claimed",
            "released",
            "claimed",
            "finished",
        ]
        assert [r.sequence for r in history] == list(range(1, 11))
        assert [r.at for r in history] == expected_at
        assert {r.run_id for r in history} == {run.run_id}
        assert [r.generation for r in history if r.kind == "claimed"] == [1, 2, 3]
        assert history[2].step == "step-1"
        assert get(store, run.run_id).ledger_sequence == 10

    def test_an_unknown_receipt_kind_is_refused_before_anything(self, store: port.Store) -> None:
        run = start(store)
        claim = claim_run(store, run).claim
        before = snapshot(store)
        with pytest.raises(errors.InvalidInput):
            store.finish_step(claim, [entry(1)], [port.Mark("made_up")])
        assert snapshot(store) == before

    @pytest.mark.parametrize("ledger_limit", [5])
    def test_ledger_keeps_the_newest_receipts(self, store: port.Store, ledger_limit: int) -> None:
        run = start(store)

        def check(total: int) -> None:
            kept = min(total, ledger_limit)
            history = store.history(run.run_id)
            assert [r.sequence for r in history] == list(range(total - kept + 1, total + 1))
            assert get(store, run.run_id).ledger_sequence == total

        check(1)
        claim = claim_run(store, run).claim
        check(2)
        for position in range(1, 9):
            store.finish_step(
                claim, [entry(position)], marks=[port.Mark("step_completed", step=str(position))]
            )
            check(2 + position)
        store.finish_step(
            claim, [entry(9)], marks=[port.Mark("step_started"), port.Mark("step_completed")]
        )
        check(12)
        history = store.history(run.run_id)
        assert [r.step for r in history[:3]] == ["6", "7", "8"]
