"""End to end: a real worker (threads) runs workflows on a real store.

Ordering is explicit: a test waits for a stored state (bounded polling of the
store), for an event a step sets, or moves a FakeClock; it never sleeps and
hopes. Every test runs on SQLite and PostgreSQL (``store_url``).
"""

import asyncio
import dataclasses
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from typing import Any

import pydantic
import pytest

import perdure
from perdure import codec
from perdure.testing.clock import FakeClock

WORKER = {"concurrency": 4, "lease_ttl": 2, "heartbeat": 0.5, "poll_interval": 0.2}
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


def journal(app: perdure.App, run_id: str) -> list[tuple[int, str, str, str]]:
    return [(e.position, e.kind, e.name, e.status) for e in app.store.journal(run_id)]


def kinds(app: perdure.App, run_id: str) -> list[str]:
    return [r.kind for r in app.history(run_id)]


def assert_canceled(info: perdure.RunInfo) -> None:
    """A clean cancel: state canceled and no error other than the cancel itself."""
    assert info.state == "canceled", info.error
    assert info.error is None or info.error["code"] == "canceled", info.error


def probe_claim(app: perdure.App) -> list[str]:
    """Claim as a fresh worker would right now; return the run ids it got."""
    got = app.store.claim(app.name, "probe-worker", app.workflow_versions(), lease_ttl=1, limit=10)
    return [c.claim.run_id for c in got]


# -- typed payloads (module level so type hints resolve) --------------------------


@dataclasses.dataclass(frozen=True)
class Line:
    sku: str
    qty: int


@dataclasses.dataclass(frozen=True)
class Order:
    order_id: str
    lines: list[Line]
    placed: datetime


class Customer(pydantic.BaseModel):
    name: str
    tier: str = "basic"


class Quote(pydantic.BaseModel):
    cents: int
    lines: list[str]


@dataclasses.dataclass(frozen=True)
class Invoice:
    order_id: str
    customer: Customer
    quote: Quote
    total_qty: int


@dataclasses.dataclass(frozen=True)
class Charge:
    charge_id: str
    cents: int


# -- basics -------------------------------------------------------------------------


def test_sync_workflow_with_steps(make_app: Callable[..., perdure.App]) -> None:
    app = make_app()
    calls: list[tuple[int, int]] = []

    @app.step()
    def add(a: int, b: int) -> int:
        calls.append((a, b))
        return a + b

    @app.step(effect="pure")
    def double(x: int) -> int:
        return 2 * x

    @app.workflow()
    def compute(ctx: perdure.Context, x: int) -> dict[str, int]:
        y = add(x, 1)
        z = add(y, 10)
        return {"y": y, "z": z, "w": ctx.step(double, z)}

    with app.worker(**WORKER):
        handle = app.start(compute, 4)
        assert handle.result(timeout=LIMIT) == {"y": 5, "z": 15, "w": 30}

    info = app.get(handle.run_id)
    assert (info.state, info.workflow, info.version) == ("succeeded", "compute", "1")
    assert info.error is None
    assert info.result == {"y": 5, "z": 15, "w": 30}
    assert info.attempt == 1
    assert handle.status() == "succeeded"
    assert calls == [(4, 1), (5, 10)]
    entries = app.store.journal(handle.run_id)
    assert [(e.position, e.kind, e.name, e.status, e.output) for e in entries] == [
        (1, "step", "add", "ok", "5"),
        (2, "step", "add#2", "ok", "15"),
        (3, "step", "double", "ok", "30"),
    ]
    assert kinds(app, handle.run_id) == [
        "initialized",
        "claimed",
        "step_started",
        "step_completed",
        "step_started",
        "step_completed",
        "step_started",
        "step_completed",
        "finished",
    ]
    assert [r.sequence for r in app.history(handle.run_id)] == list(range(1, 10))
    assert [r.step for r in app.history(handle.run_id)][2:8] == [
        "add",
        "add",
        "add#2",
        "add#2",
        "double",
        "double",
    ]


def test_async_workflow_with_async_and_sync_steps(make_app: Callable[..., perdure.App]) -> None:
    app = make_app()

    @app.step()
    async def fetch(x: int) -> int:
        await asyncio.sleep(0)
        return x * 10

    @app.step()
    def bump(x: int) -> int:
        return x + 1

    @app.workflow()
    async def gather(ctx: perdure.Context, x: int) -> list[int]:
        a = await fetch(x)
        b = await fetch(a)
        return [a, b, bump(b)]

    with app.worker(**WORKER):
        handle = app.start(gather, 3)
        assert handle.result(timeout=LIMIT) == [30, 300, 301]
    assert journal(app, handle.run_id) == [
        (1, "step", "fetch", "ok"),
        (2, "step", "fetch#2", "ok"),
        (3, "step", "bump", "ok"),
    ]


def test_workflow_exception_fails_the_run(make_app: Callable[..., perdure.App]) -> None:
    app = make_app()

    @app.workflow()
    def broken(ctx: perdure.Context) -> None:
        raise KeyError("missing thing")

    with app.worker(**WORKER):
        handle = app.start(broken)
        with pytest.raises(perdure.RunFailed) as caught:
            handle.result(timeout=LIMIT)
    assert caught.value.state == "failed"
    assert caught.value.error["code"] == "workflow_failed"
    info = app.get(handle.run_id)
    assert info.state == "failed"
    assert info.error is not None
    assert info.error["code"] == "workflow_failed"
    assert "KeyError" in info.error["message"]
    assert "missing thing" in info.error["message"]


