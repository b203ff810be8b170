"""Plans end to end: a real worker (threads) runs plan runs on each store.

Ordering is explicit: a test waits for a stored state (bounded polling), or
for an event a task sets; it never sleeps and hopes. Every test runs on
SQLite and PostgreSQL (``store_url``).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import perdure
from perdure.store import planport

WORKER: dict[str, Any] = {"concurrency": 4, "lease_ttl": 2, "heartbeat": 0.5, "poll_interval": 0.1}
LIMIT = 15.0  # seconds: an upper bound for anything to happen, never a pause


def wait_for(check: Callable[[], Any], what: str, timeout: float = LIMIT) -> Any:
    """Poll ``check`` until it returns something truthy; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


def wait_state(app: perdure.App, run_id: str, *states: str) -> perdure.RunInfo:
    info: perdure.RunInfo = wait_for(
        lambda: (i := app.get(run_id)).state in states and i,
        f"run {run_id} to reach {'/'.join(states)}",
    )
    return info


def states(app: perdure.App, run_id: str) -> dict[str, str]:
    return {t.name: t.state for t in app.tasks(run_id)}


def task(app: perdure.App, run_id: str, name: str) -> perdure.TaskInfo:
    return next(t for t in app.tasks(run_id) if t.name == name)


def kinds(app: perdure.App, run_id: str) -> list[tuple[str, str | None]]:
    return [(r.kind, r.step) for r in app.history(run_id)]


@pytest.fixture
def gate() -> Iterator[threading.Event]:
    """Lets task threads still blocked go when the test ends."""
    event = threading.Event()
    yield event
    event.set()


# -- the nightly example --------------------------------------------------------------


def test_the_nightly_plan_runs_end_to_end(make_app: Callable[..., perdure.App]) -> None:
    app = make_app()
    nightly = app.plan("nightly", version="1")
    keys: dict[str, str] = {}

    @nightly.task()
    def extract(day: str) -> list[str]:
        keys["extract"] = perdure.idempotency_key()
        return [day, "b", "c"]

    @nightly.task(after=[extract])
    def transform(extract: list[str]) -> int:
        return len(extract)

    @nightly.task(after=[extract], effect="pure")
    def audit(extract: list[str]) -> bool:
        return extract[0] == "2026-11-30"

    @nightly.task(after=[transform, audit], effect="once", retry=perdure.Retry(max_attempts=1))
    def publish(transform: int, audit: bool) -> str:
        keys["publish"] = perdure.idempotency_key()
        return f"{transform}:{audit}"

    handle = app.start("nightly", "2026-11-30")
    with app.worker(**WORKER):
        result = handle.result(timeout=LIMIT)

    run_id = handle.run_id
    assert result == {
        "extract": ["2026-11-30", "b", "c"],
        "transform": 3,
        "audit": True,
        "publish": "3:True",
    }
    assert keys == {"extract": f"{run_id}/extract", "publish": f"{run_id}/publish"}
    tasks = app.tasks(run_id)
    assert [(t.name, t.state, t.attempt, t.effect) for t in tasks] == [
        ("extract", "succeeded", 1, "idempotent"),
        ("transform", "succeeded", 1, "idempotent"),
        ("audit", "succeeded", 1, "pure"),
        ("publish", "succeeded", 1, "once"),
    ]
    assert [t.parents for t in tasks] == [(), ("extract",), ("extract",), ("transform", "audit")]
    assert all(t.worker and t.error is None and t.blocked_by is None for t in tasks)
    assert all(t.recoveries == 0 and t.generation == 1 for t in tasks)
    assert [t.output for t in tasks] == list(result.values())
    ledger = kinds(app, run_id)
    for name in ("extract", "transform", "audit", "publish"):
        assert ("task_claimed", name) in ledger
        assert ("task_completed", name) in ledger
    # Only the once task records that its effect starts, before it completes.
    assert [k for k in ledger if k[0] == "effect_started"] == [("effect_started", "publish")]
    assert ledger.index(("effect_started", "publish")) < ledger.index(("task_completed", "publish"))
    assert ledger[-1] == ("finished", None)
    # Started by the Plan object too.
    again = app.start(nightly, "2026-12-01")
    with app.worker(**WORKER):
        assert again.result(timeout=LIMIT)["publish"] == "3:False"


# -- refusals -------------------------------------------------------------------------


