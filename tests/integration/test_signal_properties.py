"""Properties of one wait under every order of signal, timeout, cancel, claim and crash.

A model predicts, event by event, what each call returns or raises, the run's
state and the one outcome record; the real store and engine must agree. The
run is stepped by hand through the engine (a claim, then the worker's own
execution of the claim, in this thread), so every order is exact. A crash is a
claim taken and abandoned, then the clock moved past its lease.

The run's branch is the stored outcome's kind (its result says "signaled" or
"timed_out"), unless a cancel took effect first: a cancel is of the run, so it
ends canceled even when a signal had already settled the wait.

Races are driven with threads released by a barrier: however they interleave,
exactly one settler creates the outcome and every other one is answered with
what is stored; the branch the run then takes is the stored outcome's kind.

Each hypothesis example gets a fresh store: a SQLite file in a directory made
for it, and (fewer examples) a fresh PostgreSQL database.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import perdure
from perdure import codec
from perdure import worker as worker_api
from perdure.records import Receipt
from perdure.store import port
from perdure.testing.clock import FakeClock

T0 = datetime(2030, 1, 1, tzinfo=UTC)
TIMEOUT = timedelta(minutes=10)  # the wait's timeout
PAST_DEADLINE = TIMEOUT + timedelta(seconds=1)
LEASE = 3.0  # seconds of the hand-driven claims
PAST_LEASE = timedelta(seconds=LEASE + 1)
SIGNAL_IDS = ("s-a", "s-b", "s-c")
# Signals here name gate's one wait exactly: a signal to the bare name "go" would
# be kept for a later wait instead (test_repeated_waits.py models that).
ONE_WAIT = "go#1"
LIMIT = 15.0
WORKER: dict[str, Any] = {"concurrency": 8, "lease_ttl": 2, "heartbeat": 0.5, "poll_interval": 0.2}


# -- the app and a hand-driven worker ----------------------------------------------------


def make_app(url: str, clock: FakeClock) -> perdure.App:
    app = perdure.App(url, name=f"prop_{uuid.uuid4().hex[:8]}", clock=clock, max_failures=100)

    @app.workflow()
    def gate(ctx: perdure.Context) -> dict[str, Any]:
        try:
            payload = ctx.wait("go", timeout=TIMEOUT)
        except perdure.WaitTimedOut:
            return {"branch": "timed_out"}
        return {"branch": "signaled", "payload": payload}

    return app


class Hand:
    """Claims and executes runs in the calling thread, through the worker's own code."""

    def __init__(self, app: perdure.App) -> None:
        self.app = app
        self.worker = perdure.Worker(app, app.store, concurrency=1, lease_ttl=LEASE, heartbeat=1)

    def claim(self, worker_id: str) -> list[port.Claimed]:
        return self.app.store.claim(
            self.app.name, worker_id, self.app.workflow_versions(), lease_ttl=LEASE, limit=5
        )

    def drive(self) -> list[str]:
        """Claim what is ready and execute it to its next resting point; return the run ids."""
        claimed = self.claim(self.worker.worker_id)
        for item in claimed:
            worker_api.Execution(self.worker, item).run()
        return [c.claim.run_id for c in claimed]


# -- the model ---------------------------------------------------------------------------


@dataclasses.dataclass
class Stored:
    kind: str
    signal_id: str | None
    payload: Any
    at: datetime