def test_same_key_returns_the_same_run(make_app: Callable[..., perdure.App]) -> None:
    app = make_app()
    bodies: list[int] = []

    @app.workflow()
    def once_per_key(ctx: perdure.Context, n: int) -> int:
        bodies.append(n)
        return n * 2

    first = app.start(once_per_key, 1, key="order-1")
    again = app.start(once_per_key, 1, key="order-1")
    with pytest.raises(perdure.KeyConflict):  # a key names one start, inputs included
        app.start(once_per_key, 99, key="order-1")
    other_key = app.start(once_per_key, 2, key="order-2")
    assert first.run_id == again.run_id
    assert other_key.run_id != first.run_id
    assert len(app.runs()) == 2

    with app.worker(**WORKER):
        assert first.result(timeout=LIMIT) == 2  # the first start's input won
        assert other_key.result(timeout=LIMIT) == 4
    after = app.start(once_per_key, 1, key="order-1")
    assert after.run_id == first.run_id
    assert after.result(timeout=LIMIT) == 2
    assert sorted(bodies) == [1, 2]
    assert kinds(app, first.run_id).count("initialized") == 1


def test_dataclass_and_pydantic_inputs_and_results_follow_type_hints(
    make_app: Callable[..., perdure.App],
) -> None:
    app = make_app()
    seen: dict[str, Any] = {}

    @app.step()
    def quote(order: Order) -> Quote:
        return Quote(
            cents=sum(line.qty for line in order.lines) * 250,
            lines=[line.sku for line in order.lines],
        )

    @app.step()
    def total(lines: list[Line]) -> int:
        return sum(line.qty for line in lines)

    @app.workflow()
    def invoice(ctx: perdure.Context, order: Order, *, customer: Customer) -> Invoice:
        seen["order"] = order
        seen["customer"] = customer
        q = quote(order)
        seen["quote"] = q
        return Invoice(order.order_id, customer, q, total(order.lines))

    order = Order(
        "o-1",
        [Line("apple", 2), Line("pear", 3)],
        datetime.fromisoformat("2030-01-02T03:04:05+00:00"),
    )
    customer = Customer(name="Ada", tier="gold")
    with app.worker(**WORKER):
        handle = app.start(invoice, order, customer=customer)
        result = handle.result(timeout=LIMIT)

    expected = Invoice("o-1", customer, Quote(cents=1250, lines=["apple", "pear"]), 5)
    assert result == expected
    assert isinstance(result, Invoice)
    assert isinstance(result.customer, Customer)
    assert isinstance(result.quote, Quote)
    assert seen["order"] == order
    assert isinstance(seen["order"].lines[0], Line)
    assert isinstance(seen["order"].placed, datetime)
    assert seen["customer"] == customer
    assert isinstance(seen["quote"], Quote)
    # A fresh handle knows the return type too; the stored result is plain JSON.
    assert app.handle(handle.run_id).result(timeout=LIMIT) == expected
    raw = app.get(handle.run_id).result
    assert raw == {
        "order_id": "o-1",
        "customer": {"name": "Ada", "tier": "gold"},
        "quote": {"cents": 1250, "lines": ["apple", "pear"]},
        "total_qty": 5,
    }


def test_non_json_workflow_input_is_refused_at_start(make_app: Callable[..., perdure.App]) -> None:
    app = make_app()

    @app.workflow()
    def takes(ctx: perdure.Context, thing: Any) -> None: ...

    with pytest.raises(perdure.InvalidPayload):
        app.start(takes, object())
    with pytest.raises(perdure.InvalidPayload):
        app.start(takes, float("nan"))
    assert app.runs() == []


# -- logical time and sleeping ----------------------------------------------------


def test_now_random_uuid_are_stable_across_a_replay(make_app: Callable[..., perdure.App]) -> None:
    clock = FakeClock()
    start = clock.now()
    app = make_app(clock=clock)
    passes: list[list[Any]] = []

    @app.workflow()
    def logical(ctx: perdure.Context) -> dict[str, Any]:
        before = [ctx.now().isoformat(), ctx.random(), str(ctx.uuid())]
        passes.append(before)
        ctx.sleep(timedelta(seconds=30))
        return {"before": before, "after": ctx.now().isoformat()}

    # warm=0: the run is replayed, not taken up warm (perdure.warm).
    with app.worker(**WORKER, warm=0):
        handle = app.start(logical)
        wait_state(app, handle.run_id, "waiting")
        assert len(passes) == 1
        assert journal(app, handle.run_id) == [
            (1, "now", "now", "ok"),
            (2, "random", "random", "ok"),
            (3, "uuid", "uuid", "ok"),
            (4, "sleep", "sleep", "ok"),
        ]
        clock.advance(31)
        result = handle.result(timeout=LIMIT)

    assert len(passes) == 2
    assert passes[0] == passes[1]
    assert result["before"] == passes[0]
    assert passes[0][0] == start.isoformat()
    assert result["after"] == (start + timedelta(seconds=31)).isoformat()
    assert 0.0 <= passes[0][1] < 1.0
    assert journal(app, handle.run_id)[-1] == (5, "now", "now", "ok")
    assert app.get(handle.run_id).attempt == 2


