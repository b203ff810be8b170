"""Conformance: begin_effect, finish_step and transaction_step: the journal."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from perdure import errors
from perdure.store import port
from perdure.testing import clock as clocks
from perdure.testing.conformance.harness import (
    WORKER,
    Suite,
    claim_run,
    entry,
    snapshot,
    start,
)


class JournalTests(Suite):
    """The conformance tests of begin_effect, finish_step and transaction_step: the journal."""

    # == journal ===========================================================

    def test_journal_orders_entries_by_position(self, store: port.Store) -> None:
        run = start(store)
        claim = claim_run(store, run).claim
        third = dataclasses.replace(entry(3, "error"), attempt=3)
        store.finish_step(claim, [entry(2), entry(1)])
        store.finish_step(claim, [third])
        assert store.journal(run.run_id) == [entry(1), entry(2), third]

    def test_begin_effect_then_finish_step_replaces_the_started_entry(
        self, store: port.Store
    ) -> None:
        run = start(store)
        claim = claim_run(store, run).claim
        store.begin_effect(claim, [entry(1), entry(2, "started", name="charge")])
        assert store.journal(run.run_id) == [entry(1), entry(2, "started", name="charge")]
        store.begin_effect(claim, [entry(2, "started", name="charge")])
        assert store.journal(run.run_id) == [entry(1), entry(2, "started", name="charge")]
        done = dataclasses.replace(entry(2, name="charge"), attempt=2)
        store.finish_step(claim, [done, entry(3)])
        assert store.journal(run.run_id) == [entry(1), done, entry(3)]

    @pytest.mark.parametrize("operation", ["begin_effect", "finish_step", "transaction_step"])
    @pytest.mark.parametrize("existing", ["ok", "error"])
    def test_recorded_entry_is_never_replaced(
        self, store: port.Store, operation: str, existing: port.EntryStatus
    ) -> None:
        run = start(store)
        claim = claim_run(store, run).claim
        store.finish_step(claim, [entry(1, existing)])
        before = snapshot(store)
        replacement = [entry(2), entry(1, "started" if operation == "begin_effect" else "ok")]
        with pytest.raises(errors.CorruptState):
            if operation == "begin_effect":
                store.begin_effect(claim, replacement)
            elif operation == "finish_step":
                store.finish_step(claim, replacement)
            else:
                store.transaction_step(claim, [entry(2)], lambda _: entry(1))
        assert snapshot(store) == before

    def test_journal_writes_append_marks(self, store: port.Store, clock: clocks.FakeClock) -> None:
        run = start(store)
        claim = claim_run(store, run).claim
        clock.advance(1)
        store.begin_effect(
            claim,
            [entry(1, "started", name="charge")],
            marks=[port.Mark("effect_started", step="charge", digest="d-1", note="n")],
        )
        store.finish_step(claim, [entry(1, name="charge")], marks=[port.Mark("step_completed")])
        history = store.history(run.run_id)
        assert [(r.sequence, r.kind) for r in history] == [
            (1, "initialized"),
            (2, "claimed"),
            (3, "effect_started"),
            (4, "step_completed"),
        ]
        effect = history[2]
        assert (effect.step, effect.digest, effect.note) == ("charge", "d-1", "n")
        assert (effect.generation, effect.worker, effect.at) == (1, WORKER, clock.now())
        assert (history[3].step, history[3].digest, history[3].note) == (None, None, None)

    # == transaction_step ==================================================

    def test_transaction_step_commits_body_writes_with_the_entry(self, store: port.Store) -> None:
        run = start(store)
        claim = claim_run(store, run).claim
        calls: list[str] = []

        def body(connection: Any) -> port.JournalEntry:
            calls.append("body")
            self.side_write(connection, "k1")
            return entry(2, name="tx")

        recorded = store.transaction_step(claim, [entry(1)], body)
        assert recorded == entry(2, name="tx")
        assert calls == ["body"]
        assert store.journal(run.run_id) == [entry(1), entry(2, name="tx")]
        assert self._read_side(store, claim, 3) == ["k1"]

    def test_transaction_step_body_that_raises_stores_nothing(self, store: port.Store) -> None:
        run = start(store)
        claim = claim_run(store, run).claim
        store.finish_step(claim, [entry(1)])
        before = snapshot(store)

        class BodyFailed(Exception):
            pass

        failure = BodyFailed("no")

        def body(connection: Any) -> port.JournalEntry:
            self.side_write(connection, "k1")
            raise failure

        with pytest.raises(BodyFailed) as raised:
            store.transaction_step(claim, [entry(2)], body)
        assert raised.value is failure
        assert snapshot(store) == before
        assert self._read_side(store, claim, 2) == []
        assert [e.position for e in store.journal(run.run_id)] == [1, 2]