def test_bad_declarations_raise_invalid_plan_naming_the_task(
    make_app: Callable[..., perdure.App],
) -> None:
    app = make_app()
    plan = app.plan("shapes")
    other = app.plan("other")

    @plan.task(after=["b"])
    def a(b: int) -> int:
        return b

    with pytest.raises(perdure.InvalidPlan, match="cycle") as cycle:

        @plan.task(name="b", after=[a])
        def b_fn(a: int) -> int:
            return a

    assert cycle.value.task == "b"

    @plan.task()
    def root() -> int:
        return 1

    with pytest.raises(perdure.InvalidPlan, match="names no parent") as stray:

        @plan.task(after=[root])
        def child(nothing: int) -> int:
            return nothing

    assert stray.value.task == "child"

    @other.task()
    def elsewhere() -> int:
        return 2

    with pytest.raises(perdure.InvalidPlan, match="other") as foreign:

        @plan.task(after=[elsewhere])
        def crossing(elsewhere: int) -> int:
            return elsewhere

    assert foreign.value.task == "crossing"
    assert isinstance(foreign.value, perdure.InvalidInput)
    assert foreign.value.code == "invalid_plan"


def test_an_unknown_parent_name_is_refused_at_first_start(
    make_app: Callable[..., perdure.App],
) -> None:
    app = make_app()
    plan = app.plan("dangling")

    @plan.task()
    def first() -> int:
        return 1

    @plan.task(after=[first, "later"])  # declaring it is fine: "later" may come
    def second(first: int, later: int) -> int:
        return first + later

    with pytest.raises(perdure.InvalidPlan, match="later") as refused:
        app.start(plan)
    assert refused.value.task == "second"
    assert app.runs() == []  # nothing stored

    @plan.task()
    def later() -> int:
        return 2

    with app.worker(**WORKER):
        assert app.start("dangling").result(timeout=LIMIT) == {
            "first": 1,
            "second": 3,
            "later": 2,
        }


def test_root_inputs_are_bound_and_refused_when_they_do_not_fit(
    make_app: Callable[..., perdure.App],
) -> None:
    app = make_app()
    plan = app.plan("inputs")

    @plan.task()
    def head(day: str, limit: int = 2) -> list[str]:
        return [day] * limit

    @plan.task()
    def tail(day: str, **options: Any) -> dict[str, Any]:
        return {"day": day, **options}

    for args in [(), ("d", 1, 2)]:
        with pytest.raises(perdure.InvalidInput, match="cannot take these inputs"):
            app.start(plan, *args)
    with pytest.raises(perdure.InvalidInput, match="'head'"):
        app.start(plan, "d", nope=1)
    with pytest.raises(perdure.InvalidPayload, match="argument 'limit' of root task 'head'"):
        app.start(plan, "d", limit="three")
    assert app.runs() == []

    with app.worker(**WORKER):
        assert app.start(plan, "d", limit=3).result(timeout=LIMIT) == {
            "head": ["d", "d", "d"],
            "tail": {"day": "d", "limit": 3},
        }
        assert app.start(plan, day="e").result(timeout=LIMIT) == {
            "head": ["e", "e"],
            "tail": {"day": "e"},
        }


def test_a_plan_and_a_workflow_cannot_share_a_name(make_app: Callable[..., perdure.App]) -> None:
    app = make_app()

    @app.workflow(version="1")
    def report(ctx: perdure.Context) -> None:
        return None

    with pytest.raises(perdure.InvalidInput, match="report"):
        app.plan("report")
    app.plan("digest")
    with pytest.raises(perdure.InvalidInput, match="digest"):

        @app.workflow(name="digest", version="1")
        def other(ctx: perdure.Context) -> None:
            return None

    with pytest.raises(perdure.InvalidInput, match="digest"):
        app.plan("digest")


# -- failure, retries, cancel, resolve ------------------------------------------------