def test_sleep_parks_the_run_until_its_deadline(make_app: Callable[..., perdure.App]) -> None:
    clock = FakeClock()
    app = make_app(clock=clock)
    after_sleep: list[int] = []

    @app.step()
    def first() -> str:
        return "first"

    @app.step()
    def second() -> str:
        after_sleep.append(1)
        return "second"

    @app.workflow()
    def napper(ctx: perdure.Context) -> list[str]:
        a = first()
        ctx.sleep(timedelta(hours=1))
        return [a, second()]

    with app.worker(**WORKER):
        handle = app.start(napper)
        info = wait_state(app, handle.run_id, "waiting")
        assert info.result is None
        run = app.store.get_run(handle.run_id)
        assert run is not None
        assert run.ready_at == clock.now() + timedelta(hours=1)
        assert run.worker is None
        assert app.waits(handle.run_id) == []
        with pytest.raises(perdure.WaitStillOpen):
            app.resume(handle.run_id)

        clock.advance(minutes=59)
        assert probe_claim(app) == []  # not due yet: nothing can claim it
        assert app.get(handle.run_id).state == "waiting"
        assert after_sleep == []

        clock.advance(minutes=2)
        assert handle.result(timeout=LIMIT) == ["first", "second"]
    assert after_sleep == [1]
    assert journal(app, handle.run_id) == [
        (1, "step", "first", "ok"),
        (2, "sleep", "sleep", "ok"),
        (3, "step", "second", "ok"),
    ]
    history = kinds(app, handle.run_id)
    assert history.count("parked") == 1
    assert history.count("claimed") == 2


# -- retries and failures --------------------------------------------------------


def test_idempotent_step_retries_with_a_stable_idempotency_key(
    make_app: Callable[..., perdure.App],
) -> None:
    app = make_app()
    keys: list[str] = []

    @app.step(retry=perdure.Retry(max_attempts=3, initial_delay=0))
    def charge(cents: int) -> str:
        keys.append(perdure.idempotency_key())
        if len(keys) < 3:
            raise ConnectionError("gateway flaked")
        return f"ch-{cents}-{len(keys)}"

    @app.workflow()
    def pay(ctx: perdure.Context) -> list[str]:
        return [charge(5), charge(6)]

    with app.worker(**WORKER):
        handle = app.start(pay)
        assert handle.result(timeout=LIMIT) == ["ch-5-3", "ch-6-4"]
    run_id = handle.run_id
    assert keys == [f"{run_id}/charge"] * 3 + [f"{run_id}/charge#2"]
    entries = app.store.journal(run_id)
    assert [(e.name, e.status, e.attempt) for e in entries] == [
        ("charge", "ok", 3),
        ("charge#2", "ok", 1),
    ]
    with pytest.raises(perdure.InvalidInput):
        perdure.idempotency_key()  # outside a step


def test_step_that_always_fails_fails_the_run(make_app: Callable[..., perdure.App]) -> None:
    app = make_app()
    attempts: list[int] = []

    @app.step(retry=perdure.Retry(max_attempts=2, initial_delay=0))
    def validate(n: int) -> int:
        attempts.append(n)
        if n == 2:
            raise ValueError(f"bad input {n}")
        return n

    @app.workflow()
    def checker(ctx: perdure.Context) -> str:
        validate(1)
        validate(2)
        return "unreachable"

    with app.worker(**WORKER):
        handle = app.start(checker)
        with pytest.raises(perdure.RunFailed) as caught:
            handle.result(timeout=LIMIT)
    assert caught.value.error["code"] == "step_failed"
    info = app.get(handle.run_id)
    assert info.state == "failed"
    assert info.error is not None
    assert info.error["code"] == "step_failed"
    assert info.error["step"] == "validate#2"
    assert "ValueError" in info.error["message"]
    assert "bad input 2" in info.error["message"]
    assert attempts == [1, 2, 2]
    entries = app.store.journal(handle.run_id)
    assert [(e.name, e.status, e.attempt) for e in entries] == [
        ("validate", "ok", 1),
        ("validate#2", "error", 2),
    ]
    assert "step_failed" in kinds(app, handle.run_id)


# -- once steps, ambiguity and resolve ----------------------------------------------


def _once_app(
    make_app: Callable[..., perdure.App],
    *,
    raises: BaseException | None = None,
) -> tuple[perdure.App, Any, Counter[str]]:
    """An app whose ``checkout`` reserves, charges once (raising ``raises``), then ships."""
    app = make_app()
    calls: Counter[str] = Counter()

    @app.step()
    def reserve(order_id: str) -> int:
        calls["reserve"] += 1
        return 500

    @app.step(effect="once", retry=perdure.Retry(max_attempts=3, initial_delay=0))
    def charge(order_id: str, cents: int) -> Charge:
        calls["charge"] += 1
        if raises is not None:
            raise raises
        return Charge(f"ch-{order_id}", cents)

    @app.step()
    def ship(charge: Charge) -> str:
        calls["ship"] += 1
        assert isinstance(charge, Charge)
        return f"shipped after {charge.charge_id} ({charge.cents})"

    @app.workflow()
    def checkout(ctx: perdure.Context, order_id: str) -> str:
        cents = reserve(order_id)
        return ship(charge(order_id, cents))

    return app, checkout, calls


def _stop_on_charge(
    make_app: Callable[..., perdure.App],
) -> tuple[perdure.App, Any, Counter[str], str]:
    app, checkout, calls = _once_app(make_app, raises=RuntimeError("gateway timed out"))
    with app.worker(**WORKER):
        handle = app.start(checkout, "o-7")
        info = wait_state(app, handle.run_id, "needs_attention", "failed", "succeeded")
    assert info.state == "needs_attention"
    return app, checkout, calls, handle.run_id


def test_once_step_raising_a_plain_exception_needs_attention(
    make_app: Callable[..., perdure.App],
) -> None:
    app, _, calls, run_id = _stop_on_charge(make_app)
    info = app.get(run_id)
    assert info.error is not None
    assert info.error["code"] == "effect_outcome_unknown"
    assert info.error["step"] == "charge"
    assert "charge" in info.error["message"]
    assert calls == Counter({"reserve": 1, "charge": 1})  # never retried despite max_attempts=3
    assert journal(app, run_id) == [(1, "step", "reserve", "ok"), (2, "step", "charge", "started")]
    assert kinds(app, run_id).count("effect_started") == 1
    with pytest.raises(perdure.RunFailed) as caught:
        app.handle(run_id).result(timeout=1)
    assert caught.value.error["code"] == "effect_outcome_unknown"


