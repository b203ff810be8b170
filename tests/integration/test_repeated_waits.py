"""A run that waits on one name many times: each wait is a wait of its own.

The first wait on ``go`` is ``go``, the second ``go#2``, and so on. A signal
sent to ``go`` settles the earliest of them without an outcome, reached or
not, so signals are applied in arrival order, one per wait; everything that
holds for one wait (one outcome, its own deadline, cancel, dedup by
``signal_id``) holds for each. Runs are driven by hand (a claim, then the
worker's own execution of it, in this thread) and time is a FakeClock, so
every order is exact. A model-based property test drives random orders; a
crash test kills a real worker process between two waits.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import perdure
from perdure import codec
from perdure import worker as worker_api
from perdure.records import Receipt
from perdure.testing.clock import FakeClock

T0 = datetime(2030, 1, 1, tzinfo=UTC)
TIMEOUT = timedelta(minutes=10)
PAST_DEADLINE = TIMEOUT + timedelta(seconds=1)
ROUNDS = 3
LIMIT = 30.0


def make_app(url: str, clock: FakeClock) -> perdure.App:
    app = perdure.App(url, name=f"rw_{uuid.uuid4().hex[:8]}", clock=clock, max_failures=100)

    @app.workflow()
    def rounds(ctx: perdure.Context) -> list[Any]:
        got: list[Any] = []
        for _ in range(ROUNDS):
            try:
                got.append(ctx.wait("go", timeout=TIMEOUT))
            except perdure.WaitTimedOut:
                got.append("timed out")
        return got

    @app.workflow()
    def forever(ctx: perdure.Context) -> list[Any]:
        return [ctx.wait("go"), ctx.wait("go")]

    @app.workflow()
    def hashed(ctx: perdure.Context) -> Any:
        return ctx.wait("a#b")

    return app


def drive(app: perdure.App) -> list[str]:
    """Claim what is ready and execute it to its next resting point; return the run ids."""
    worker = perdure.Worker(app, app.store, concurrency=1, lease_ttl=3, heartbeat=1)
    claimed = app.store.claim(app.name, worker.worker_id, app.workflow_versions(), lease_ttl=3)
    for item in claimed:
        worker_api.Execution(worker, item).run()
    return [c.claim.run_id for c in claimed]


def key(index: int) -> str:
    return "go" if index == 1 else f"go#{index}"


def names(app: perdure.App, run_id: str) -> list[tuple[str, str, str]]:
    return [(e.kind, e.name, e.status) for e in app.store.journal(run_id)]


@pytest.fixture
def app(store_url: str) -> Iterator[tuple[perdure.App, FakeClock]]:
    clock = FakeClock()
    made = make_app(store_url, clock)
    yield made, clock
    made.close()


def test_each_wait_gets_its_own_signal_in_arrival_order(
    app: tuple[perdure.App, FakeClock],
) -> None:
    a, _ = app
    rid = a.start("rounds").run_id
    # Sent before the run reached any wait: kept for the first one.
    first = a.signal(rid, "go", "user1", signal_id="s1")
    assert (first.wait_id, first.name) == (f"{rid}/go", "go")
    assert drive(a) == [rid]
    assert a.get(rid).state == "waiting"
    assert [w.wait_id for w in a.waits(rid)] == [f"{rid}/go#2"]
    second = a.signal(rid, "go", "user2", signal_id="s2")
    third = a.signal(rid, "go", "user3", signal_id="s3")
    assert [second.wait_id, third.wait_id] == [f"{rid}/go#2", f"{rid}/go#3"]
    # A repeat of an applied signal is answered with its receipt and takes no wait.
    assert a.signal(rid, "go", "again", signal_id="s1") == first
    assert a.signal(rid, "go", "again", signal_id="s2") == second
    assert drive(a) == [rid]
    assert a.get(rid).result == ["user1", "user2", "user3"]
    assert names(a, rid) == [("wait", key(i), "ok") for i in (1, 2, 3)]
    applied = [h.step for h in a.history(rid) if h.kind == "outcome_applied"]
    assert applied == ["go", "go#2", "go#3"]
    # After the end the journal answers each sender's retry with its own receipt.
    assert a.signal(rid, "go", "late", signal_id="s3") == third
    with pytest.raises(perdure.WaitSettled) as settled:
        a.signal(rid, "go", "late", signal_id="s4")
    assert settled.value.receipt == third


def test_a_timed_out_wait_leaves_the_next_one_open(app: tuple[perdure.App, FakeClock]) -> None:
    a, clock = app
    rid = a.start("rounds").run_id
    assert drive(a) == [rid]
    clock.advance(PAST_DEADLINE.total_seconds())
    # The first wait times out; the second gets a deadline of its own, from now.
    assert drive(a) == [rid]
    (open_wait,) = a.waits(rid)
    assert (open_wait.name, open_wait.deadline) == ("go#2", clock.now() + TIMEOUT)
    got = a.signal(rid, "go", "late but in time for the second")
    assert got.wait_id == f"{rid}/go#2"
    assert drive(a) == [rid]
    clock.advance(PAST_DEADLINE.total_seconds())
    assert drive(a) == [rid]
    assert a.get(rid).result == ["timed out", "late but in time for the second", "timed out"]
    assert names(a, rid) == [
        ("wait", "go", "error"),
        ("wait", "go#2", "ok"),
        ("wait", "go#3", "error"),
    ]


def test_a_signal_that_finds_its_wait_expired_is_refused_and_the_next_is_left_alone(
    app: tuple[perdure.App, FakeClock],
) -> None:
    a, clock = app
    rid = a.start("rounds").run_id
    a.signal(rid, "go", "one")
    assert drive(a) == [rid]  # applied "one"; parked on go#2
    clock.advance(PAST_DEADLINE.total_seconds())
    with pytest.raises(perdure.WaitExpired) as expired:
        a.signal(rid, "go", "two", signal_id="late")
    assert (expired.value.receipt.wait_id, expired.value.receipt.outcome) == (
        f"{rid}/go#2",
        "timed_out",
    )
    assert sorted(o.name for o in a.store.outcomes(rid)) == ["go", "go#2"]
    # The refused signal stored nothing: sent again, it is a new signal, for go#3.
    assert a.signal(rid, "go", "two", signal_id="late").wait_id == f"{rid}/go#3"
    assert drive(a) == [rid]
    assert a.get(rid).result == ["one", "timed out", "two"]


def test_naming_one_wait_settles_that_wait_only(app: tuple[perdure.App, FakeClock]) -> None:
    a, _ = app
    rid = a.start("forever").run_id
    second = a.signal(rid, "go#2", "second first")
    assert second.wait_id == f"{rid}/go#2"
    with pytest.raises(perdure.WaitSettled) as settled:
        a.signal(rid, "go#2", "another")
    assert settled.value.receipt == second
    # The bare name takes the earliest wait without an outcome: go itself.
    first = a.signal(rid, "go", "first")
    assert first.wait_id == f"{rid}/go"
    # "go#1" is the first wait itself, by its number.
    with pytest.raises(perdure.WaitSettled) as settled_first:
        a.signal(rid, "go#1", "x", signal_id="n")
    assert settled_first.value.receipt == first
    assert drive(a) == [rid]
    assert a.get(rid).result == ["first", "second first"]


def test_bad_wait_names_are_refused(app: tuple[perdure.App, FakeClock]) -> None:
    a, _ = app
    rid = a.start("forever").run_id
    for bad in ("go#0", "go#x", "go#2#3", "#2", "a/b", "", "child:x"):
        with pytest.raises(perdure.InvalidInput):
            a.signal(rid, bad, 1)
    assert a.store.outcomes(rid) == []
    a.cancel(rid)
    hashed = a.start("hashed").run_id
    assert drive(a) == [hashed]
    info = a.get(hashed)
    assert info.state == "failed"
    assert info.error is not None
    assert (info.error["code"], info.error["type"]) == ("workflow_failed", "InvalidInput")
    assert "without '/' or '#'" in info.error["message"]


def test_a_cancel_settles_the_open_wait_of_a_later_round(
    app: tuple[perdure.App, FakeClock],
) -> None:
    a, _ = app
    rid = a.start("forever").run_id
    a.signal(rid, "go", "one")
    assert drive(a) == [rid]
    assert [w.name for w in a.waits(rid)] == ["go#2"]
    assert a.cancel(rid) is True
    assert a.get(rid).state == "canceled"
    assert a.waits(rid) == []
    with pytest.raises(perdure.WaitSettled) as settled:
        a.signal(rid, "go", "two")
    assert settled.value.receipt.wait_id == f"{rid}/go"  # the journal's latest applied wait


def test_concurrent_signals_take_one_wait_each(app: tuple[perdure.App, FakeClock]) -> None:
    a, _ = app
    rid = a.start("rounds").run_id
    assert drive(a) == [rid]
    ids = ["x", "y", "z", "x", "y", "z"]
    barrier = threading.Barrier(len(ids))
    got: list[Any] = [None] * len(ids)

    def send(i: int) -> None:
        barrier.wait(LIMIT)
        got[i] = a.signal(rid, "go", ids[i], signal_id=ids[i])

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(ids))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(LIMIT)
    receipts: dict[str, Receipt] = {}
    for signal_id, receipt in zip(ids, got, strict=True):
        assert isinstance(receipt, Receipt), got
        assert receipts.setdefault(signal_id, receipt) == receipt  # one wait per signal_id
    assert sorted(r.name for r in receipts.values()) == ["go", "go#2", "go#3"]
    assert len(a.store.outcomes(rid)) == 3
    assert drive(a) == [rid]
    result = a.get(rid).result
    assert sorted(result) == ["x", "y", "z"]
    by_wait = {r.name: r.signal_id for r in receipts.values()}
    assert result == [by_wait["go"], by_wait["go#2"], by_wait["go#3"]]


# -- a model of the waits, driven in random orders --------------------------------------


@dataclasses.dataclass
class Slot:
    kind: str  # signaled | timed_out
    signal_id: str | None = None
    payload: Any = None


@dataclasses.dataclass
class Model:
    run_id: str
    now: datetime = T0
    state: str = "queued"  # queued | waiting | succeeded
    reached: int = 0  # the highest wait the run reached
    deadlines: dict[int, datetime] = dataclasses.field(default_factory=dict)
    slots: dict[int, Slot] = dataclasses.field(default_factory=dict)
    consumed: int = 0  # waits applied to the journal

    def earliest_open(self) -> int:
        index = 1
        while index in self.slots:
            index += 1
        return index

    def registered_expired(self, index: int) -> bool:
        return (
            self.state == "waiting"
            and index == self.reached
            and index in self.deadlines
            and self.now >= self.deadlines[index]
        )

    @property
    def claimable(self) -> bool:
        if self.state == "queued":
            return True
        return self.state == "waiting" and self.now >= self.deadlines[self.reached]

    def execute(self) -> None:
        while self.consumed < ROUNDS:
            index = self.consumed + 1
            if index > self.reached:
                self.reached = index
                self.deadlines[index] = self.now + TIMEOUT
            if index not in self.slots:
                if self.now < self.deadlines[index]:
                    self.state = "waiting"
                    return
                self.slots[index] = Slot("timed_out")
            self.consumed = index
        self.state = "succeeded"

    def result(self) -> list[Any]:
        return [
            self.slots[i].payload if self.slots[i].kind == "signaled" else "timed out"
            for i in range(1, ROUNDS + 1)
        ]


def model_signal(a: perdure.App, m: Model, signal_id: str, payload: Any) -> None:
    if m.state == "succeeded":
        applied = [m.slots[i] for i in range(1, ROUNDS + 1)]
        mine = [i for i in range(1, ROUNDS + 1) if applied[i - 1].signal_id == signal_id]
        if mine:
            assert a.signal(m.run_id, "go", payload, signal_id=signal_id).name == key(mine[0])
            return
        with pytest.raises(perdure.WaitSettled) as settled:
            a.signal(m.run_id, "go", payload, signal_id=signal_id)
        assert settled.value.receipt.name == key(ROUNDS)
        return
    for index, slot in m.slots.items():
        if slot.signal_id == signal_id:
            assert a.signal(m.run_id, "go", payload, signal_id=signal_id).name == key(index)
            return
    index = m.earliest_open()
    if m.registered_expired(index):
        m.slots[index] = Slot("timed_out")
        m.state = "queued"  # the timeout wakes the run
        with pytest.raises(perdure.WaitExpired) as expired:
            a.signal(m.run_id, "go", payload, signal_id=signal_id)
        assert expired.value.receipt.name == key(index)
        return
    m.slots[index] = Slot("signaled", signal_id, payload)
    if m.state == "waiting" and index == m.reached:
        m.state = "queued"
    got = a.signal(m.run_id, "go", payload, signal_id=signal_id)
    assert (got.name, got.outcome, got.signal_id) == (key(index), "signaled", signal_id)


def model_drive(a: perdure.App, m: Model) -> None:
    expected = [m.run_id] if m.claimable else []
    assert drive(a) == expected
    if expected:
        m.execute()


def check_store(a: perdure.App, m: Model) -> None:
    assert a.get(m.run_id).state == m.state
    if m.state == "succeeded":
        assert a.store.outcomes(m.run_id) == []
        return
    stored = {o.name: o for o in a.store.outcomes(m.run_id)}
    assert sorted(stored) == sorted(key(i) for i in m.slots)
    for index, slot in m.slots.items():
        found = stored[key(index)]
        assert (found.outcome, found.signal_id) == (slot.kind, slot.signal_id)
        if slot.kind == "signaled":
            assert found.payload == codec.encode(slot.payload)
    journal = [(e.name, e.status) for e in a.store.journal(m.run_id)]
    assert [name for name, _ in journal] == [key(i) for i in range(1, m.reached + 1)]


steps = st.lists(
    st.one_of(
        st.tuples(st.just("signal"), st.sampled_from(["a", "b", "c", "d"]), st.integers(0, 9)),
        st.tuples(st.just("drive")),
        st.tuples(st.just("later")),
    ),
    min_size=1,
    max_size=12,
)


def play(url: str, script: list[tuple[Any, ...]]) -> None:
    clock = FakeClock()
    a = make_app(url, clock)
    try:
        m = Model(a.start("rounds").run_id)
        for event in script:
            if event[0] == "signal":
                model_signal(a, m, event[1], event[2])
            elif event[0] == "drive":
                model_drive(a, m)
            else:
                m.now = clock.advance(PAST_DEADLINE.total_seconds())
            check_store(a, m)
        for _ in range(ROUNDS + 1):
            if m.state == "succeeded":
                break
            if not m.claimable:
                m.now = clock.advance(PAST_DEADLINE.total_seconds())
            model_drive(a, m)
            check_store(a, m)
        assert m.state == "succeeded"
        assert a.get(m.run_id).result == m.result()
    finally:
        a.close()


@contextlib.contextmanager
def fresh_sqlite() -> Iterator[str]:
    where = tempfile.mkdtemp(prefix="perdure-rw-")
    try:
        yield f"sqlite:///{where}/store.db"
    finally:
        shutil.rmtree(where, ignore_errors=True)


def test_every_order_of_signals_and_deadlines_matches_the_model_on_sqlite(
    request: pytest.FixtureRequest,
) -> None:
    if request.config.getoption("--store") not in ("all", "sqlite"):
        pytest.skip("--store excludes sqlite")

    @settings(
        max_examples=40, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
    )
    @given(script=steps)
    def check(script: list[tuple[Any, ...]]) -> None:
        with fresh_sqlite() as url:
            play(url, script)

    check()


@pytest.mark.postgres
def test_every_order_of_signals_and_deadlines_matches_the_model_on_postgres(
    request: pytest.FixtureRequest,
) -> None:
    if request.config.getoption("--store") not in ("all", "postgres"):
        pytest.skip("--store excludes postgres")
    request.getfixturevalue("postgres_server")
    import pg  # tests/pg.py

    @settings(
        max_examples=10, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
    )
    @given(script=steps)
    def check(script: list[tuple[Any, ...]]) -> None:
        url = pg.create_database()
        try:
            play(url, script)
        finally:
            pg.drop_database(url)

    check()


CHOSEN = [
    [("signal", "a", 1), ("signal", "b", 2), ("signal", "a", 3), ("drive",)],
    [("drive",), ("later",), ("signal", "a", 1), ("signal", "a", 1), ("drive",)],
    [("drive",), ("signal", "a", 1), ("later",), ("drive",), ("signal", "b", 2)],
    [("later",), ("drive",), ("later",), ("signal", "c", 3), ("drive",)],
]


@pytest.mark.parametrize("script", CHOSEN, ids=[str(i) for i in range(len(CHOSEN))])
def test_chosen_orders_match_the_model(store_url: str, script: list[tuple[Any, ...]]) -> None:
    play(store_url, script)


# -- a worker killed between two waits ----------------------------------------------------

CRASH_APP = """
import os, sys
import perdure

