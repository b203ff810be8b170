"""Conformance: request_cancel and resolve."""

from __future__ import annotations

import dataclasses
import uuid

import pytest

from perdure import errors
from perdure.store import port
from perdure.testing import clock as clocks
from perdure.testing.conformance.harness import (
    APP,
    TTL,
    WORKER,
    Suite,
    child_payload,
    claim_run,
    entry,
    get,
    kinds,
    messages,
    new_run,
    nonzero,
    same_json,
    signaled,
    snapshot,
    start,
)


class OperatorTests(Suite):
    """The conformance tests of request_cancel and resolve."""

    # == request_cancel ====================================================

    def test_request_cancel_walks_the_tree(self, store: port.Store) -> None:
        root = start(store)
        root_claim = claim_run(store, root).claim
        queued, waiting = store.create_children(
            root_claim,
            [new_run(key="a", parent_id=root.run_id), new_run(key="b", parent_id=root.run_id)],
        )
        waiting_claim = claim_run(store, waiting).claim
        [running] = store.create_children(
            waiting_claim, [new_run(key="c", parent_id=waiting.run_id)]
        )
        assert store.park(waiting_claim, [], [port.WaitSpec("s", "signal")], wake_at=None)
        running_claim = claim_run(store, running).claim

        assert store.request_cancel(root.run_id) is True
        states = {
            r.run_id: (r.state, r.cancel_requested)
            for r in (get(store, x.run_id) for x in (root, queued, waiting, running))
        }
        assert states[root.run_id] == ("running", True)
        assert states[queued.run_id][0] == "canceled"
        assert states[waiting.run_id][0] == "canceled"
        assert states[running.run_id] == ("running", True)
        assert store.waits(APP, waiting.run_id) == []
        assert store.outcomes(waiting.run_id) == []
        settled = {o.name: child_payload(o)["state"] for o in store.outcomes(root.run_id)}
        assert settled == {
            f"child:{queued.run_id}": "canceled",
            f"child:{waiting.run_id}": "canceled",
        }
        assert nonzero(store.child_counts(root.run_id)) == {"canceled": 2}
        for run_id in (root.run_id, queued.run_id, waiting.run_id, running.run_id):
            sequences = [r.sequence for r in store.history(run_id)]
            assert sequences == list(range(1, len(sequences) + 1))

        assert store.request_cancel(root.run_id) is False
        with pytest.raises(errors.Canceled):
            store.finish_step(running_claim, [entry(1)])
        store.finish(running_claim, [], state="canceled")
        assert get(store, running.run_id).state == "canceled"
        with pytest.raises(errors.Canceled):
            store.renew(root_claim, lease_ttl=TTL)

    def test_request_cancel_of_a_queued_run(self, store: port.Store) -> None:
        run = start(store)
        assert store.request_cancel(run.run_id) is True
        canceled = get(store, run.run_id)
        assert (canceled.state, canceled.worker) == ("canceled", None)
        assert store.claim(APP, WORKER, [(run.workflow, "1")], lease_ttl=TTL) == []
        assert store.request_cancel(run.run_id) is False

    def test_request_cancel_refusals(self, store: port.Store) -> None:
        missing = str(uuid.uuid4())
        with pytest.raises(errors.RunNotFound):
            store.request_cancel(missing)
        run = start(store)
        store.finish(claim_run(store, run).claim, [], state="succeeded", result="1")
        before = snapshot(store)
        assert store.request_cancel(run.run_id) is False
        assert snapshot(store) == before

    def _parent_of_a_child_needing_attention(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> tuple[port.Run, port.Run, port.Run]:
        """Return a parent parked on its child, the child in needs_attention with an
        open signal wait, and the child's own queued child."""
        parent = start(store)
        parent_claim = claim_run(store, parent).claim
        [child] = store.create_children(parent_claim, [new_run(key="c", parent_id=parent.run_id)])
        waits = [port.WaitSpec(f"child:{child.run_id}", "child")]
        assert store.park(parent_claim, [], waits, wake_at=None) is True
        claim = claim_run(store, child).claim
        [grandchild] = store.create_children(claim, [new_run(key="g", parent_id=child.run_id)])
        waits = [port.WaitSpec("x", "signal"), port.WaitSpec("z", "signal")]
        assert store.park(claim, [], waits, wake_at=None) is True
        store.settle_wait(child.run_id, "x", signaled(child.run_id, "x", clock.now()))
        claim = claim_run(store, child).claim
        store.begin_effect(claim, [entry(1, "started", name="charge")])
        store.finish(claim, [], state="needs_attention", error='{"code": "effect_outcome_unknown"}')
        assert get(store, child.run_id).state == "needs_attention"
        return parent, child, grandchild

    def test_request_cancel_reaches_a_run_in_needs_attention(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        parent, child, grandchild = self._parent_of_a_child_needing_attention(store, clock)
        before = kinds(store, child.run_id)

        assert store.request_cancel(parent.run_id) is True
        assert get(store, parent.run_id).state == "canceled"
        flagged = get(store, child.run_id)
        assert (flagged.state, flagged.cancel_requested) == ("needs_attention", True)
        assert kinds(store, child.run_id) == [*before, "cancel_requested"]
        # The walk goes through the run in needs_attention to its own child.
        assert get(store, grandchild.run_id).state == "canceled"
        # Its open wait is settled by the cancel, so a late signal gets that receipt.
        [z] = [o for o in store.outcomes(child.run_id) if o.name == "z"]
        assert z.outcome == "canceled"
        assert get(store, child.run_id).state == "needs_attention"
        assert store.request_cancel(parent.run_id) is False
        assert store.request_cancel(child.run_id) is False
        for run_id in (parent.run_id, child.run_id, grandchild.run_id):
            sequences = [r.sequence for r in store.history(run_id)]
            assert sequences == list(range(1, len(sequences) + 1))

    def test_resolve_with_an_output_ends_a_canceled_run_canceled(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        parent, child, _ = self._parent_of_a_child_needing_attention(store, clock)
        assert store.request_cancel(parent.run_id) is True
        settled = entry(1, name="charge")
        store.resolve(child.run_id, 2, settled, state="queued", error=None, note="it happened")
        after = get(store, child.run_id)
        assert (after.state, after.error, after.worker) == ("canceled", None, None)
        assert store.journal(child.run_id) == [settled]
        history = store.history(child.run_id)
        assert [r.kind for r in history][-3:] == ["cancel_requested", "resolved", "canceled"]
        assert (history[-2].step, history[-2].note) == ("charge", "it happened")
        assert [r.sequence for r in history] == list(range(1, len(history) + 1))
        assert after.ledger_sequence == history[-1].sequence
        # It ended: its records are gone (but the signal it never applied, kept to
        # answer its sender) and no worker can claim it.
        assert store.waits(APP, child.run_id) == []
        assert [o.name for o in store.outcomes(child.run_id)] == ["x"]
        assert store.claim(APP, WORKER, [(child.workflow, child.version)], lease_ttl=TTL) == []
        # The parent was canceled first, so it receives no outcome.
        assert store.outcomes(parent.run_id) == []
        assert get(store, parent.run_id).state == "canceled"

    def test_resolve_with_an_error_fails_a_canceled_run(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        _, child, _ = self._parent_of_a_child_needing_attention(store, clock)
        assert store.request_cancel(child.run_id) is True
        error = '{"code": "resolved_failed"}'
        failed = entry(1, "error", name="charge")
        store.resolve(child.run_id, 2, failed, state="failed", error=error, note="refunded")
        after = get(store, child.run_id)
        assert (after.state, after.error) == ("failed", error)
        assert kinds(store, child.run_id)[-2:] == ["cancel_requested", "resolved"]
        assert [o.name for o in store.outcomes(child.run_id)] == ["x"]  # never applied

    # == resolve ===========================================================

    def _needs_attention(self, store: port.Store) -> tuple[port.Run, port.Claim]:
        run = start(store)
        claim = claim_run(store, run).claim
        store.begin_effect(claim, [entry(1), entry(2, "started", name="charge")])
        store.finish(claim, [], state="needs_attention", error='{"code": "effect_outcome_unknown"}')
        stopped = get(store, run.run_id)
        assert (stopped.state, stopped.generation) == ("needs_attention", 1)
        return stopped, claim

    def test_resolve_requeues(self, store: port.Store, clock: clocks.FakeClock) -> None:
        run, _ = self._needs_attention(store)
        settled = entry(2, name="charge")
        clock.advance(5)
        store.resolve(run.run_id, 1, settled, state="queued", error=None, note="charge confirmed")
        after = get(store, run.run_id)
        assert (after.state, after.failures) == ("queued", 0)
        assert store.journal(run.run_id) == [entry(1), settled]
        receipt = store.history(run.run_id)[-1]
        assert (receipt.kind, receipt.note, receipt.at) == (
            "resolved",
            "charge confirmed",
            clock.now(),
        )
        again = claim_run(store, run)
        assert (again.claim.generation, again.journal) == (2, [entry(1), settled])

    def _child_waited_on(self, store: port.Store) -> tuple[port.Run, port.Run]:
        """Return a parent parked on its only child, and the child."""
        parent = start(store)
        claim = claim_run(store, parent).claim
        [child] = store.create_children(claim, [new_run(key="c", parent_id=parent.run_id)])
        waits = [port.WaitSpec(f"child:{child.run_id}", "child")]
        assert store.park(claim, [], waits, wake_at=None) is True
        return parent, child

    def test_needs_attention_keeps_the_run_records(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        parent, child = self._child_waited_on(store)
        claim = claim_run(store, child).claim
        x, _ = store.settle_wait(child.run_id, "x", signaled(child.run_id, "x", clock.now()))
        assert store.send(port.NewMessage(child.run_id, "inbox", "m", "1")) is True
        waits = [port.WaitSpec("y", "signal"), port.WaitSpec("z", "signal")]
        assert store.park(claim, [], waits, wake_at=None) is True
        y, _ = store.settle_wait(child.run_id, "y", signaled(child.run_id, "y", clock.now()))
        claim = claim_run(store, child).claim
        store.begin_effect(claim, [entry(1, "started")])
        store.finish(claim, [], state="needs_attention", error='{"code": "effect_outcome_unknown"}')
        assert get(store, child.run_id).state == "needs_attention"
        assert [w.name for w in store.waits(APP, child.run_id)] == ["z"]
        assert sorted(store.outcomes(child.run_id), key=lambda o: o.name) == [x, y]
        assert [m.key for m in messages(store, child.run_id, "inbox")] == ["m"]
        assert store.outcomes(parent.run_id) == []
        assert get(store, parent.run_id).state == "waiting"

    def test_resolve_fails_the_run(self, store: port.Store) -> None:
        parent, child = self._child_waited_on(store)
        claim = claim_run(store, child).claim
        store.begin_effect(claim, [entry(1, "started")])
        store.finish(claim, [], state="needs_attention", error='{"code": "effect_outcome_unknown"}')
        assert store.outcomes(parent.run_id) == []
        error = '{"code": "resolved_failed"}'
        failed = entry(1, "error")
        store.resolve(child.run_id, 1, failed, state="failed", error=error, note="refunded")
        after = get(store, child.run_id)
        assert (after.state, after.error) == ("failed", error)
        assert store.journal(child.run_id) == [failed]
        assert kinds(store, child.run_id)[-1] == "resolved"
        [outcome] = store.outcomes(parent.run_id)
        assert outcome.name == f"child:{child.run_id}"
        payload = child_payload(outcome)
        assert (payload["run_id"], payload["state"]) == (child.run_id, "failed")
        assert same_json(payload["error"], error), payload
        assert get(store, parent.run_id).state == "queued"

    def test_resolve_requeues_a_child_without_settling_the_parent(self, store: port.Store) -> None:
        parent, child = self._child_waited_on(store)
        claim = claim_run(store, child).claim
        store.begin_effect(claim, [entry(1, "started")])
        store.finish(claim, [], state="needs_attention", error='{"code": "effect_outcome_unknown"}')
        store.resolve(child.run_id, 1, entry(1), state="queued", error=None, note="it happened")
        assert get(store, child.run_id).state == "queued"
        assert store.outcomes(parent.run_id) == []
        assert get(store, parent.run_id).state == "waiting"

    @pytest.mark.parametrize(
        "why", ["not_needs_attention", "wrong_generation", "entry_ok", "no_entry"]
    )
    def test_resolve_refusals(self, store: port.Store, why: str) -> None:
        if why == "not_needs_attention":
            run = start(store)
            claim = claim_run(store, run).claim
            store.begin_effect(claim, [entry(1, "started")])
            generation, target = 1, entry(1)
        else:
            run, _ = self._needs_attention(store)
            generation, target = 1, entry(2, name="charge")
            if why == "wrong_generation":
                generation = 2
            elif why == "entry_ok":
                target = dataclasses.replace(entry(1), output='"other"')
            elif why == "no_entry":
                target = entry(3)
        before = snapshot(store)
        with pytest.raises(errors.NotResolvable):
            store.resolve(run.run_id, generation, target, state="queued", error=None, note="x")
        assert snapshot(store) == before