def test_resolve_with_output_requeues_and_the_run_uses_it(
    make_app: Callable[..., perdure.App],
) -> None:
    app, _, calls, run_id = _stop_on_charge(make_app)
    info = app.resolve(
        run_id,
        "charge",
        output={"charge_id": "ch-manual", "cents": 500},
        note="checked the gateway dashboard",
    )
    assert info.state == "queued"
    entries = app.store.journal(run_id)
    assert [(e.name, e.status) for e in entries] == [("reserve", "ok"), ("charge", "ok")]
    assert entries[1].output is not None
    assert codec.decode(entries[1].output) == {"charge_id": "ch-manual", "cents": 500}
    resolved = app.history(run_id)[-1]
    assert (resolved.kind, resolved.step) == ("resolved", "charge")
    assert resolved.note is not None and "checked the gateway dashboard" in resolved.note

    with app.worker(**WORKER):
        assert app.handle(run_id).result(timeout=LIMIT) == "shipped after ch-manual (500)"
    assert calls == Counter({"reserve": 1, "charge": 1, "ship": 1})
    assert journal(app, run_id) == [
        (1, "step", "reserve", "ok"),
        (2, "step", "charge", "ok"),
        (3, "step", "ship", "ok"),
    ]


def test_resolve_with_error_fails_the_run(make_app: Callable[..., perdure.App]) -> None:
    app, _, calls, run_id = _stop_on_charge(make_app)
    info = app.resolve(run_id, "charge", error="the card was declined")
    assert info.state == "failed"
    assert info.error == {
        "code": "resolved_failed",
        "message": "the card was declined",
        "step": "charge",
    }
    entries = app.store.journal(run_id)
    assert [(e.name, e.status) for e in entries] == [("reserve", "ok"), ("charge", "error")]
    with app.worker(**WORKER):
        with pytest.raises(perdure.RunFailed) as caught:
            app.handle(run_id).result(timeout=LIMIT)
        assert probe_claim(app) == []
    assert caught.value.error["code"] == "resolved_failed"
    assert calls == Counter({"reserve": 1, "charge": 1})


def test_resolve_refuses_the_wrong_step_or_state(make_app: Callable[..., perdure.App]) -> None:
    app, checkout, _, run_id = _stop_on_charge(make_app)
    with pytest.raises(perdure.NotResolvable, match="charge"):
        app.resolve(run_id, "reserve", output=1)
    with pytest.raises(perdure.NotResolvable):
        app.resolve(run_id, "charge#2", output=1)
    with pytest.raises(perdure.InvalidInput):
        app.resolve(run_id, "charge", output=1, error="both")
    with pytest.raises(perdure.InvalidInput):
        app.resolve(run_id, "charge")
    with pytest.raises(perdure.RunNotFound):
        app.resolve("no-such-run", "charge", output=1)
    assert app.get(run_id).state == "needs_attention"  # refusals changed nothing

    app.resolve(run_id, "charge", output={"charge_id": "c", "cents": 1})
    with pytest.raises(perdure.NotResolvable):  # queued now, not needs_attention
        app.resolve(run_id, "charge", output={"charge_id": "c", "cents": 2})
    with app.worker(**WORKER):
        app.handle(run_id).result(timeout=LIMIT)
    with pytest.raises(perdure.NotResolvable):  # succeeded
        app.resolve(run_id, "charge", output={"charge_id": "c", "cents": 3})
    queued = app.start(checkout, "o-8")
    with pytest.raises(perdure.NotResolvable):
        app.resolve(queued.run_id, "charge", output=1)


def test_once_step_raising_effect_failed_is_retried_under_its_policy(
    make_app: Callable[..., perdure.App],
) -> None:
    app = make_app()
    attempts: list[int] = []

    @app.step(effect="once", retry=perdure.Retry(max_attempts=3, initial_delay=0))
    def charge() -> str:
        attempts.append(1)
        if len(attempts) < 3:
            raise perdure.EffectFailed("refused by the card network before charging")
        return "ch-3"

    @app.workflow()
    def pay(ctx: perdure.Context) -> str:
        return charge()

    with app.worker(**WORKER):
        handle = app.start(pay)
        assert handle.result(timeout=LIMIT) == "ch-3"
    assert len(attempts) == 3
    entries = app.store.journal(handle.run_id)
    assert [(e.name, e.status, e.attempt) for e in entries] == [("charge", "ok", 3)]
    assert kinds(app, handle.run_id).count("effect_started") == 3


def test_once_step_that_keeps_failing_cleanly_fails_the_run(
    make_app: Callable[..., perdure.App],
) -> None:
    app = make_app()
    attempts: list[int] = []

    @app.step(effect="once", retry=perdure.Retry(max_attempts=2, initial_delay=0))
    def charge() -> str:
        attempts.append(1)
        raise perdure.EffectFailed("declined before charging")

    @app.workflow()
    def pay(ctx: perdure.Context) -> str:
        return charge()

    with app.worker(**WORKER):
        handle = app.start(pay)
        info = wait_state(app, handle.run_id, "failed", "needs_attention", "succeeded")
    assert info.state == "failed"
    assert info.error is not None
    assert (info.error["code"], info.error["step"]) == ("step_failed", "charge")
    assert len(attempts) == 2
    assert journal(app, handle.run_id) == [(1, "step", "charge", "error")]


# -- non-determinism -----------------------------------------------------------------