app = perdure.App(os.environ["STORE"], name="rwcrash")

@app.step()
def note(value):
    marker = os.environ["MARKER"]
    if not os.path.exists(marker):
        open(marker, "w").close()
        os._exit(17)  # the worker dies after the first wait was applied
    return value

@app.workflow()
def two(ctx):
    first = ctx.wait("submit")
    note(first)
    return [first, ctx.wait("submit")]
"""


def test_a_worker_killed_between_two_waits_resumes_with_the_second_signal(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "rwcrash_app.py").write_text(textwrap.dedent(CRASH_APP))
    env = {
        **os.environ,
        "STORE": store_url,
        "MARKER": str(tmp_path / "died"),
        "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
    }
    monkeypatch.setenv("STORE", store_url)
    monkeypatch.setenv("MARKER", env["MARKER"])
    sys.path.insert(0, str(tmp_path))
    try:
        import rwcrash_app  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(tmp_path))
    app: perdure.App = rwcrash_app.app
    try:
        rid = app.start("two").run_id
        first = app.signal(rid, "submit", "u1", signal_id="one")
        second = app.signal(rid, "submit", "u2", signal_id="two")
        assert [first.name, second.name] == ["submit", "submit#2"]
        command = [
            sys.executable, "-m", "perdure", "worker", "rwcrash_app:app",
            "--lease-ttl", "2", "--heartbeat", "0.5",
        ]  # fmt: skip
        died = subprocess.run(command, env=env, timeout=LIMIT, capture_output=True)
        assert died.returncode == 17, died.stderr.decode()
        assert app.get(rid).state == "running"
        assert sorted(o.name for o in app.store.outcomes(rid)) == ["submit", "submit#2"]
        worker = subprocess.Popen(
            command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        try:
            assert app.handle(rid).result(timeout=LIMIT) == ["u1", "u2"]
        finally:
            worker.terminate()
            worker.wait(LIMIT)
        assert [(e.kind, e.name, e.status) for e in app.store.journal(rid)] == [
            ("wait", "submit", "ok"),
            ("step", "note", "ok"),
            ("wait", "submit#2", "ok"),
        ]
        applied = [h.step for h in app.history(rid) if h.kind == "outcome_applied"]
        assert applied == ["submit", "submit#2"]
    finally:
        app.close()
        sys.modules.pop("rwcrash_app", None)
