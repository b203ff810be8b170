"""Conformance: how plan runs end: failures, cancels, resolve, release, receipts, retention."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta

import pytest

from perdure import errors
from perdure.store import planport, port, retention
from perdure.testing import clock as clocks
from perdure.testing.conformance.harness import (
    APP,
    OTHER_WORKER,
    TTL,
    WORKER,
    Suite,
    get,
    kinds,
)
from perdure.testing.conformance.plans import (
    TWO_BRANCHES,
    Shape,
    claim,
    error_of,
    finish_all,
    lapse,
    plans_of,
    spec,
    start_plan,
    states,
    task,
    task_failure,
)


class PlanEndTests(Suite):
    """The conformance tests of plan runs: failure, cancel, resolve, release and receipts."""

    # == failure and success ===============================================

    def test_a_failed_task_blocks_its_descendants_and_the_run_fails_after_the_rest(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run = start_plan(store, clock, spec(TWO_BRANCHES))
        a, x = claim(store)
        end = plans_of(store).fail_task(a, task_failure("no disk"))
        assert end == planport.TaskEnd(run_state="running", blocked=("b", "c"))
        assert [(t.name, t.state, t.blocked_by) for t in plans_of(store).tasks(run.run_id)] == [
            ("a", "failed", None),
            ("x", "running", None),
            ("b", "blocked", "a"),
            ("y", "pending", None),
            ("c", "blocked", "a"),
        ]
        assert error_of(task(store, run.run_id, "a").error)["message"] == "no disk"
        plans_of(store).complete_task(x, "1")
        [y] = claim(store)
        assert get(store, run.run_id).state == "running"
        end = plans_of(store).complete_task(y, "2")
        assert end == planport.TaskEnd(run_state="failed")
        after = get(store, run.run_id)
        assert (after.state, after.result) == ("failed", None)
        error = error_of(after.error)
        assert (error["code"], error["task"]) == (planport.TASK_FAILED, "a")
        assert "no disk" in error["message"]
        assert error["tasks"] == {"failed": ["a"], "needs_attention": [], "blocked": ["b", "c"]}
        assert claim(store) == []

    def test_a_task_failing_as_needs_attention_ends_the_run_so(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run = start_plan(store, clock)
        [a] = claim(store)
        with pytest.raises(errors.InvalidInput):
            plans_of(store).fail_task(a, task_failure(), state="canceled")  # type: ignore[arg-type]
        error = json.dumps({"code": "effect_outcome_unknown", "message": "timed out"})
        end = plans_of(store).fail_task(a, error, state="needs_attention")
        assert end == planport.TaskEnd(run_state="needs_attention", blocked=("b", "c", "d"))
        after = error_of(get(store, run.run_id).error)
        assert (after["code"], after["task"]) == ("effect_outcome_unknown", "a")

    def test_a_plan_run_succeeds_with_its_outputs_by_task_name(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run = start_plan(store, clock)
        finish_all(store, run.run_id)
        after = get(store, run.run_id)
        assert (after.state, after.error, after.worker) == ("succeeded", None, None)
        assert json.loads(after.result or "") == {"a": "a", "b": "b", "c": "c", "d": "d"}
        assert kinds(store, run.run_id)[-1] == "finished"
        assert set(states(store, run.run_id).values()) == {"succeeded"}

    # == cancel ============================================================

    def test_cancel_of_a_plan_with_nothing_running_ends_it_at_once(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run = start_plan(store, clock, spec(outputs={"a": "1"}))
        assert store.request_cancel(run.run_id) is True
        after = get(store, run.run_id)
        assert after.state == "canceled"
        assert states(store, run.run_id) == {
            "a": "succeeded",
            "b": "canceled",
            "c": "canceled",
            "d": "canceled",
        }

    def test_cancel_lets_a_live_worker_finish_its_task_first(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run = start_plan(store, clock, spec(TWO_BRANCHES))
        a, x = claim(store)
        assert store.request_cancel(run.run_id) is True
        assert get(store, run.run_id).state == "running"
        assert states(store, run.run_id) == {
            "a": "running",
            "x": "running",
            "b": "canceled",
            "y": "canceled",
            "c": "canceled",
        }
        plans_of(store).renew_task(a, lease_ttl=TTL)  # a cancel does not end a lease
        assert plans_of(store).complete_task(a, "1").run_state == "running"
        end = plans_of(store).fail_task(x, task_failure())
        assert end.run_state == "canceled"
        assert get(store, run.run_id).state == "canceled"
        assert task(store, run.run_id, "a").state == "succeeded"

    @pytest.mark.parametrize("effect", ["idempotent", "once"])
    def test_a_lapsed_effectful_task_of_a_canceled_run_needs_attention(
        self, store: port.Store, clock: clocks.FakeClock, effect: str
    ) -> None:
        run = start_plan(store, clock, spec((("t", (), effect), ("u", ("t",), "pure"))))
        claim(store)
        store.request_cancel(run.run_id)
        assert claim(store, recover_until=None) == []
        assert get(store, run.run_id).state == "running", "only a trusted clock settles it"
        assert claim(store, worker=OTHER_WORKER, recover_until=lapse(clock)) == []
        after = get(store, run.run_id)
        assert after.state == "needs_attention"
        error = error_of(after.error)
        assert (error["code"], error["task"]) == (planport.EFFECT_OUTCOME_UNKNOWN, "t")
        assert states(store, run.run_id) == {"t": "needs_attention", "u": "canceled"}

    def test_a_lapsed_pure_task_of_a_canceled_run_is_canceled(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run = start_plan(store, clock, spec((("t", (), "pure"), ("u", ("t",), "pure"))))
        claim(store)
        store.request_cancel(run.run_id)
        assert claim(store, worker=OTHER_WORKER, recover_until=lapse(clock)) == []
        assert get(store, run.run_id).state == "canceled"
        assert states(store, run.run_id) == {"t": "canceled", "u": "canceled"}

    # == operators =========================================================

    def test_resolve_task_unblocks_its_descendants_and_the_run_goes_on(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run = start_plan(store, clock)
        [a] = claim(store)
        plans_of(store).fail_task(a, task_failure(), state="needs_attention")
        assert get(store, run.run_id).state == "needs_attention"
        end = plans_of(store).resolve_task(run.run_id, "a", '"fixed"')
        assert end == planport.TaskEnd(run_state="running")
        after = get(store, run.run_id)
        assert (after.state, after.error) == ("running", None)
        assert states(store, run.run_id) == {
            "a": "succeeded",
            "b": "pending",
            "c": "pending",
            "d": "pending",
        }
        assert [c.parents for c in claim(store)] == [{"a": '"fixed"'}] * 2
        assert kinds(store, run.run_id)[-3:] == ["resolved", "task_claimed", "task_claimed"]

    def test_resolve_task_leaves_blocked_what_another_failure_holds(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run = start_plan(store, clock, spec(outputs={"a": "1"}))
        b, c = claim(store)
        plans_of(store).fail_task(b, task_failure(), state="needs_attention")
        end = plans_of(store).fail_task(c, task_failure())
        assert end.run_state == "needs_attention"
        end = plans_of(store).resolve_task(run.run_id, "b", "2")
        assert end.run_state == "failed"
        assert task(store, run.run_id, "d").state == "blocked"
        error = error_of(get(store, run.run_id).error)
        assert (error["code"], error["task"]) == (planport.TASK_FAILED, "c")

    def test_resolve_task_refuses_what_does_not_need_attention(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run = start_plan(store, clock)
        workflow_run, _ = store.create_run(port.NewRun(str(uuid.uuid4()), APP, "wf", "1", "{}"))
        with pytest.raises(errors.NotResolvable):
            plans_of(store).resolve_task(run.run_id, "a", "1")
        with pytest.raises(errors.NotResolvable):
            plans_of(store).resolve_task(run.run_id, "zz", "1")
        with pytest.raises(errors.NotResolvable):
            plans_of(store).resolve_task(workflow_run.run_id, "a", "1")
        with pytest.raises(errors.RunNotFound):
            plans_of(store).resolve_task(str(uuid.uuid4()), "a", "1")
        assert states(store, run.run_id) == dict.fromkeys("abcd", "pending")

    def test_a_released_task_waits_for_its_delay(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run = start_plan(store, clock)
        [a] = claim(store)
        plans_of(store).release_task(a, delay=60)
        stored = task(store, run.run_id, "a")
        assert (stored.state, stored.worker, stored.attempt) == ("pending", None, 0)
        assert stored.ready_at == clock.now() + timedelta(seconds=60)
        with pytest.raises(errors.InvalidInput):
            plans_of(store).release_task(a, delay=-1)
        clock.advance(59)
        assert claim(store) == []
        clock.advance(2)
        [again] = claim(store)
        assert (again.task, again.generation, again.attempt, again.recovered) == ("a", 2, 1, False)

    # == receipts and retention ============================================

    def test_task_transitions_leave_receipts(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run = start_plan(store, clock)
        [a] = claim(store)
        plans_of(store).complete_task(a, "1")
        b, c = claim(store)
        plans_of(store).begin_task_effect(c, 1)
        plans_of(store).fail_task(c, task_failure())
        [b2] = claim(store, worker=OTHER_WORKER, recover_until=lapse(clock))
        plans_of(store).complete_task(b2, "2")
        found = [(r.kind, r.step, r.worker) for r in store.history(run.run_id)]
        assert found == [
            ("initialized", None, None),
            ("task_claimed", "a", WORKER),
            ("task_completed", "a", WORKER),
            ("task_claimed", "b", WORKER),
            ("task_claimed", "c", WORKER),
            ("effect_started", "c", WORKER),
            ("task_failed", "c", WORKER),
            ("task_blocked", "d", WORKER),
            ("task_recovered", "b", OTHER_WORKER),
            ("task_claimed", "b", OTHER_WORKER),
            ("task_completed", "b", OTHER_WORKER),
            ("finished", None, None),
        ]
        assert [r.sequence for r in store.history(run.run_id)] == list(range(1, 13))
        assert get(store, run.run_id).ledger_sequence == 12
        assert b.generation == 1

    @pytest.mark.parametrize("ledger_limit", [5])
    def test_a_plans_ledger_stays_bounded(
        self, store: port.Store, clock: clocks.FakeClock, ledger_limit: int
    ) -> None:
        shape: Shape = tuple((f"t{i}", (), "pure") for i in range(8))
        run = start_plan(store, clock, spec(shape))
        finish_all(store, run.run_id)
        history = store.history(run.run_id)
        total = 1 + 2 * 8 + 1
        assert [r.sequence for r in history] == list(range(total - ledger_limit + 1, total + 1))
        assert history[-1].kind == "finished"

    def test_prune_deletes_a_plan_runs_tasks_with_it(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        assert isinstance(store, retention.PrunableStore)
        ended = start_plan(store, clock)
        finish_all(store, ended.run_id)
        living = start_plan(store, clock)
        clock.advance(60)
        assert store.prune(APP, clock.now()) == 1
        assert store.get_run(ended.run_id) is None
        assert plans_of(store).tasks(ended.run_id) == []
        assert len(plans_of(store).tasks(living.run_id)) == 4