def test_changed_code_under_the_same_version_is_non_determinism(
    make_app: Callable[..., perdure.App],
) -> None:
    clock = FakeClock()
    name = "shop"
    old = make_app(name=name, clock=clock)
    ran: Counter[str] = Counter()

    @old.step()
    def step_a() -> str:
        ran["old.step_a"] += 1
        return "a"

    @old.step()
    def step_b() -> str:
        ran["old.step_b"] += 1
        return "b"

    @old.workflow(name="flow", version="1")
    def flow_old(ctx: perdure.Context) -> str:
        step_a()
        ctx.sleep(timedelta(minutes=5))
        return step_b()

    with old.worker(**WORKER):
        run_id = old.start(flow_old).run_id
        wait_state(old, run_id, "waiting")
    recorded = old.store.journal(run_id)
    assert [(e.kind, e.name) for e in recorded] == [("step", "step_a"), ("sleep", "sleep")]

    new = make_app(name=name, clock=clock)

    @new.step(name="step_a")
    def new_a() -> str:
        ran["new.step_a"] += 1
        return "A"

    @new.step(name="step_b")
    def new_b() -> str:
        ran["new.step_b"] += 1
        return "B"

    @new.workflow(name="flow", version="1")
    def flow_new(ctx: perdure.Context) -> str:
        new_b()  # the steps swapped places
        ctx.sleep(timedelta(minutes=5))
        return new_a()

    clock.advance(minutes=6)
    with new.worker(**WORKER):
        info = wait_state(new, run_id, "needs_attention", "failed", "succeeded")
    assert info.state == "needs_attention"
    assert info.error is not None
    assert info.error["code"] == "non_determinism"
    message = info.error["message"]
    assert "step 'step_a'" in message  # what the journal recorded
    assert "step 'step_b'" in message  # what the code now calls
    assert "position 1" in message
    assert new.store.journal(run_id) == recorded  # nothing overwritten
    assert ran == Counter({"old.step_a": 1})


# -- cancel ------------------------------------------------------------------------


def test_cancel_a_queued_run(make_app: Callable[..., perdure.App]) -> None:
    app = make_app()
    bodies: list[int] = []

    @app.workflow()
    def never(ctx: perdure.Context) -> None:
        bodies.append(1)

    handle = app.start(never)
    assert app.cancel(handle.run_id) is True
    info = app.get(handle.run_id)
    assert info.state == "canceled"
    assert app.cancel(handle.run_id) is False  # nothing left to change
    assert probe_claim(app) == []
    with app.worker(**WORKER), pytest.raises(perdure.RunFailed) as caught:
        handle.result(timeout=LIMIT)
    assert caught.value.state == "canceled"
    assert bodies == []
    assert app.store.journal(handle.run_id) == []
    assert kinds(app, handle.run_id) == ["initialized", "canceled"]


def test_cancel_a_sleeping_run(make_app: Callable[..., perdure.App]) -> None:
    clock = FakeClock()
    app = make_app(clock=clock)
    woke: list[int] = []

    @app.step()
    def before() -> int:
        return 1

    @app.step()
    def after() -> int:
        woke.append(1)
        return 2

    @app.workflow()
    def sleepy(ctx: perdure.Context) -> int:
        before()
        ctx.sleep(timedelta(hours=2))
        return after()

    with app.worker(**WORKER):
        handle = app.start(sleepy)
        wait_state(app, handle.run_id, "waiting")
        assert app.cancel(handle.run_id) is True
        assert app.get(handle.run_id).state == "canceled"
        clock.advance(hours=3)
        assert probe_claim(app) == []
    info = app.get(handle.run_id)
    assert info.state == "canceled"
    assert woke == []
    assert journal(app, handle.run_id) == [(1, "step", "before", "ok"), (2, "sleep", "sleep", "ok")]
    assert kinds(app, handle.run_id)[-1] == "canceled"


# -- poison runs ------------------------------------------------------------------