@dataclasses.dataclass
class Model:
    """What the engine must do with one run of ``gate``."""

    run_id: str
    now: datetime = T0
    state: str = "queued"  # queued | running | waiting | succeeded | canceled
    deadline: datetime | None = None  # journaled the first time the wait is reached
    cancel_requested: bool = False
    outcome: Stored | None = None
    woken: int = 0  # waiting -> queued transitions, each a "woken" receipt

    @property
    def ended(self) -> bool:
        return self.state in ("succeeded", "canceled")

    @property
    def expired(self) -> bool:
        return self.deadline is not None and self.now >= self.deadline

    @property
    def claimable(self) -> bool:
        # queued; waiting with its deadline due; running whose lease lapsed
        # (every abandoned claim is followed by a clock move past its lease).
        return self.state in ("queued", "running") or (self.state == "waiting" and self.expired)

    def receipt(self) -> Receipt:
        assert self.outcome is not None
        signaled = self.outcome.kind == "signaled"
        return Receipt(
            wait_id=f"{self.run_id}/go",
            run_id=self.run_id,
            name="go",
            outcome=self.outcome.kind,
            signal_id=self.outcome.signal_id,
            at=self.outcome.at,
            payload_digest=codec.digest(codec.encode(self.outcome.payload)) if signaled else None,
        )

    def settle(self, kind: str, signal_id: str | None = None, payload: Any = None) -> None:
        self.outcome = Stored(kind, signal_id, payload, self.now)
        if self.state == "waiting":
            self.state = "queued"
            self.woken += 1

    def expire_if_due(self) -> None:
        if not self.ended and self.outcome is None and self.expired:
            self.settle("timed_out")

    def result(self) -> dict[str, Any]:
        assert self.outcome is not None
        if self.outcome.kind == "signaled":
            return {"branch": "signaled", "payload": self.outcome.payload}
        return {"branch": "timed_out"}


Event = tuple[Any, ...]

events = st.lists(
    st.one_of(
        st.tuples(
            st.just("signal"),
            st.sampled_from(SIGNAL_IDS),
            st.one_of(st.integers(-3, 3), st.text("xyz", max_size=3), st.none()),
        ),
        st.tuples(st.just("timeout"), st.sampled_from(["nobody", "waits", "sweep"])),
        st.tuples(st.just("cancel")),
        st.tuples(st.just("crash")),
        st.tuples(st.just("drive")),
    ),
    min_size=1,
    max_size=9,
)


def check_signal(app: perdure.App, m: Model, signal_id: str, payload: Any) -> None:
    if m.ended:
        # An ended run's records are gone; the journal answers for a wait it
        # applied (a repeat gets its receipt, any other signal WaitSettled).
        applied = any(
            e.kind == "wait" and e.status != "started" for e in app.store.journal(m.run_id)
        )
        assert applied or m.state == "canceled"
        if not applied:
            with pytest.raises(perdure.RunFinished):
                app.signal(m.run_id, ONE_WAIT, payload, signal_id=signal_id)
            return
        assert m.outcome is not None
        if m.outcome.kind == "signaled" and m.outcome.signal_id == signal_id:
            assert app.signal(m.run_id, ONE_WAIT, payload, signal_id=signal_id) == m.receipt()
            return
        with pytest.raises(perdure.WaitSettled) as settled:
            app.signal(m.run_id, ONE_WAIT, payload, signal_id=signal_id)
        assert settled.value.receipt == m.receipt()
        return
    if m.outcome is None and m.expired:
        m.settle("timed_out")
        with pytest.raises(perdure.WaitExpired) as expired:
            app.signal(m.run_id, ONE_WAIT, payload, signal_id=signal_id)
        assert expired.value.receipt == m.receipt()
        return
    if m.outcome is None:
        m.settle("signaled", signal_id, payload)
        assert app.signal(m.run_id, ONE_WAIT, payload, signal_id=signal_id) == m.receipt()
        return
    if m.outcome.kind == "signaled" and m.outcome.signal_id == signal_id:
        # A repeat: the original receipt, whatever the payload this time.
        assert app.signal(m.run_id, ONE_WAIT, payload, signal_id=signal_id) == m.receipt()
        return
    with pytest.raises(perdure.WaitSettled) as settled:
        app.signal(m.run_id, ONE_WAIT, payload, signal_id=signal_id)
    assert settled.value.receipt == m.receipt()


