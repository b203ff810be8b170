"""Conformance: finish, child runs and the end-of-run rules."""

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
    new_run,
    nonzero,
    same_json,
    signaled,
    start,
)


class FinishTests(Suite):
    """The conformance tests of finish, child runs and the end-of-run rules."""

    # == end of a run ======================================================

    def test_finish_stores_the_end_and_removes_run_records(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run = start(store)
        claim = claim_run(store, run).claim
        waits = [port.WaitSpec("a", "signal"), port.WaitSpec("b", "signal")]
        assert store.park(claim, [entry(1)], waits, wake_at=None)
        store.settle_wait(run.run_id, "a", signaled(run.run_id, "a", clock.now()))
        assert store.send(port.NewMessage(run.run_id, "inbox", "m", "1"))
        claim = claim_run(store, run).claim
        clock.advance(1)
        store.finish(claim, [entry(2)], state="succeeded", result='{"total": 3}')
        ended = get(store, run.run_id)
        assert (ended.state, ended.result, ended.error) == ("succeeded", '{"total": 3}', None)
        assert (ended.worker, ended.lease_expires_at, ended.updated_at) == (None, None, clock.now())
        assert store.journal(run.run_id) == [entry(1), entry(2)]
        assert store.waits(APP, run.run_id) == []
        # The signal the run never applied keeps its record (to answer its sender).
        assert [(o.name, o.signal_id) for o in store.outcomes(run.run_id)] == [("a", "sig-1")]
        assert store.next_message(run.run_id, "inbox", 0) is None
        assert kinds(store, run.run_id)[-1] == "finished"
        assert store.claim(APP, WORKER, [(run.workflow, "1")], lease_ttl=TTL) == []

    def test_a_signal_applied_by_the_last_write_is_not_kept(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run = start(store)
        claim = claim_run(store, run).claim
        waits = [port.WaitSpec("a", "signal"), port.WaitSpec("b", "signal")]
        assert store.park(claim, [], waits, wake_at=None)
        store.settle_wait(run.run_id, "a", signaled(run.run_id, "a", clock.now(), signal_id="s-a"))
        store.settle_wait(run.run_id, "b", signaled(run.run_id, "b", clock.now(), signal_id="s-b"))
        claim = claim_run(store, run).claim
        applied = port.JournalEntry(1, "wait", "a", "ok", '{"payload": 1}')
        store.finish(claim, [applied], state="succeeded", result="1")
        # Only the signal the run never applied is kept, to answer its sender.
        assert [(o.name, o.signal_id) for o in store.outcomes(run.run_id)] == [("b", "s-b")]
        assert store.journal(run.run_id) == [applied]

    def test_finish_with_error(self, store: port.Store) -> None:
        run = start(store)
        claim = claim_run(store, run).claim
        store.finish(claim, [], state="failed", error='{"code": "workflow_failed"}')
        ended = get(store, run.run_id)
        assert (ended.state, ended.result, ended.error) == (
            "failed",
            None,
            '{"code": "workflow_failed"}',
        )

    def test_create_children_is_idempotent_and_fenced(self, store: port.Store) -> None:
        parent = start(store)
        claim = claim_run(store, parent).claim
        wanted = [
            new_run(key=f"child-{i}", parent_id=parent.run_id, workflow="kid") for i in range(5)
        ]
        children = store.create_children(claim, wanted)
        assert [c.run_id for c in children] == [n.run_id for n in wanted]
        for child, new in zip(children, wanted, strict=True):
            assert (child.state, child.parent_id, child.key, child.app) == (
                "queued",
                parent.run_id,
                new.key,
                APP,
            )
            assert get(store, child.run_id) == child
            assert kinds(store, child.run_id) == ["initialized"]
        replay = [dataclasses.replace(n, run_id=str(uuid.uuid4())) for n in wanted]
        replay.append(new_run(key="child-5", parent_id=parent.run_id, workflow="kid"))
        again = store.create_children(claim, replay)
        assert [c.run_id for c in again[:5]] == [c.run_id for c in children]
        assert again[:5] == [get(store, c.run_id) for c in children]
        assert again[5].run_id == replay[5].run_id
        assert len(store.list_runs(APP, workflow="kid")) == 6
        assert nonzero(store.child_counts(parent.run_id)) == {"queued": 6}
        assert nonzero(store.child_counts(again[0].run_id)) == {}

    def test_create_children_refuses_a_child_without_a_key(self, store: port.Store) -> None:
        parent = start(store)
        claim = claim_run(store, parent).claim
        with pytest.raises(errors.InvalidInput, match="needs a key"):
            store.create_children(claim, [new_run(parent_id=parent.run_id)])
        assert nonzero(store.child_counts(parent.run_id)) == {}

    def test_child_counts_follow_child_states(self, store: port.Store) -> None:
        parent = start(store)
        claim = claim_run(store, parent).claim
        wanted = [new_run(key=f"c{i}", parent_id=parent.run_id) for i in range(3)]
        kids = store.create_children(claim, wanted)
        running = claim_run(store, kids[0]).claim
        done = claim_run(store, kids[1]).claim
        store.finish(done, [], state="succeeded", result="1")
        assert nonzero(store.child_counts(parent.run_id)) == {
            "queued": 1,
            "running": 1,
            "succeeded": 1,
        }
        store.finish(running, [], state="failed", error='"x"')
        assert nonzero(store.child_counts(parent.run_id)) == {
            "queued": 1,
            "failed": 1,
            "succeeded": 1,
        }

    @pytest.mark.parametrize("end", ["succeeded", "failed", "canceled_by_owner", "request_cancel"])
    def test_child_end_settles_and_wakes_the_waiting_parent(
        self, store: port.Store, clock: clocks.FakeClock, end: str
    ) -> None:
        parent = start(store)
        claim = claim_run(store, parent).claim
        [child] = store.create_children(claim, [new_run(key="c", parent_id=parent.run_id)])
        name = f"child:{child.run_id}"
        waits = [port.WaitSpec(name, "child")]
        assert store.park(claim, [entry(1, kind="child", name=name)], waits, wake_at=None)
        assert store.waits(APP, parent.run_id)[0].kind == "child"
        result, error, state = None, None, "canceled"
        if end == "request_cancel":
            assert store.request_cancel(child.run_id) is True
        else:
            child_claim = claim_run(store, child).claim
            if end == "succeeded":
                result, state = '{"total": 7}', "succeeded"
                store.finish(child_claim, [], state="succeeded", result=result)
            elif end == "failed":
                error, state = '{"code": "boom"}', "failed"
                store.finish(child_claim, [], state="failed", error=error)
            else:
                store.finish(child_claim, [], state="canceled")
        [outcome] = store.outcomes(parent.run_id)
        assert (outcome.run_id, outcome.name) == (parent.run_id, name)
        payload = child_payload(outcome)
        assert (payload["run_id"], payload["state"]) == (child.run_id, state)
        assert same_json(payload["result"], result), payload
        assert same_json(payload["error"], error), payload
        assert get(store, parent.run_id).state == "queued"
        assert store.waits(APP, parent.run_id) == []
        again = claim_run(store, parent)
        assert again.outcomes == [outcome]

    def test_child_end_wakes_only_a_parent_parked_on_that_child(self, store: port.Store) -> None:
        parent = start(store)
        claim = claim_run(store, parent).claim
        kids = [new_run(key=f"c{i}", parent_id=parent.run_id, workflow="kid") for i in range(2)]
        first, second = store.create_children(claim, kids)
        waits = [port.WaitSpec(f"child:{first.run_id}", "child")]
        assert store.park(claim, [], waits, wake_at=None)
        claims = {
            c.run.run_id: c.claim
            for c in store.claim(APP, WORKER, [("kid", "1")], lease_ttl=TTL, limit=2)
        }
        store.finish(claims[second.run_id], [], state="succeeded", result="2")
        assert [o.name for o in store.outcomes(parent.run_id)] == [f"child:{second.run_id}"]
        assert get(store, parent.run_id).state == "waiting"
        store.finish(claims[first.run_id], [], state="succeeded", result="1")
        assert get(store, parent.run_id).state == "queued"
        assert kinds(store, parent.run_id).count("woken") == 1

    def test_child_end_while_parent_runs_leaves_the_parent_running(self, store: port.Store) -> None:
        parent = start(store)
        claimed = claim_run(store, parent)
        [child] = store.create_children(claimed.claim, [new_run(key="c", parent_id=parent.run_id)])
        store.finish(claim_run(store, child).claim, [], state="succeeded", result="1")
        [outcome] = store.outcomes(parent.run_id)
        assert outcome.name == f"child:{child.run_id}"
        assert get(store, parent.run_id).state == "running"
        store.renew(claimed.claim, lease_ttl=TTL)