class RefusingFinishStep:
    """Delegate to a real store, except that ``finish_step`` always fails."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.refused = 0

    def finish_step(self, claim: Any, entries: Any, marks: Any = ()) -> None:
        self.refused += 1
        raise perdure.StoreUnavailable("injected: finish_step refused")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


@pytest.mark.slow
def test_a_run_whose_attempts_keep_faulting_becomes_a_poison_run(
    make_app: Callable[..., perdure.App],
) -> None:
    app = make_app(max_failures=2)
    bodies: list[int] = []

    @app.step()
    def work() -> int:
        bodies.append(1)
        return 1

    @app.workflow()
    def doomed(ctx: perdure.Context) -> int:
        return work()

    store = RefusingFinishStep(app.store)
    worker = perdure.Worker(app, store, **WORKER)  # type: ignore[arg-type]
    handle = app.start(doomed)
    with worker:
        info = wait_state(app, handle.run_id, "needs_attention", "failed", "succeeded")
    assert info.state == "needs_attention"
    assert info.error is not None
    assert info.error["code"] == "poison_run"
    assert "2 consecutive" in info.error["message"]
    assert "finish_step refused" in info.error["message"]
    assert bodies == [1, 1]
    assert store.refused == 2
    assert info.attempt == 2
    assert app.store.journal(handle.run_id) == []
    assert kinds(app, handle.run_id) == [
        "initialized",
        "claimed",
        "released",
        "claimed",
        "finished",
    ]


# -- graceful stop -----------------------------------------------------------------


def test_stop_lets_the_current_step_finish_and_releases_the_run(
    make_app: Callable[..., perdure.App],
) -> None:
    app = make_app()
    entered = threading.Event()
    gate = threading.Event()
    calls: Counter[str] = Counter()

    @app.step()
    def long_step() -> str:
        calls["long"] += 1
        entered.set()
        assert gate.wait(LIMIT), "the test never opened the gate"
        return "long done"

    @app.step()
    def next_step(previous: str) -> str:
        calls["next"] += 1
        return f"next after {previous}"

    @app.workflow()
    def job(ctx: perdure.Context) -> list[str]:
        first = long_step()
        return [first, next_step(first)]

    first_worker = app.worker(**WORKER).start()
    handle = app.start(job)
    try:
        assert entered.wait(LIMIT)
        stopper = threading.Thread(target=first_worker.stop)
        stopper.start()
        wait_for(lambda: first_worker.stopping, "the worker to start stopping")
        assert app.get(handle.run_id).state == "running"
    finally:
        gate.set()
    stopper.join(LIMIT)
    assert not stopper.is_alive()

    info = app.get(handle.run_id)
    assert (info.state, info.error, info.failures) == ("queued", None, 0)
    assert journal(app, handle.run_id) == [(1, "step", "long_step", "ok")]
    assert calls == Counter({"long": 1})
    assert kinds(app, handle.run_id)[-1] == "released"

    with app.worker(**WORKER):
        assert handle.result(timeout=LIMIT) == ["long done", "next after long done"]
    assert calls == Counter({"long": 1, "next": 1})
    assert app.get(handle.run_id).attempt == 2


def test_stop_hands_back_a_claimed_run_that_no_thread_picked_up(
    make_app: Callable[..., perdure.App],
) -> None:
    """A claim made just before a stop, still queued for a thread, is handed back at once.

    The worker's only thread is held by a step, so the second claim waits in
    the thread pool's queue when the stop cancels what is queued. The stop
    must neither wait out its grace for an execution that never comes nor
    leave the run claimed until its lease lapses.
    """
    app = make_app()
    entered = threading.Event()
    gate = threading.Event()
    calls: Counter[str] = Counter()

    @app.step()
    def held() -> str:
        calls["held"] += 1
        entered.set()
        assert gate.wait(LIMIT), "the test never opened the gate"
        return "held"

    @app.step()
    def quick() -> str:
        calls["quick"] += 1
        return "quick"

    @app.workflow()
    def holds(ctx: perdure.Context) -> str:
        return held()

    @app.workflow()
    def queued(ctx: perdure.Context) -> str:
        return quick()

    # One thread in the pool: no warm holder adds a second.
    worker = app.worker(**{**WORKER, "concurrency": 1, "warm_for": 0, "grace": LIMIT}).start()
    first = app.start(holds)
    stopper: threading.Thread | None = None
    try:
        assert entered.wait(LIMIT)
        second = app.start(queued)
        # The claim the claim loop would make next, had it a free slot.
        [claimed] = app.store.claim(
            app.name, worker.worker_id, app.workflow_versions(), lease_ttl=WORKER["lease_ttl"]
        )
        assert claimed.claim.run_id == second.run_id
        worker._dispatch([claimed])
        results: list[bool] = []
        stopper = threading.Thread(target=lambda: results.append(worker.stop(LIMIT)))
        stopper.start()
        # Handed back while the held step still runs: nothing waited for it.
        info = wait_for(
            lambda: (i := app.get(second.run_id)).state == "queued" and i,
            "the queued claim to be handed back",
        )
        assert stopper.is_alive() and calls == Counter({"held": 1})
    finally:
        gate.set()
    stopper.join(LIMIT)
    assert not stopper.is_alive() and results == [True]
    assert (info.state, info.failures) == ("queued", 0)
    assert kinds(app, second.run_id)[-2:] == ["claimed", "released"]
    assert journal(app, second.run_id) == []

    with app.worker(**WORKER):
        assert second.result(timeout=LIMIT) == "quick"
        assert first.result(timeout=LIMIT) == "held"
    assert calls == Counter({"held": 1, "quick": 1})


def test_a_claim_dispatched_after_the_pool_shut_down_is_handed_back(
    make_app: Callable[..., perdure.App],
) -> None:
    """A claim loop that outlasts a stop's wait meets a shut pool: its claims go back at once."""
    app = make_app()

    @app.workflow()
    def job(ctx: perdure.Context) -> str:
        return "done"

    # Not started: no claim loop of its own competes for the run.
    worker = app.worker(**WORKER)
    worker._pool = ThreadPoolExecutor(1)
    worker._pool.shutdown()
    handle = app.start(job)
    [claimed] = app.store.claim(
        app.name, worker.worker_id, app.workflow_versions(), lease_ttl=WORKER["lease_ttl"]
    )
    worker._dispatch([claimed])
    info = app.get(handle.run_id)
    assert (info.state, info.failures) == ("queued", 0)
    assert kinds(app, handle.run_id)[-2:] == ["claimed", "released"]
    assert handle.run_id not in worker._active

    with app.worker(**WORKER):
        assert handle.result(timeout=LIMIT) == "done"


# -- cancel while running -------------------------------------------------------------


def _gated_app(
    make_app: Callable[..., perdure.App],
    effect: str,
) -> tuple[perdure.App, Any, threading.Event, threading.Event, Counter[str]]:
    app = make_app()
    entered = threading.Event()
    gate = threading.Event()
    calls: Counter[str] = Counter()

    @app.step(effect=effect)  # type: ignore[call-overload]
    def inside() -> str:
        calls["inside"] += 1
        entered.set()
        assert gate.wait(LIMIT), "the test never opened the gate"
        return "inside done"

    @app.step()
    def later() -> str:
        calls["later"] += 1
        return "later"

    @app.workflow()
    def job(ctx: perdure.Context) -> list[str]:
        return [inside(), later()]

    return app, job, entered, gate, calls