def check_drive(hand: Hand, m: Model) -> None:
    driven = hand.drive()
    assert driven == ([m.run_id] if m.claimable else [])
    if not driven:
        return
    m.state = "running"
    if m.cancel_requested:
        m.state = "canceled"
        return
    if m.deadline is None:
        m.deadline = m.now + TIMEOUT
    m.expire_if_due()
    m.state = "waiting" if m.outcome is None else "succeeded"


def apply(app: perdure.App, clock: FakeClock, hand: Hand, m: Model, event: Event) -> None:
    kind = event[0]
    if kind == "signal":
        check_signal(app, m, event[1], event[2])
    elif kind == "timeout":
        m.now = clock.advance(PAST_DEADLINE.total_seconds())
        if event[1] == "waits":
            listed = app.waits()
            m.expire_if_due()
            assert listed == []  # every wait reached so far has expired by now
        elif event[1] == "sweep":
            app.store.sweep()
            m.expire_if_due()
    elif kind == "cancel":
        took = app.cancel(m.run_id)
        if m.ended or (m.state == "running" and m.cancel_requested):
            assert took is False
        elif m.state == "running":
            assert took is True
            m.cancel_requested = True
            if m.deadline is not None and m.outcome is None:
                # The owner is gone and the wait is registered and open. The cancel
                # may settle it as canceled (PostgreSQL does; SQLite does not, see
                # test_signals.py::test_a_cancel_of_a_running_run_settles_its_open_wait):
                # either way every later settler must be answered from the store.
                stored = app.store.outcomes(m.run_id)
                if stored:
                    m.settle("canceled")
        else:
            assert took is True
            m.state = "canceled"
    elif kind == "crash":
        got = hand.claim("ghost")
        assert [c.claim.run_id for c in got] == ([m.run_id] if m.claimable else [])
        if got:
            m.state = "running"
        m.now = clock.advance(PAST_LEASE.total_seconds())
    elif kind == "drive":
        check_drive(hand, m)
    else:  # pragma: no cover
        raise AssertionError(event)


def check_stored(app: perdure.App, m: Model) -> None:
    """The store agrees with the model: state, the one outcome record, the open waits."""
    assert app.get(m.run_id).state == m.state
    stored = app.store.outcomes(m.run_id)
    if m.ended or m.outcome is None:
        assert stored == []
    else:
        (only,) = stored
        payload = None if m.outcome.kind != "signaled" else codec.encode(m.outcome.payload)
        assert (only.name, only.outcome, only.signal_id, only.payload, only.at) == (
            "go",
            m.outcome.kind,
            m.outcome.signal_id,
            payload,
            m.outcome.at,
        )
    registered = app.store.waits(app.name, m.run_id)
    if m.ended or m.deadline is None or m.outcome is not None:
        assert registered == []
    else:
        assert [(w.name, w.kind, w.deadline) for w in registered] == [("go", "signal", m.deadline)]


def run_to_the_end(app: perdure.App, clock: FakeClock, hand: Hand, m: Model) -> None:
    for _ in range(4):
        if m.ended:
            return
        if m.state == "waiting" and not m.claimable:
            m.now = clock.advance(PAST_DEADLINE.total_seconds())
        check_drive(hand, m)
        check_stored(app, m)
    raise AssertionError(f"the run did not end: {m}")


def check_ended(app: perdure.App, m: Model) -> None:
    info = app.get(m.run_id)
    assert info.state == m.state
    history = [h.kind for h in app.history(m.run_id)]
    entries = [(e.position, e.kind, e.name, e.status) for e in app.store.journal(m.run_id)]
    if m.state == "succeeded":
        assert m.outcome is not None
        assert info.result == m.result()
        status = "ok" if m.outcome.kind == "signaled" else "error"
        assert entries == [(1, "wait", "go", status)]
        assert history.count("outcome_applied") == 1
    else:
        assert info.result is None
        assert history.count("outcome_applied") == 0
        assert entries in ([], [(1, "wait", "go", "started")])
    assert app.waits() == []
    assert app.store.outcomes(m.run_id) == []
    assert history.count("woken") == m.woken


