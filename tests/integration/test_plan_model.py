"""A model of one plan run's tasks, driven against the store by a hypothesis state machine.

Random small DAGs go through claims by two workers (two Store objects on one
database), completions, failures, effects, renewals, lease lapses on the fake
clock (a worker gone), recoveries and cancels. After every step the store's
tasks and run must be what the model says: no task claimed twice under one
generation, no task running or succeeded below a parent that has not
succeeded, and the run ends exactly when the model ends it, in its state.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from perdure import errors
from perdure.store import open_store, planport, port
from perdure.testing.clock import FakeClock

APP = "plan-model"
TTL = 30.0
WORKERS = ("worker-1", "worker-2")


@st.composite
def shapes(draw: st.DrawFn) -> list[tuple[str, tuple[str, ...], str]]:
    """A DAG of 1-5 tasks, each with parents among the tasks declared before it."""
    count = draw(st.integers(1, 5))
    found: list[tuple[str, tuple[str, ...], str]] = []
    for i in range(count):
        parents = draw(st.sets(st.integers(0, i - 1), max_size=2)) if i else set()
        effect = draw(st.sampled_from(["pure", "idempotent", "once"]))
        found.append((f"t{i}", tuple(f"t{p}" for p in sorted(parents)), effect))
    return found


@dataclass
class ModelTask:
    name: str
    parents: tuple[str, ...]
    effect: str
    state: str = "pending"
    generation: int = 0
    recoveries: int = 0
    lease: datetime | None = None
    effect_started: bool = False


@dataclass
class Model:
    """What the store must hold: each task's state and claim, and the run's state."""

    tasks: dict[str, ModelTask]
    max_recoveries: int
    run_state: str = "running"
    canceling: bool = False
    children: dict[str, list[str]] = field(default_factory=dict)

    def descendants(self, name: str) -> list[str]:
        seen: list[str] = []
        todo = [name]
        while todo:
            for t in self.tasks.values():
                if todo[0] in t.parents and t.name not in seen:
                    seen.append(t.name)
                    todo.append(t.name)
            todo.pop(0)
        return seen

    def end(self, name: str, state: str) -> None:
        task = self.tasks[name]
        task.state, task.lease = state, None
        if state in ("failed", "needs_attention"):
            for d in self.descendants(name):
                if self.tasks[d].state == "pending":
                    self.tasks[d].state = "blocked"
        self.settle()

    def settle(self) -> None:
        found = [t.state for t in self.tasks.values()]
        if self.run_state != "running" or any(s in ("pending", "running") for s in found):
            return
        if all(s == "succeeded" for s in found):
            self.run_state = "succeeded"
        elif "needs_attention" in found:
            self.run_state = "needs_attention"
        else:
            self.run_state = "canceled" if self.canceling else "failed"

    def current(self, claim: planport.TaskClaim) -> bool:
        task = self.tasks[claim.task]
        return task.state == "running" and task.generation == claim.generation

    def claim(self, now: datetime, limit: int, recover: bool) -> list[str]:
        """Apply a claim_tasks call; return the tasks it claims, in order."""
        if recover and self.canceling and self.run_state == "running":
            for t in self.tasks.values():
                if t.state == "running" and t.lease is not None and t.lease <= now:
                    self.end(t.name, "canceled" if t.effect == "pure" else "needs_attention")
        if self.run_state != "running" or self.canceling:
            return []

        def candidate(t: ModelTask) -> bool:
            if t.state == "pending":
                return all(self.tasks[p].state == "succeeded" for p in t.parents)
            lapsed = t.lease is not None and t.lease <= now
            return recover and t.state == "running" and lapsed

        found = [t.name for t in self.tasks.values() if candidate(t)][:limit]
        claimed: list[str] = []
        for name in found:
            task = self.tasks[name]
            if self.run_state != "running":
                continue
            lapsed = task.state == "running"
            if lapsed and task.effect == "once" and task.effect_started:
                self.end(name, "needs_attention")
                continue
            if lapsed and task.recoveries >= self.max_recoveries:
                self.end(name, "needs_attention")
                continue
            if not candidate(task):
                continue
            task.state, task.generation = "running", task.generation + 1
            task.recoveries += lapsed
            task.lease, task.effect_started = now + timedelta(seconds=TTL), False
            claimed.append(name)
        return claimed


class PlanMachine(RuleBasedStateMachine):
    """One plan run per example, on the database of the test that runs the machine."""

    url: str = ""

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.stores: list[Any] = []
        self.claims: list[planport.TaskClaim] = []
        self.issued: set[tuple[str, int]] = set()
        self.workflow = f"plan-{uuid.uuid4().hex[:10]}"
        self.model: Model | None = None

    @initialize(shape=shapes(), max_recoveries=st.integers(0, 2))
    def start(self, shape: list[tuple[str, tuple[str, ...], str]], max_recoveries: int) -> None:
        for _ in WORKERS:
            self.stores.append(open_store(self.url, clock=self.clock, migrate=False))
        tasks = tuple(
            planport.TaskSpec(name, parents, effect, i)
            for i, (name, parents, effect) in enumerate(shape)
        )
        plan = planport.PlanSpec("digest", 1, tasks, max_recoveries)
        self.run_id = str(uuid.uuid4())
        new = port.NewRun(self.run_id, APP, self.workflow, "1", "{}", plan=plan)
        run, created = self.stores[0].create_run(new)
        assert created and run.state == "running"
        self.model = Model(
            {n: ModelTask(n, p, e) for n, p, e in shape}, max_recoveries=max_recoveries
        )

    def teardown(self) -> None:
        for each in self.stores:
            each.close()

    @property
    def m(self) -> Model:
        assert self.model is not None
        return self.model

    # -- rules ------------------------------------------------------------------

    @rule(worker=st.sampled_from([0, 1]), limit=st.integers(1, 3), recover=st.booleans())
    def claim(self, worker: int, limit: int, recover: bool) -> None:
        now = self.clock.now()
        got = self.stores[worker].claim_tasks(
            APP,
            WORKERS[worker],
            [(self.workflow, "1", "digest")],
            lease_ttl=TTL,
            limit=limit,
            recover_until=now if recover else None,
        )
        expected = self.m.claim(now, limit, recover)
        assert [c.task for c in got] == expected
        for c in got:
            assert (c.task, c.generation) not in self.issued, "one task claimed twice"
            self.issued.add((c.task, c.generation))
            assert c.generation == self.m.tasks[c.task].generation
        self.claims.extend(got)

    @precondition(lambda self: bool(self.claims))
    @rule(pick=st.integers(0, 100), data=st.data())
    def finish(self, pick: int, data: st.DataObject) -> None:
        claim = self.claims[pick % len(self.claims)]
        how = data.draw(st.sampled_from(["complete", "fail", "attention"]))
        store = self.stores[WORKERS.index(claim.worker)]
        current = self.m.current(claim)
        try:
            if how == "complete":
                end = store.complete_task(claim, '"out"')
            else:
                state = "failed" if how == "fail" else "needs_attention"
                end = store.fail_task(claim, '{"code": "boom"}', state=state)
        except errors.StaleClaim:
            assert not current, "a current claim was refused"
            return
        assert current, "a stale claim wrote"
        ends = {"complete": "succeeded", "fail": "failed", "attention": "needs_attention"}
        self.m.end(claim.task, ends[how])
        assert end.run_state == self.m.run_state

    @precondition(lambda self: bool(self.claims))
    @rule(pick=st.integers(0, 100), renew=st.booleans())
    def touch(self, pick: int, renew: bool) -> None:
        """Renew a claim's lease, or begin its effect."""
        claim = self.claims[pick % len(self.claims)]
        store = self.stores[WORKERS.index(claim.worker)]
        current = self.m.current(claim)
        try:
            if renew:
                store.renew_task(claim, lease_ttl=TTL)
            else:
                store.begin_task_effect(claim, claim.attempt)
        except errors.StaleClaim:
            assert not current
            return
        assert current
        task = self.m.tasks[claim.task]
        if renew:
            task.lease = self.clock.now() + timedelta(seconds=TTL)
        else:
            task.effect_started = True

    @rule(seconds=st.sampled_from([1.0, 10.0, TTL + 1]))
    def wait(self, seconds: float) -> None:
        """Time passes; at TTL + 1 every worker that did not renew is gone."""
        self.clock.advance(seconds)

    @rule()
    def cancel(self) -> None:
        if self.m.run_state != "running":
            return
        self.stores[0].request_cancel(self.run_id)
        self.m.canceling = True
        for t in self.m.tasks.values():
            if t.state == "pending":
                t.state = "canceled"
        self.m.settle()

    # -- invariants --------------------------------------------------------------

    @invariant()
    def store_matches_model(self) -> None:
        if self.model is None:
            return
        tasks = self.stores[1].tasks(self.run_id)
        by_name = {t.name: t for t in tasks}
        assert {t.name: t.state for t in tasks} == {n: t.state for n, t in self.m.tasks.items()}
        for name, want in self.m.tasks.items():
            got = by_name[name]
            assert (got.generation, got.recoveries) == (want.generation, want.recoveries)
            if want.state == "running":
                assert got.effect_started == want.effect_started
            if got.state in ("running", "succeeded"):
                assert all(by_name[p].state == "succeeded" for p in got.parents)
            if got.state == "blocked":
                assert got.blocked_by is not None
        run = self.stores[0].get_run(self.run_id)
        assert run is not None
        assert run.state == self.m.run_state
        assert run.cancel_requested == self.m.canceling


def test_plan_runs_follow_the_model(store_url: str) -> None:
    open_store(store_url).close()  # migrates the test's database once
    PlanMachine.url = store_url
    run_state_machine_as_test(
        PlanMachine,
        settings=settings(
            max_examples=150 if store_url.startswith("sqlite") else 40,
            stateful_step_count=20,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