@pytest.mark.parametrize("effect", ["idempotent", "once"])
def test_cancel_a_running_run_stops_it_after_the_current_step(
    make_app: Callable[..., perdure.App],
    effect: str,
) -> None:
    app, job, entered, gate, calls = _gated_app(make_app, effect)
    with app.worker(**WORKER):
        handle = app.start(job)
        try:
            assert entered.wait(LIMIT)
            assert app.cancel(handle.run_id) is True
            assert app.get(handle.run_id).cancel_requested
            assert app.get(handle.run_id).state == "running"
        finally:
            gate.set()
        info = wait_state(app, handle.run_id, "canceled", "needs_attention", "failed", "succeeded")
    # The step's outcome was recorded, so nothing is ambiguous: a clean cancel.
    assert journal(app, handle.run_id) == [(1, "step", "inside", "ok")]
    assert calls == Counter({"inside": 1})
    assert_canceled(info)


def test_cancel_while_a_once_step_fails_ambiguously_needs_attention(
    make_app: Callable[..., perdure.App],
) -> None:
    app = make_app()
    entered = threading.Event()
    gate = threading.Event()

    @app.step(effect="once")
    def charge() -> str:
        entered.set()
        assert gate.wait(LIMIT)
        raise ConnectionResetError("connection reset mid-charge")

    @app.workflow()
    def pay(ctx: perdure.Context) -> str:
        return charge()

    with app.worker(**WORKER):
        handle = app.start(pay)
        try:
            assert entered.wait(LIMIT)
            assert app.cancel(handle.run_id) is True
        finally:
            gate.set()
        info = wait_state(app, handle.run_id, "canceled", "needs_attention", "failed", "succeeded")
    assert info.state == "needs_attention"
    assert info.error is not None
    assert (info.error["code"], info.error["step"]) == ("effect_outcome_unknown", "charge")
    assert journal(app, handle.run_id) == [(1, "step", "charge", "started")]
    # ...and an operator can settle it.
    assert app.resolve(handle.run_id, "charge", error="charge reversed").state == "failed"


def test_a_recorded_step_failure_is_raised_again_on_replay(
    make_app: Callable[..., perdure.App],
) -> None:
    clock = FakeClock()
    app = make_app(clock=clock)
    attempts: list[int] = []
    caught: list[tuple[str, str]] = []

    @app.step(retry=perdure.Retry(max_attempts=1))
    def flaky() -> int:
        attempts.append(1)
        raise ValueError("nope")

    @app.workflow()
    def tolerant(ctx: perdure.Context) -> list[Any]:
        try:
            flaky()
        except perdure.StepFailed as exc:
            caught.append((exc.step, exc.error_type))
        ctx.sleep(timedelta(seconds=10))
        return [len(caught)]

    # warm=0: the run is replayed, not taken up warm (perdure.warm).
    with app.worker(**WORKER, warm=0):
        handle = app.start(tolerant)
        wait_state(app, handle.run_id, "waiting")
        clock.advance(11)
        assert handle.result(timeout=LIMIT) == [2]
    assert attempts == [1]  # replay did not run the step again
    assert caught == [("flaky", "ValueError"), ("flaky", "ValueError")]
    assert journal(app, handle.run_id) == [
        (1, "step", "flaky", "error"),
        (2, "sleep", "sleep", "ok"),
    ]


class CancelBeforeBeginEffect:
    """Delegate to a real store; request the run's cancel just before ``begin_effect``.

    This pins the race "a cancel lands after the engine's last check and before
    a once step records its start" without any timing.
    """

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def begin_effect(self, claim: Any, entries: Any, marks: Any = ()) -> None:
        self._inner.request_cancel(claim.run_id)
        self._inner.begin_effect(claim, entries, marks)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def test_cancel_before_a_once_step_starts_is_a_clean_cancel(
    make_app: Callable[..., perdure.App],
) -> None:
    app = make_app()
    calls: list[int] = []

    @app.step(effect="once")
    def charge() -> str:
        calls.append(1)
        return "charged"

    @app.workflow()
    def pay(ctx: perdure.Context) -> str:
        return charge()

    worker = perdure.Worker(app, CancelBeforeBeginEffect(app.store), **WORKER)  # type: ignore[arg-type]
    with worker:
        handle = app.start(pay)
        info = wait_state(app, handle.run_id, "canceled", "needs_attention", "failed", "succeeded")
    assert calls == []
    assert_canceled(info)
    # No start of an effect that never began: at most a record that the step was canceled.
    entries = app.store.journal(handle.run_id)
    assert all(e.status != "started" for e in entries), entries
    assert "effect_started" not in kinds(app, handle.run_id)


def test_stop_during_a_once_steps_retry_delay_after_effect_failed_is_not_ambiguous(
    make_app: Callable[..., perdure.App],
) -> None:
    app = make_app()
    calls: list[int] = []
    refused = threading.Event()

    @app.step(
        effect="once",
        retry=perdure.Retry(max_attempts=3, initial_delay=30, jitter=False, park_after=60),
    )
    def charge() -> str:
        calls.append(1)
        if len(calls) == 1:
            refused.set()
            raise perdure.EffectFailed("declined before charging")
        return "charged"

    @app.workflow()
    def pay(ctx: perdure.Context) -> str:
        return charge()

    first = app.worker(**WORKER).start()
    handle = app.start(pay)
    try:
        assert refused.wait(LIMIT)
    finally:
        first.stop()
    assert app.get(handle.run_id).state == "queued"
    # The refused attempt is journaled as certainly not having happened.
    [refusal] = app.store.journal(handle.run_id)
    assert (refusal.name, refusal.attempt) == ("charge", 1)
    assert refusal.error is not None
    assert codec.decode(refusal.error)["code"] == "effect_failed"
    with app.worker(**WORKER):
        info = wait_state(app, handle.run_id, "succeeded", "needs_attention", "failed")
    assert (info.state, info.result, calls) == ("succeeded", "charged", [1, 1])
    entries = app.store.journal(handle.run_id)
    assert [(e.name, e.status, e.attempt) for e in entries] == [("charge", "ok", 2)]
    assert kinds(app, handle.run_id).count("effect_started") == 2


