"""Conformance: plan runs, their tasks' claims, fences and recovery (:mod:`perdure.store.planport`).

How plan runs end is tested in :mod:`.planends`. The plans here are small
shapes named by their edges; ``DIAMOND`` is ``a -> b, a -> c, (b, c) -> d``.
Each test starts its runs a moment apart on the fake clock, so that "oldest
run first" is well defined.
"""

from __future__ import annotations

import functools
import json
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest

from perdure import errors
from perdure.store import planport, port
from perdure.testing import clock as clocks
from perdure.testing.conformance.harness import (
    APP,
    OTHER_APP,
    OTHER_WORKER,
    TTL,
    WORKER,
    StoreHandle,
    Suite,
    get,
    kinds,
    run_threads,
)

PLAN = "nightly"
DIGEST = "digest-1"
Shape = tuple[tuple[str, tuple[str, ...], str], ...]
DIAMOND: Shape = (
    ("a", (), "idempotent"),
    ("b", ("a",), "pure"),
    ("c", ("a",), "once"),
    ("d", ("b", "c"), "idempotent"),
)
# A chain below ``a`` and a branch of its own (``x -> y``).
TWO_BRANCHES: Shape = (
    ("a", (), "idempotent"),
    ("x", (), "pure"),
    ("b", ("a",), "pure"),
    ("y", ("x",), "pure"),
    ("c", ("b",), "idempotent"),
)


def plans_of(store: port.Store) -> planport.PlanStore:
    """Return the store's plans section, or fail."""
    assert isinstance(store, planport.PlanStore), "the store keeps no plans"
    return store


def spec(
    shape: Shape = DIAMOND,
    *,
    digest: str = DIGEST,
    outputs: dict[str, str] | None = None,
    max_recoveries: int = 3,
) -> planport.PlanSpec:
    """Return the PlanSpec of ``shape``; ``outputs`` admit tasks as already succeeded."""
    done = outputs or {}
    tasks = tuple(
        planport.TaskSpec(name, parents, effect, i, done.get(name))
        for i, (name, parents, effect) in enumerate(shape)
    )
    return planport.PlanSpec(digest, 1, tasks, max_recoveries)


def start_plan(
    store: port.Store,
    clock: clocks.FakeClock,
    plan: planport.PlanSpec | None = None,
    *,
    workflow: str = PLAN,
    app: str = APP,
) -> port.Run:
    """Create a plan run; move the clock on so that the next one is younger."""
    new = port.NewRun(
        str(uuid.uuid4()), app, workflow, "1", '{"args": [1], "kwargs": {}}', plan=plan or spec()
    )
    run, created = store.create_run(new)
    assert created
    clock.advance(0.001)
    return run


def claim(
    store: port.Store,
    *,
    worker: str = WORKER,
    limit: int = 10,
    digest: str = DIGEST,
    workflow: str = PLAN,
    lease_ttl: float = TTL,
    recover_until: datetime | None = None,
) -> list[planport.TaskClaim]:
    """Claim tasks of the suite's plan as served with ``digest``."""
    return plans_of(store).claim_tasks(
        APP,
        worker,
        [(workflow, "1", digest)],
        lease_ttl=lease_ttl,
        limit=limit,
        recover_until=recover_until,
    )


def names(claims: list[planport.TaskClaim]) -> list[str]:
    """Return the claimed tasks' names, in claim order."""
    return [c.task for c in claims]


def states(store: port.Store, run_id: str) -> dict[str, str]:
    """Return each task's state by name."""
    return {t.name: t.state for t in plans_of(store).tasks(run_id)}


def task(store: port.Store, run_id: str, name: str) -> planport.Task:
    """Return one stored task, or fail."""
    found = [t for t in plans_of(store).tasks(run_id) if t.name == name]
    assert found, f"run {run_id} has no task {name!r}"
    return found[0]


def only(claims: list[planport.TaskClaim], name: str) -> planport.TaskClaim:
    """Return the claim of task ``name`` among ``claims``, or fail."""
    found = [c for c in claims if c.task == name]
    assert len(found) == 1, f"expected one claim of {name!r}, got {names(claims)}"
    return found[0]