def test_a_failed_task_blocks_its_descendants_while_an_independent_branch_runs_on(
    make_app: Callable[..., perdure.App], gate: threading.Event
) -> None:
    app = make_app()
    plan = app.plan("branches")
    once = perdure.Retry(max_attempts=1)

    @plan.task()
    def start() -> int:
        return 1

    @plan.task(after=[start], retry=once)
    def breaks(start: int) -> int:
        raise RuntimeError("broken on purpose")

    @plan.task(after=[breaks])
    def below(breaks: int) -> int:
        return breaks

    @plan.task(after=[below])
    def further(below: int) -> int:
        return below

    @plan.task(after=[start])
    def side(start: int) -> str:
        # Held until the test saw the failed branch blocked while this one runs.
        assert gate.wait(LIMIT)
        return "side done"

    handle = app.start(plan)
    with app.worker(**WORKER):
        seen = wait_for(
            lambda: (s := states(app, handle.run_id))["below"] == "blocked" and s,
            "the failed task's descendants to be blocked",
        )
        assert seen == {
            "start": "succeeded",
            "breaks": "failed",
            "below": "blocked",
            "further": "blocked",
            "side": "running",
        }
        assert app.get(handle.run_id).state == "running"
        gate.set()
        info = wait_state(app, handle.run_id, "failed", "succeeded", "needs_attention")

    assert info.state == "failed"
    assert info.error is not None
    assert info.error["code"] == "task_failed"
    assert info.error["task"] == "breaks"
    assert "broken on purpose" in info.error["message"]
    assert info.error["tasks"] == {
        "failed": ["breaks"],
        "needs_attention": [],
        "blocked": ["below", "further"],
    }
    tasks = {t.name: t for t in app.tasks(handle.run_id)}
    assert tasks["side"].state == "succeeded"
    assert tasks["side"].output == "side done"
    assert (tasks["below"].blocked_by, tasks["further"].blocked_by) == ("breaks", "breaks")
    assert tasks["below"].attempt == tasks["further"].attempt == 0
    assert tasks["breaks"].error is not None
    assert tasks["breaks"].error["type"] == "RuntimeError"
    with pytest.raises(perdure.RunFailed):
        handle.result(timeout=1)
    ledger = kinds(app, handle.run_id)
    assert ("task_failed", "breaks") in ledger
    assert ("task_blocked", "below") in ledger
    assert ("task_blocked", "further") in ledger


def test_a_task_retried_in_place_succeeds_on_its_third_attempt(
    make_app: Callable[..., perdure.App],
) -> None:
    app = make_app()
    plan = app.plan("flaky")
    calls: list[str] = []

    @plan.task(retry=perdure.Retry(max_attempts=3, initial_delay=0))
    def flaky() -> str:
        calls.append(perdure.idempotency_key())
        if len(calls) < 3:
            raise ConnectionError(f"attempt {len(calls)} fails")
        return "third time"

    @plan.task(after=[flaky])
    def then(flaky: str) -> str:
        return flaky.upper()

    handle = app.start(plan)
    with app.worker(**WORKER):
        assert handle.result(timeout=LIMIT) == {"flaky": "third time", "then": "THIRD TIME"}
    assert calls == [f"{handle.run_id}/flaky"] * 3
    found = task(app, handle.run_id, "flaky")
    assert (found.state, found.attempt, found.output) == ("succeeded", 3, "third time")
    assert found.generation == 1  # retried in place, never claimed again
    assert task(app, handle.run_id, "then").attempt == 1


def test_a_cancel_records_the_running_tasks_real_outcome_then_cancels(
    make_app: Callable[..., perdure.App], gate: threading.Event
) -> None:
    app = make_app()
    plan = app.plan("cancelable")
    entered = threading.Event()

    @plan.task()
    def slow() -> str:
        entered.set()
        assert gate.wait(LIMIT)
        return "finished anyway"

    @plan.task(after=[slow])
    def after_slow(slow: str) -> str:
        return slow

    @plan.task(after=[after_slow])
    def last(after_slow: str) -> str:
        return after_slow

    handle = app.start(plan)
    with app.worker(**WORKER):
        assert entered.wait(LIMIT)
        assert app.cancel(handle.run_id)
        # The task still runs in a live worker: the run waits for its outcome.
        assert app.get(handle.run_id).state == "running"
        assert states(app, handle.run_id) == {
            "slow": "running",
            "after_slow": "canceled",
            "last": "canceled",
        }
        gate.set()
        info = wait_state(app, handle.run_id, "canceled", "failed", "succeeded", "needs_attention")

    assert info.state == "canceled", info.error
    tasks = {t.name: t for t in app.tasks(handle.run_id)}
    assert (tasks["slow"].state, tasks["slow"].output) == ("succeeded", "finished anyway")
    assert tasks["after_slow"].attempt == tasks["last"].attempt == 0
    ledger = kinds(app, handle.run_id)
    assert ("task_completed", "slow") in ledger
    assert ledger[-1] == ("canceled", None)
    with pytest.raises(perdure.RunFailed) as failed:
        handle.result(timeout=1)
    assert failed.value.state == "canceled"