# -- pinned code, unknown workflows, result timeouts ------------------------------


def test_a_worker_claims_only_the_workflow_versions_it_has(
    make_app: Callable[..., perdure.App],
) -> None:
    v1 = make_app(name="pinned")
    v2 = make_app(name="pinned")
    other = make_app(name="another_app")
    ran: list[str] = []

    @v1.workflow(name="flow", version="1")
    def flow_v1(ctx: perdure.Context) -> str:
        ran.append("v1")
        return "v1"

    @v2.workflow(name="flow", version="2")
    def flow_v2(ctx: perdure.Context) -> str:
        ran.append("v2")
        return "v2"

    @other.workflow(name="flow", version="1")
    def flow_other(ctx: perdure.Context) -> str:
        ran.append("other")
        return "other"

    old_run = v1.start(flow_v1)
    assert probe_claim(v2) == []  # wrong version
    assert probe_claim(other) == []  # another app's run
    with v2.worker(**WORKER), other.worker(**WORKER):
        new_run = v2.start(flow_v2)
        assert new_run.result(timeout=LIMIT) == "v2"
        assert v2.get(old_run.run_id).state == "queued"
    with v1.worker(**WORKER):
        assert old_run.result(timeout=LIMIT) == "v1"
    assert ran == ["v2", "v1"]
    assert (v1.get(old_run.run_id).version, v2.get(new_run.run_id).version) == ("1", "2")


def test_unknown_workflows_and_runs_are_refused(make_app: Callable[..., perdure.App]) -> None:
    app = make_app()

    @app.workflow()
    def known(ctx: perdure.Context) -> None: ...

    with pytest.raises(perdure.WorkflowNotFound, match="nope"):
        app.start("nope")
    with pytest.raises(perdure.RunNotFound):
        app.get("no-such-run")
    with pytest.raises(perdure.RunNotFound):
        app.cancel("no-such-run")
    handle = app.start("known")  # by name
    with pytest.raises(perdure.ResultTimeout):  # no worker is running
        handle.result(timeout=0.05)
    assert handle.status() == "queued"


@pytest.mark.parametrize("effect", ["idempotent", "once"])
def test_a_step_returning_a_non_json_value_is_named_in_the_error(
    make_app: Callable[..., perdure.App], effect: str
) -> None:
    app = make_app()

    calls: list[int] = []

    @app.step(effect=effect, retry=perdure.Retry(max_attempts=3, initial_delay=0))  # type: ignore[call-overload]
    def odd() -> Any:
        calls.append(1)
        return object()

    @app.workflow()
    def wf(ctx: perdure.Context) -> Any:
        return odd()

    with app.worker(**WORKER):
        handle = app.start(wf)
        info = wait_state(app, handle.run_id, "failed", "needs_attention", "succeeded")
    assert info.error is not None
    assert info.error["step"] == "odd", info.error
    assert "InvalidPayload" in info.error["message"]
    assert calls == [1]  # the same value would fail again: not retried
    if effect == "once":
        # The effect happened but its outcome cannot be recorded: an operator decides.
        assert (info.state, info.error["code"]) == ("needs_attention", "effect_outcome_unknown")
        assert journal(app, handle.run_id) == [(1, "step", "odd", "started")]
    else:
        assert (info.state, info.error["code"]) == ("failed", "step_failed")
        assert journal(app, handle.run_id) == [(1, "step", "odd", "error")]


def _refusing_charge_app(
    make_app: Callable[..., perdure.App], gate: threading.Event | None = None
) -> tuple[perdure.App, Any, list[int], threading.Event]:
    """An app whose once step ``charge`` always raises EffectFailed (after ``gate``, if given)."""
    app = make_app()
    calls: list[int] = []
    entered = threading.Event()

    @app.step(
        effect="once",
        retry=perdure.Retry(max_attempts=3, initial_delay=30, jitter=False, park_after=60),
    )
    def charge() -> str:
        calls.append(1)
        entered.set()
        if gate is not None:
            assert gate.wait(LIMIT), "the test never opened the gate"
        raise perdure.EffectFailed("declined before charging")

    @app.workflow()
    def pay(ctx: perdure.Context) -> str:
        return charge()

    return app, pay, calls, entered


def _refusal_recorded(app: perdure.App, run_id: str) -> bool:
    entries = app.store.journal(run_id)
    return bool(entries) and entries[0].error is not None


def test_cancel_during_a_once_steps_retry_delay_after_effect_failed_is_clean(
    make_app: Callable[..., perdure.App],
) -> None:
    app, pay, calls, _ = _refusing_charge_app(make_app)
    with app.worker(**WORKER):
        handle = app.start(pay)
        # The refusal is journaled before the retry pause: cancel inside the pause.
        wait_for(lambda: _refusal_recorded(app, handle.run_id), "the refusal to be journaled")
        assert app.cancel(handle.run_id) is True
        info = wait_state(app, handle.run_id, "canceled", "needs_attention", "failed")
    assert_canceled(info)
    assert calls == [1]


def test_cancel_while_a_once_step_runs_then_effect_failed_is_a_clean_cancel(
    make_app: Callable[..., perdure.App],
) -> None:
    gate = threading.Event()
    app, pay, calls, entered = _refusing_charge_app(make_app, gate)
    with app.worker(**WORKER):
        handle = app.start(pay)
        try:
            assert entered.wait(LIMIT)
            assert app.cancel(handle.run_id) is True
        finally:
            gate.set()
        info = wait_state(app, handle.run_id, "canceled", "needs_attention", "failed")
    assert calls == [1]
    assert_canceled(info)