def finish_all(store: port.Store, run_id: str) -> None:
    """Claim and complete the run's tasks, with their names as outputs, until none is left."""
    while got := [c for c in claim(store) if c.run_id == run_id]:
        for each in got:
            plans_of(store).complete_task(each, json.dumps(each.task))


def error_of(text: str | None) -> dict[str, Any]:
    """Decode a run's or task's error, which must be a JSON object."""
    assert text is not None, "an error was expected"
    value = json.loads(text)
    assert isinstance(value, dict)
    return value


def task_failure(message: str = "it broke") -> str:
    """Return a task error as the engine writes it."""
    return json.dumps({"code": "boom", "message": message})


def lapse(clock: clocks.FakeClock) -> datetime:
    """Move past every lease of TTL; return the instant a recovery may trust."""
    return clock.advance(TTL + 1)


TASK_WRITES: dict[str, Callable[[planport.PlanStore, planport.TaskClaim], object]] = {
    "complete_task": lambda s, c: s.complete_task(c, "1"),
    "fail_task": lambda s, c: s.fail_task(c, task_failure()),
    "fail_task_needs_attention": lambda s, c: s.fail_task(
        c, task_failure(), state="needs_attention"
    ),
    "renew_task": lambda s, c: s.renew_task(c, lease_ttl=TTL),
    "begin_task_effect": lambda s, c: s.begin_task_effect(c, 1),
    "retry_task": lambda s, c: s.retry_task(c, 2, task_failure()),
    "release_task": lambda s, c: s.release_task(c),
}
"""Every write made for a claimed task, by name."""