def test_resolving_a_task_that_needs_attention_unblocks_its_descendants(
    make_app: Callable[..., perdure.App],
) -> None:
    app = make_app()
    plan = app.plan("payment")
    charged: list[str] = []

    @plan.task(effect="once")
    def charge(order: str) -> str:
        charged.append(order)
        return f"ch-{order}"

    @plan.task(after=[charge])
    def ship(charge: str) -> str:
        return f"shipped after {charge}"

    @plan.task()
    def notify(order: str) -> str:
        return f"noted {order}"

    handle = app.start(plan, "o-1")
    # A worker claims the once task, starts its effect and is lost.
    store = app.store
    assert isinstance(store, planport.PlanStore)
    (claim,) = store.claim_tasks(app.name, "lost-worker", [plan.identity], lease_ttl=0.3)
    assert claim.task == "charge"
    store.begin_task_effect(claim, claim.attempt)

    with app.worker(**WORKER):
        info = wait_state(app, handle.run_id, "needs_attention", "failed", "succeeded")
        assert info.state == "needs_attention"
        assert info.error is not None
        assert (info.error["code"], info.error["task"]) == ("effect_outcome_unknown", "charge")
        found = {t.name: t for t in app.tasks(handle.run_id)}
        assert found["charge"].state == "needs_attention"
        assert found["charge"].error is not None
        assert found["charge"].error["code"] == "effect_outcome_unknown"
        assert (found["ship"].state, found["ship"].blocked_by) == ("blocked", "charge")
        assert found["notify"].state == "succeeded"
        assert charged == []  # never run again after its effect may have happened

        with pytest.raises(perdure.NotResolvable):
            app.resolve(handle.run_id, "notify", output="x")
        app.resolve(handle.run_id, "charge", output="ch-manual")
        assert handle.result(timeout=LIMIT) == {
            "charge": "ch-manual",
            "ship": "shipped after ch-manual",
            "notify": "noted o-1",
        }
    assert charged == []
    ship_info = task(app, handle.run_id, "ship")
    assert (ship_info.state, ship_info.blocked_by, ship_info.attempt) == ("succeeded", None, 1)
    assert ("resolved", None) in kinds(app, handle.run_id)


def test_async_tasks_run_with_their_key_and_parents_outputs(
    make_app: Callable[..., perdure.App],
) -> None:
    app = make_app()
    plan = app.plan("asynchronous")

    @plan.task()
    async def fetch(n: int) -> list[int]:
        await asyncio.sleep(0.01)
        return list(range(n))

    @plan.task(after=[fetch])
    async def total(fetch: list[int]) -> dict[str, Any]:
        await asyncio.sleep(0.01)
        return {"sum": sum(fetch), "key": perdure.idempotency_key()}

    @plan.task(after=[fetch])
    def count(fetch: list[int]) -> int:
        return len(fetch)

    handle = app.start(plan, 4)
    with app.worker(**WORKER):
        result = handle.result(timeout=LIMIT)
    assert result == {
        "fetch": [0, 1, 2, 3],
        "total": {"sum": 6, "key": f"{handle.run_id}/total"},
        "count": 4,
    }


def test_a_worker_of_another_shape_sends_the_run_to_needs_attention(
    make_app: Callable[..., perdure.App],
) -> None:
    name = f"shape_{time.monotonic_ns() % 10**8}"
    ran: list[str] = []

    def declare(extra: bool) -> tuple[perdure.App, perdure.Plan]:
        app = make_app(name)
        plan = app.plan("reshaped", version="1")

        @plan.task()
        def one() -> int:
            ran.append("one")
            return 1

        if extra:

            @plan.task(after=[one])
            def two(one: int) -> int:
                ran.append("two")
                return one + 1

        return app, plan

    starter, started = declare(extra=False)
    server, served = declare(extra=True)
    assert started.digest() != served.digest()
    handle = starter.start(started)
    with server.worker(**WORKER):
        info = wait_state(starter, handle.run_id, "needs_attention", "succeeded", "failed")
    assert info.state == "needs_attention"
    assert info.error is not None
    assert info.error["code"] == "plan_mismatch"
    assert ran == []
    assert [(t.name, t.state, t.attempt, t.worker) for t in starter.tasks(handle.run_id)] == [
        ("one", "pending", 0, None)
    ]
    assert not any(k == "task_claimed" for k, _ in kinds(starter, handle.run_id))
