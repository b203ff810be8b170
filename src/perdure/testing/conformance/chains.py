"""Conformance: continue_run, chain and current_run: a run that continues as new."""

from __future__ import annotations

import pytest

from perdure import errors
from perdure.store import chainport, port
from perdure.testing import clock as clocks
from perdure.testing.conformance.harness import (
    Suite,
    claim_run,
    entry,
    get,
    kinds,
    messages,
    new_run,
    signaled,
    start,
)


def _successor(run: port.Run, payload: str = '{"args": [2], "kwargs": {}}') -> port.NewRun:
    return new_run(workflow=run.workflow, version=run.version, input=payload)


def _continue(
    store: port.Store,
    run: port.Run,
    *,
    consumed: dict[str, int] | None = None,
    entries: list[port.JournalEntry] | None = None,
) -> port.Run:
    claim = claim_run(store, run).claim
    chained = chainport.require(store)
    return chained.continue_run(claim, entries or [], _successor(run), consumed=consumed or {})


class ChainTests(Suite):
    """The conformance tests of the chain section (continue-as-new)."""

    def test_continue_ends_the_run_and_creates_its_queued_successor(
        self, store: port.Store
    ) -> None:
        parent = start(store)
        run = start(store, key="k-1", parent_id=parent.run_id)
        new = _continue(store, run, entries=[entry(1)])
        old = get(store, run.run_id)
        assert (old.state, old.result, old.key) == ("succeeded", None, None)
        assert (old.continued_as, old.origin) == (new.run_id, run.run_id)
        assert (new.state, new.key, new.parent_id, new.origin) == (
            "queued",
            "k-1",
            parent.run_id,
            run.run_id,
        )
        assert (new.workflow, new.input) == (run.workflow, '{"args": [2], "kwargs": {}}')
        assert [e.position for e in store.journal(run.run_id)] == [1]
        assert store.journal(new.run_id) == []
        assert kinds(store, run.run_id)[-1] == "continued"
        assert store.history(run.run_id)[-1].note == f"as {new.run_id}"
        assert kinds(store, new.run_id) == ["initialized"]
        # The key names the successor now.
        again, created = store.create_run(new_run(workflow=run.workflow, key="k-1"))
        assert not created and again.run_id == new.run_id
        # The parent's wait on its child is not settled: the chain goes on.
        assert store.outcomes(parent.run_id) == []

    def test_chain_and_current_run_follow_the_links(self, store: port.Store) -> None:
        chained = chainport.require(store)
        run = start(store)
        assert chained.chain(run.run_id) == [run]
        assert chained.current_run(run.run_id) == run
        second = _continue(store, run)
        third = _continue(store, second)
        ids = [r.run_id for r in chained.chain(second.run_id)]
        assert ids == [run.run_id, second.run_id, third.run_id]
        for member in ids:
            current = chained.current_run(member)
            assert current is not None and current.run_id == third.run_id
        assert chained.current_run("no-such-run") is None
        with pytest.raises(errors.RunNotFound):
            chained.chain("no-such-run")

    def test_unconsumed_messages_move_and_consumed_keys_stay_refused(
        self, store: port.Store
    ) -> None:
        run = start(store)
        for channel, key in [("a", "1"), ("b", "1"), ("a", "2"), ("a", "3")]:
            assert store.send(port.NewMessage(run.run_id, channel, key, f'"{channel}{key}"'))
        first_a = messages(store, run.run_id, "a")[0]
        new = _continue(store, run, consumed={"a": first_a.sequence})
        assert [(m.key, m.sequence) for m in messages(store, new.run_id, "a")] == [
            ("2", 2),
            ("3", 3),
        ]
        assert [(m.key, m.sequence) for m in messages(store, new.run_id, "b")] == [("1", 1)]
        assert store.send(port.NewMessage(new.run_id, "a", "1", '"again"')) is False
        assert store.send(port.NewMessage(new.run_id, "a", "4", '"a4"')) is True
        assert [m.sequence for m in messages(store, new.run_id, "a")] == [2, 3, 4]
        # The next continue drops the keys the run before consumed.
        third = _continue(store, new, consumed={"a": 3, "b": 1})
        assert [m.key for m in messages(store, third.run_id, "a")] == ["4"]
        assert store.send(port.NewMessage(third.run_id, "a", "1", '"late"')) is True

    def test_unapplied_signals_move_renamed_in_arrival_order(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run = start(store)
        for name, sid in [("go", "s1"), ("go#2", "s2"), ("go#3", "s3"), ("stop", "s4")]:
            store.settle_wait(
                run.run_id, name, signaled(run.run_id, name, clock.now(), signal_id=sid)
            )
        applied = port.JournalEntry(1, "wait", "go", "ok", '{"payload": 1}')
        new = _continue(store, run, entries=[applied])
        moved = {o.name: o.signal_id for o in store.outcomes(new.run_id)}
        assert moved == {"go": "s2", "go#2": "s3", "stop": "s4"}
        assert store.outcomes(run.run_id) == []

    def test_a_stale_or_canceled_claim_continues_nothing(self, store: port.Store) -> None:
        chained = chainport.require(store)
        run = start(store)
        claim = claim_run(store, run).claim
        store.request_cancel(run.run_id)
        with pytest.raises(errors.Canceled):
            chained.continue_run(claim, [entry(1)], _successor(run), consumed={})
        after = get(store, run.run_id)
        assert (after.state, after.continued_as) == ("running", None)
        assert store.journal(run.run_id) == []
        other = start(store)
        stale = claim_run(store, other).claim
        store.release(stale, delay=0, failed=False)
        claim_run(store, other)
        with pytest.raises(errors.StaleClaim):
            chained.continue_run(stale, [], _successor(other), consumed={})
        assert chained.chain(other.run_id) == [get(store, other.run_id)]

    def test_cancel_of_a_continued_run_cancels_the_current_run(self, store: port.Store) -> None:
        run = start(store)
        new = _continue(store, run)
        assert store.request_cancel(run.run_id) is True
        assert get(store, new.run_id).state == "canceled"
        assert get(store, run.run_id).state == "succeeded"

    def test_a_child_chain_settles_its_parent_under_its_first_id(self, store: port.Store) -> None:
        parent = start(store)
        run = start(store, parent_id=parent.run_id)
        new = _continue(store, run)
        claim = claim_run(store, new).claim
        store.finish(claim, [], state="succeeded", result="7")
        [outcome] = store.outcomes(parent.run_id)
        assert outcome.name == f"child:{run.run_id}"