class PlanTests(Suite):
    """The conformance tests of plan runs: creation, claims, fences and recovery."""

    # == creation ==========================================================

    def test_a_plan_run_starts_running_with_its_tasks_pending(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        created_at = clock.now()
        run = start_plan(store, clock)
        assert (run.state, run.worker, run.generation) == ("running", None, 0)
        assert (run.plan_digest, run.plan_policy) == (DIGEST, 1)
        assert get(store, run.run_id) == run
        tasks = plans_of(store).tasks(run.run_id)
        assert [(t.name, t.position, t.parents, t.effect) for t in tasks] == [
            ("a", 0, (), "idempotent"),
            ("b", 1, ("a",), "pure"),
            ("c", 2, ("a",), "once"),
            ("d", 3, ("b", "c"), "idempotent"),
        ]
        for t in tasks:
            assert (t.run_id, t.state, t.generation, t.attempt, t.recoveries) == (
                run.run_id,
                "pending",
                0,
                0,
                0,
            )
            assert (t.max_recoveries, t.worker, t.lease_expires_at, t.effect_started) == (
                3,
                None,
                None,
                False,
            )
            assert (t.output, t.error, t.blocked_by, t.created_at) == (None, None, None, created_at)
        assert kinds(store, run.run_id) == ["initialized"]

    def test_a_workflow_run_has_no_tasks(self, store: port.Store) -> None:
        new = port.NewRun(str(uuid.uuid4()), APP, "wf", "1", "{}")
        run, _ = store.create_run(new)
        assert (run.plan_digest, run.plan_policy) == (None, None)
        assert plans_of(store).tasks(run.run_id) == []
        assert plans_of(store).tasks(str(uuid.uuid4())) == []

    def test_a_forks_outputs_are_admitted_as_succeeded(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run = start_plan(store, clock, spec(outputs={"a": "10", "b": '"bee"'}))
        assert states(store, run.run_id) == {
            "a": "succeeded",
            "b": "succeeded",
            "c": "pending",
            "d": "pending",
        }
        assert task(store, run.run_id, "a").output == "10"
        [c] = claim(store)
        assert (c.task, c.parents, c.attempt, c.generation) == ("c", {"a": "10"}, 1, 1)
        plans_of(store).complete_task(c, "3")
        [d] = claim(store)
        assert (d.task, d.parents) == ("d", {"b": '"bee"', "c": "3"})

    def test_a_plan_whose_tasks_all_arrive_succeeded_ends_at_once(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        outputs = {"a": "1", "b": "2", "c": "3", "d": '{"n": 4}'}
        run = start_plan(store, clock, spec(outputs=outputs))
        assert run.state == "succeeded"
        assert json.loads(run.result or "") == {"a": 1, "b": 2, "c": 3, "d": {"n": 4}}
        assert get(store, run.run_id).state == "succeeded"
        assert claim(store) == []

    # == claims ============================================================

    def test_claim_takes_roots_first_then_children_whose_parents_all_succeeded(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run = start_plan(store, clock)
        [a] = claim(store)
        assert a == planport.TaskClaim(
            run_id=run.run_id,
            task="a",
            worker=WORKER,
            generation=1,
            lease_expires_at=clock.now() + timedelta(seconds=TTL),
            attempt=1,
            effect="idempotent",
            app=APP,
            workflow=PLAN,
            version="1",
            input=run.input,
            parents={},
            recovered=False,
        )
        stored = task(store, run.run_id, "a")
        assert (stored.state, stored.worker, stored.generation, stored.attempt) == (
            "running",
            WORKER,
            1,
            1,
        )
        assert stored.lease_expires_at == a.lease_expires_at
        assert claim(store) == []
        plans_of(store).complete_task(a, "10")
        children = claim(store)
        assert names(children) == ["b", "c"]  # declaration order
        assert [c.parents for c in children] == [{"a": "10"}, {"a": "10"}]
        plans_of(store).complete_task(children[0], "2")
        assert claim(store) == [], "d must wait for every parent"
        plans_of(store).complete_task(children[1], "3")
        [d] = claim(store)
        assert (d.task, d.parents) == ("d", {"b": "2", "c": "3"})

    def test_claim_takes_the_oldest_run_first_and_respects_limit(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        shape: Shape = (("p", (), "pure"), ("q", (), "pure"), ("r", (), "pure"))
        first = start_plan(store, clock, spec(shape))
        second = start_plan(store, clock, spec(shape))
        got = claim(store, limit=4)
        assert [(c.run_id, c.task) for c in got] == [
            (first.run_id, "p"),
            (first.run_id, "q"),
            (first.run_id, "r"),
            (second.run_id, "p"),
        ]
        assert [(c.run_id, c.task) for c in claim(store, limit=1)] == [(second.run_id, "q")]
        assert [(c.run_id, c.task) for c in claim(store)] == [(second.run_id, "r")]

    def test_claim_takes_only_the_apps_served_plans(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        start_plan(store, clock, app=OTHER_APP)
        start_plan(store, clock, workflow="other-plan")
        plan_store = plans_of(store)
        assert claim(store) == []
        assert plan_store.claim_tasks(APP, WORKER, [], lease_ttl=TTL) == []
        assert plan_store.claim_tasks(APP, WORKER, [(PLAN, "2", DIGEST)], lease_ttl=TTL) == []
        for run in store.list_runs(APP) + store.list_runs(OTHER_APP):
            assert states(store, run.run_id) == dict.fromkeys("abcd", "pending")
            assert get(store, run.run_id).state == "running"

    def test_claim_refuses_a_bad_worker_id_and_ttl(self, store: port.Store) -> None:
        with pytest.raises(errors.InvalidInput):
            claim(store, worker="")
        with pytest.raises(errors.InvalidInput):
            claim(store, lease_ttl=0)

    def test_concurrent_claimers_never_take_one_task_twice(
        self, handle: StoreHandle, clock: clocks.FakeClock
    ) -> None:
        shape: Shape = tuple((f"t{i}", (), "pure") for i in range(6))
        runs = {start_plan(handle.store, clock, spec(shape)).run_id for _ in range(4)}
        stores = [handle.reopen(), handle.reopen()]

        def drain(s: port.Store, worker: str) -> list[tuple[str, str, int]]:
            got: list[tuple[str, str, int]] = []
            while claimed := claim(s, worker=worker, limit=2):
                got.extend((c.run_id, c.task, c.generation) for c in claimed)
            return got

        workers = (WORKER, OTHER_WORKER)
        results = run_threads(
            [functools.partial(drain, s, w) for s, w in zip(stores, workers, strict=True)]
        )
        taken = [each for got in results for each in got]
        assert sorted((r, t) for r, t, _ in taken) == sorted(
            (r, f"t{i}") for r in runs for i in range(6)
        )
        assert {g for _, _, g in taken} == {1}

    def test_a_canceled_runs_tasks_are_not_claimed(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run = start_plan(store, clock)
        assert store.request_cancel(run.run_id) is True
        assert claim(store) == []
        assert states(store, run.run_id) == dict.fromkeys("abcd", "canceled")

    def test_a_run_of_another_shape_needs_attention_and_runs_nothing(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run = start_plan(store, clock)
        assert claim(store, digest="digest-2") == []
        after = get(store, run.run_id)
        assert after.state == "needs_attention"
        assert error_of(after.error)["code"] == planport.PLAN_MISMATCH
        assert states(store, run.run_id) == dict.fromkeys("abcd", "pending")
        assert kinds(store, run.run_id) == ["initialized", "finished"]
        assert claim(store) == [], "a run that needs attention is not claimed"

    def test_a_worker_not_serving_the_plan_claims_nothing(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run = start_plan(store, clock)
        assert claim(store, workflow="another") == []
        assert get(store, run.run_id).state == "running"
        assert states(store, run.run_id) == dict.fromkeys("abcd", "pending")

    # == fences ============================================================

    @pytest.mark.parametrize("write", sorted(TASK_WRITES))
    def test_every_task_write_with_a_stale_generation_changes_nothing(
        self, store: port.Store, clock: clocks.FakeClock, write: str
    ) -> None:
        run = start_plan(store, clock)
        [old] = claim(store)
        until = lapse(clock)
        [new] = claim(store, worker=OTHER_WORKER, recover_until=until)
        assert (new.task, new.generation, new.recovered) == ("a", 2, True)
        before = (get(store, run.run_id), plans_of(store).tasks(run.run_id))
        history = store.history(run.run_id)
        with pytest.raises(errors.StaleClaim):
            TASK_WRITES[write](plans_of(store), old)
        assert (get(store, run.run_id), plans_of(store).tasks(run.run_id)) == before
        assert store.history(run.run_id) == history

    @pytest.mark.parametrize("write", sorted(TASK_WRITES))
    def test_no_task_write_follows_the_tasks_end(
        self, store: port.Store, clock: clocks.FakeClock, write: str
    ) -> None:
        run = start_plan(store, clock)
        [a] = claim(store)
        plans_of(store).complete_task(a, "1")
        before = plans_of(store).tasks(run.run_id)
        with pytest.raises(errors.StaleClaim):
            TASK_WRITES[write](plans_of(store), a)
        assert plans_of(store).tasks(run.run_id) == before

    def test_renew_extends_the_lease_and_keeps_the_task(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run = start_plan(store, clock)
        [a] = claim(store, lease_ttl=10)
        clock.advance(8)
        renewed = plans_of(store).renew_task(a, lease_ttl=10)
        assert renewed.lease_expires_at == clock.now() + timedelta(seconds=10)
        assert task(store, run.run_id, "a").lease_expires_at == renewed.lease_expires_at
        clock.advance(8)
        assert claim(store, worker=OTHER_WORKER, recover_until=clock.now()) == []
        plans_of(store).complete_task(renewed, "1")

    def test_effect_and_retry_are_recorded_on_the_task(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run = start_plan(store, clock)
        [a] = claim(store)
        plans_of(store).begin_task_effect(a, 1)
        assert (
            task(store, run.run_id, "a").effect_started,
            task(store, run.run_id, "a").attempt,
        ) == (
            True,
            1,
        )
        plans_of(store).retry_task(a, 2, task_failure("first"))
        after = task(store, run.run_id, "a")
        assert (after.effect_started, after.attempt, after.state) == (False, 2, "running")
        assert error_of(after.error)["message"] == "first"

    # == recovery ==========================================================

    def test_a_lapsed_task_is_recovered_by_the_next_claim(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run = start_plan(store, clock)
        [first] = claim(store, lease_ttl=10)
        clock.advance(9)
        assert claim(store, worker=OTHER_WORKER, recover_until=clock.now()) == []
        clock.advance(2)
        [again] = claim(store, worker=OTHER_WORKER, recover_until=clock.now())
        assert (again.task, again.generation, again.attempt, again.recovered) == ("a", 2, 2, True)
        assert again.worker == OTHER_WORKER
        stored = task(store, run.run_id, "a")
        assert (stored.recoveries, stored.worker, stored.generation) == (1, OTHER_WORKER, 2)
        assert kinds(store, run.run_id)[-2:] == ["task_recovered", "task_claimed"]
        # Receipts carry the run's generation (a plan run is never claimed whole,
        # so its ledger never goes back one); the note names the task's.
        last = store.history(run.run_id)[-2:]
        assert [r.generation for r in last] == [0, 0]
        assert all((r.note or "").startswith("task generation 2") for r in last)
        assert first.generation == 1

    def test_recover_until_bounds_recovery(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run = start_plan(store, clock)
        claim(store)
        before = lapse(clock)
        clock.advance(1)
        assert claim(store, worker=OTHER_WORKER, recover_until=None) == []
        assert claim(store, worker=OTHER_WORKER, recover_until=before) == []
        stored = task(store, run.run_id, "a")
        assert (stored.state, stored.worker, stored.recoveries) == ("running", WORKER, 0)
        assert len(claim(store, worker=OTHER_WORKER, recover_until=clock.now())) == 1

    def test_a_task_past_max_recoveries_needs_attention_and_blocks_its_descendants(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run = start_plan(store, clock, spec(TWO_BRANCHES, max_recoveries=1))
        assert names(claim(store, limit=1)) == ["a"]
        [again] = claim(store, worker=OTHER_WORKER, limit=1, recover_until=lapse(clock))
        assert (again.task, again.recovered) == ("a", True)
        got = claim(store, recover_until=lapse(clock))
        assert names(got) == ["x"], "a poisoned task is not claimed again"
        a = task(store, run.run_id, "a")
        assert (a.state, a.recoveries) == ("needs_attention", 1)
        assert error_of(a.error)["code"] == planport.POISON_TASK
        assert error_of(a.error)["task"] == "a"
        assert [(t.name, t.state, t.blocked_by) for t in plans_of(store).tasks(run.run_id)] == [
            ("a", "needs_attention", None),
            ("x", "running", None),
            ("b", "blocked", "a"),
            ("y", "pending", None),
            ("c", "blocked", "a"),
        ]
        assert get(store, run.run_id).state == "running"
        plans_of(store).complete_task(got[0], "1")
        [y] = claim(store)
        end = plans_of(store).complete_task(y, "2")
        assert end.run_state == "needs_attention"
        error = error_of(get(store, run.run_id).error)
        assert (error["code"], error["task"]) == (planport.POISON_TASK, "a")

    def test_a_lapsed_once_task_whose_effect_started_is_never_run_again(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        shape: Shape = (("pay", (), "once"), ("mail", ("pay",), "pure"))
        run = start_plan(store, clock, spec(shape))
        [pay] = claim(store)
        plans_of(store).begin_task_effect(pay, 1)
        assert claim(store, worker=OTHER_WORKER, recover_until=lapse(clock)) == []
        stored = task(store, run.run_id, "pay")
        assert stored.state == "needs_attention"
        assert error_of(stored.error)["code"] == planport.EFFECT_OUTCOME_UNKNOWN
        assert task(store, run.run_id, "mail").state == "blocked"
        after = get(store, run.run_id)
        assert after.state == "needs_attention"
        assert error_of(after.error)["code"] == planport.EFFECT_OUTCOME_UNKNOWN
        assert claim(store, recover_until=lapse(clock)) == []
        with pytest.raises(errors.StaleClaim):
            plans_of(store).complete_task(pay, "1")

    def test_a_lapsed_once_task_whose_effect_did_not_start_is_recovered(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        shape: Shape = (("pay", (), "once"),)
        start_plan(store, clock, spec(shape))
        claim(store)
        [again] = claim(store, worker=OTHER_WORKER, recover_until=lapse(clock))
        assert (again.task, again.recovered, again.generation) == ("pay", True, 2)