def play(url: str, script: list[Event]) -> None:
    clock = FakeClock()
    app = make_app(url, clock)
    try:
        hand = Hand(app)
        m = Model(app.start("gate").run_id)
        for event in script:
            apply(app, clock, hand, m, event)
            check_stored(app, m)
        run_to_the_end(app, clock, hand, m)
        check_ended(app, m)
    finally:
        app.close()


# -- fresh stores per example ------------------------------------------------------------


@contextlib.contextmanager
def fresh_sqlite() -> Iterator[str]:
    where = tempfile.mkdtemp(prefix="perdure-prop-")
    try:
        yield f"sqlite:///{where}/store.db"
    finally:
        shutil.rmtree(where, ignore_errors=True)


@contextlib.contextmanager
def fresh_postgres() -> Iterator[str]:
    import pg  # tests/pg.py

    url = pg.create_database()
    try:
        yield url
    finally:
        pg.drop_database(url)


def require(request: pytest.FixtureRequest, kind: str) -> None:
    if request.config.getoption("--store") not in ("all", kind):
        pytest.skip(f"--store excludes {kind}")
    if kind == "postgres":
        request.getfixturevalue("postgres_server")


def test_every_order_settles_one_outcome_on_sqlite(request: pytest.FixtureRequest) -> None:
    require(request, "sqlite")

    @settings(
        max_examples=40,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(script=events)
    def check(script: list[Event]) -> None:
        with fresh_sqlite() as url:
            play(url, script)

    check()


@pytest.mark.postgres
def test_every_order_settles_one_outcome_on_postgres(request: pytest.FixtureRequest) -> None:
    require(request, "postgres")

    @settings(
        max_examples=10,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(script=events)
    def check(script: list[Event]) -> None:
        with fresh_postgres() as url:
            play(url, script)

    check()


# A few orders worth keeping whatever hypothesis draws.
EXPLICIT = [
    [("signal", "s-a", 1), ("drive",)],
    [("drive",), ("signal", "s-a", 1), ("signal", "s-a", 2), ("signal", "s-b", 3)],
    [("drive",), ("timeout", "nobody"), ("signal", "s-a", 1), ("signal", "s-a", 1)],
    [("drive",), ("timeout", "waits"), ("signal", "s-a", 1)],
    [("drive",), ("timeout", "sweep"), ("cancel",)],
    [("drive",), ("signal", "s-a", 1), ("cancel",), ("signal", "s-a", 1)],
    [("crash",), ("signal", "s-a", 1), ("cancel",), ("signal", "s-b", 2), ("drive",)],
    [("drive",), ("timeout", "nobody"), ("crash",), ("signal", "s-a", 1), ("drive",)],
    [("drive",), ("signal", "s-b", 1), ("crash",), ("crash",), ("timeout", "sweep"), ("drive",)],
    [("cancel",), ("signal", "s-a", 1), ("cancel",), ("drive",)],
    [("drive",), ("timeout", "nobody"), ("crash",), ("cancel",), ("signal", "s-a", 1)],
    [("drive",), ("timeout", "nobody"), ("crash",), ("cancel",), ("timeout", "waits")],
]


@pytest.mark.parametrize("script", EXPLICIT, ids=[str(i) for i in range(len(EXPLICIT))])
def test_chosen_orders_settle_one_outcome(store_url: str, script: list[Event]) -> None:
    play(store_url, script)


# -- races ---------------------------------------------------------------------------------


def race(work: list[Callable[[], Any]]) -> list[tuple[str, Any]]:
    """Run every callable at once (released by one barrier); return ("ok"|"raised", value)."""
    barrier = threading.Barrier(len(work))
    results: list[tuple[str, Any]] = [("missing", None)] * len(work)

    def contender(i: int) -> None:
        barrier.wait(LIMIT)
        try:
            results[i] = ("ok", work[i]())
        except BaseException as exc:
            results[i] = ("raised", exc)

    threads = [threading.Thread(target=contender, args=(i,)) for i in range(len(work))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(LIMIT * 2)
    assert all(kind != "missing" for kind, _ in results), results
    return results


def wait_all(app: perdure.App, run_ids: list[str], *states: str) -> None:
    deadline = time.monotonic() + LIMIT
    while True:
        found = {r: app.get(r).state for r in run_ids}
        if all(s in states for s in found.values()):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"runs did not reach {states}: {found}")
        time.sleep(0.02)


def parked_runs(app: perdure.App, n: int) -> list[str]:
    with app.worker(**WORKER):
        run_ids = [app.start("gate").run_id for _ in range(n)]
        wait_all(app, run_ids, "waiting")
    return run_ids


@pytest.fixture
def race_app(store_url: str) -> Iterator[tuple[perdure.App, FakeClock]]:
    clock = FakeClock()
    app = make_app(store_url, clock)
    yield app, clock
    app.close()


def test_racing_signals_have_one_winner(race_app: tuple[perdure.App, FakeClock]) -> None:
    app, _ = race_app
    run_ids = parked_runs(app, 4)
    winners: dict[str, str | None] = {}
    for rid in run_ids:
        ids = [f"sig-{i}" for i in range(6)]
        results = race([lambda r=rid, s=s: app.signal(r, ONE_WAIT, s, signal_id=s) for s in ids])
        won = [value for kind, value in results if kind == "ok"]
        lost = [value for kind, value in results if kind == "raised"]
        assert len(won) == 1, results
        winner: Receipt = won[0]
        assert all(isinstance(e, perdure.WaitSettled) for e in lost), lost
        assert all(e.receipt == winner for e in lost)
        (stored,) = app.store.outcomes(rid)
        assert (stored.outcome, stored.signal_id) == ("signaled", winner.signal_id)
        assert stored.payload == codec.encode(winner.signal_id)
        assert app.get(rid).state == "queued"
        assert [h.kind for h in app.history(rid)].count("woken") == 1
        winners[rid] = winner.signal_id
    with app.worker(**WORKER):
        for rid, signal_id in winners.items():
            assert app.handle(rid).result(timeout=LIMIT) == {
                "branch": "signaled",
                "payload": signal_id,
            }


def test_racing_repeats_of_one_signal_all_get_the_same_receipt(
    race_app: tuple[perdure.App, FakeClock],
) -> None:
    app, _ = race_app
    (rid,) = parked_runs(app, 1)
    results = race(
        [lambda r=rid, i=i: app.signal(r, ONE_WAIT, i, signal_id="same") for i in range(6)]
    )
    assert all(kind == "ok" for kind, _ in results), results
    receipts = {value for _, value in results}
    assert len(receipts) == 1
    (stored,) = app.store.outcomes(rid)
    (receipt,) = receipts
    assert (receipt.signal_id, receipt.payload_digest) == ("same", stored.payload_digest)
    assert [h.kind for h in app.history(rid)].count("woken") == 1


def test_racing_late_signals_one_expires_the_wait(
    race_app: tuple[perdure.App, FakeClock],
) -> None:
    app, clock = race_app
    run_ids = parked_runs(app, 3)
    clock.advance(PAST_DEADLINE.total_seconds())
    for rid in run_ids:
        results = race(
            [lambda r=rid, i=i: app.signal(r, ONE_WAIT, i, signal_id=f"late-{i}") for i in range(6)]
        )
        errors = [value for _, value in results]
        assert all(kind == "raised" for kind, _ in results), results
        expired = [e for e in errors if isinstance(e, perdure.WaitExpired)]
        settled = [e for e in errors if isinstance(e, perdure.WaitSettled)]
        assert len(expired) == 1 and len(settled) == 5, errors
        timed_out = Receipt(f"{rid}/go", rid, "go", "timed_out", None, clock.now(), None)
        assert all(e.receipt == timed_out for e in errors)
    with app.worker(**WORKER):
        for rid in run_ids:
            assert app.handle(rid).result(timeout=LIMIT) == {"branch": "timed_out"}


def test_racing_signals_deadlines_and_cancels_leave_one_outcome(
    race_app: tuple[perdure.App, FakeClock],
) -> None:
    """Signals, deadline enforcement and cancel records race to create the one outcome."""
    app, clock = race_app
    run_ids = parked_runs(app, 6)
    winners: dict[str, port.Outcome] = {}
    for rid in run_ids:
        now = clock.now()
        offers = [
            port.Outcome(rid, "go", kind, None, None, None, now)
            for kind in ("timed_out", "canceled", "timed_out", "canceled")
        ]
        work: list[Callable[[], Any]] = [
            lambda r=rid, s=s: app.signal(r, ONE_WAIT, s, signal_id=s) for s in ("x", "y", "z")
        ]
        work += [lambda r=rid, o=o: app.store.settle_wait(r, "go", o) for o in offers]
        results = race(work)
        (stored,) = app.store.outcomes(rid)
        winners[rid] = stored
        created = [v for k, v in results[3:] if k == "ok" and v[1]]
        assert all(k == "ok" and v[0] == stored for k, v in results[3:]), results
        signal_results = results[:3]
        if stored.outcome == "signaled":
            assert created == []
            ok = [v for k, v in signal_results if k == "ok"]
            assert [r.signal_id for r in ok] == [stored.signal_id]
        else:
            assert len(created) == 1
            assert all(k == "raised" for k, _ in signal_results)
        receipts = [v if k == "ok" else v.receipt for k, v in signal_results]
        assert len(set(receipts)) == 1, receipts
        assert receipts[0].outcome == stored.outcome
        assert app.get(rid).state == "queued"
    with app.worker(**WORKER):
        wait_all(app, run_ids, "succeeded", "canceled", "failed")
    for rid, stored in winners.items():
        info = app.get(rid)
        if stored.outcome == "canceled":
            assert info.state == "canceled"
        elif stored.outcome == "timed_out":
            assert (info.state, info.result) == ("succeeded", {"branch": "timed_out"})
        else:
            assert (info.state, info.result) == (
                "succeeded",
                {"branch": "signaled", "payload": stored.signal_id},
            )
        assert app.store.outcomes(rid) == []


def test_racing_cancel_listing_sweep_and_signals_past_the_deadline(
    race_app: tuple[perdure.App, FakeClock],
) -> None:
    app, clock = race_app
    for _ in range(3):
        # One run per round: a sweep settles every expired wait of the store.
        (rid,) = parked_runs(app, 1)
        clock.advance(PAST_DEADLINE.total_seconds())
        work: list[Callable[[], Any]] = [
            lambda r=rid: app.signal(r, ONE_WAIT, 1, signal_id="a"),
            lambda r=rid: app.signal(r, ONE_WAIT, 2, signal_id="b"),
            lambda r=rid: app.waits(r),
            app.store.sweep,
            lambda r=rid: app.cancel(r),
        ]
        results = race(work)
        assert all(k == "ok" for k, _ in results[2:]), results
        assert results[2][1] == []  # expired, so never listed as open
        assert results[4] == ("ok", True)  # waiting or queued: canceled at once
        assert app.get(rid).state == "canceled"
        receipts = []
        for kind, value in results[:2]:
            assert kind == "raised", results
            if isinstance(value, perdure.RunFinished):
                continue  # the cancel came first
            assert isinstance(value, perdure.WaitExpired | perdure.WaitSettled), value
            receipts.append(value.receipt)
        timed_out = Receipt(f"{rid}/go", rid, "go", "timed_out", None, clock.now(), None)
        assert all(r == timed_out for r in receipts), receipts
        assert sum(isinstance(v, perdure.WaitExpired) for _, v in results[:2]) <= 1
        assert app.store.outcomes(rid) == []
        assert app.store.waits(app.name, rid) == []
