"""The SQLite adapter's own tests: fencing, races, waits, end-of-run rules, corrupt rows.

The cross-adapter contract is tested by the conformance suite; these tests pin
what is specific to this adapter and the guarantees it must keep on its own.
Concurrency is ordered with barriers and time moves only through FakeClock.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from perdure import errors
from perdure.store import port
from perdure.store.sqlite import store as sqlite
from perdure.testing.clock import FakeClock

APP = "shop"
WF = ("checkout", "1")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(sqlite_url: str, clock: FakeClock) -> Iterator[sqlite.SqliteStore]:
    opened = sqlite.SqliteStore(sqlite_url, clock=clock, ledger_limit=8)
    opened.migrate()
    yield opened
    opened.close()


def new(run_id: str, *, key: str | None = None, parent: str | None = None) -> port.NewRun:
    return port.NewRun(run_id, APP, *WF, input="{}", key=key, parent_id=parent)


def claim_one(store: sqlite.SqliteStore, worker: str = "w1", ttl: float = 30) -> port.Claimed:
    (claimed,) = store.claim(APP, worker, [WF], lease_ttl=ttl)
    return claimed


def started(store: sqlite.SqliteStore, run_id: str, **kw: Any) -> port.Claim:
    store.create_run(new(run_id, **kw))
    claimed = claim_one(store)
    assert claimed.run.run_id == run_id
    return claimed.claim


def entry(position: int, status: port.EntryStatus = "ok", name: str = "a") -> port.JournalEntry:
    return port.JournalEntry(position, "step", name, status, output="1" if status == "ok" else None)


def signal(payload: str = '{"ok": true}') -> port.Outcome:
    return port.Outcome("", "", "signaled", "sig-1", payload, "digest", FakeClock().now())


def kinds(store: sqlite.SqliteStore, run_id: str) -> list[str]:
    return [receipt.kind for receipt in store.history(run_id)]


def raw(store: sqlite.SqliteStore, sql: str, *args: Any) -> None:
    conn = sqlite3.connect(store.path)
    with conn:
        conn.execute(sql, args)
    conn.close()


# -- opening -------------------------------------------------------------------


@pytest.mark.parametrize(
    "url", ["sqlite://:memory:", "sqlite:///:memory:", "sqlite:///", "sqlite://", "sqlite:relative"]
)
def test_urls_naming_no_file_are_refused(url: str) -> None:
    with pytest.raises(errors.InvalidStoreURL):
        sqlite.SqliteStore(url)


def test_relative_url_is_resolved_against_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    opened = sqlite.SqliteStore("sqlite:///sub.db")
    opened.close()
    assert opened.path == str(tmp_path / "sub.db")
    assert (tmp_path / "sub.db").exists()


def test_missing_directory_is_unavailable(tmp_path: Path) -> None:
    with pytest.raises(errors.StoreUnavailable, match="does not exist"):
        sqlite.SqliteStore(f"sqlite:///{tmp_path}/nowhere/s.db")


def test_unmigrated_store_is_unavailable(sqlite_url: str) -> None:
    opened = sqlite.SqliteStore(sqlite_url)
    with pytest.raises(errors.StoreUnavailable, match="no such table"):
        opened.create_run(new("r"))
    with pytest.raises(errors.StoreUnavailable, match="no such table"):
        opened.get_run("r")
    opened.close()


def test_closed_store_refuses_and_close_is_idempotent(store: sqlite.SqliteStore) -> None:
    store.close()
    store.close()
    with pytest.raises(errors.StoreUnavailable, match="closed"):
        store.get_run("r")


def test_connection_runs_in_wal_with_full_sync(store: sqlite.SqliteStore) -> None:
    conn = store._acquire()
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    finally:
        store._release(conn)


# -- creation ------------------------------------------------------------------


def test_create_run_is_idempotent_by_key(store: sqlite.SqliteStore, clock: FakeClock) -> None:
    first, created = store.create_run(new("r1", key="k"))
    again, created_again = store.create_run(new("r2", key="k"))
    assert (created, created_again) == (True, False)
    assert again == first
    assert store.get_run("r2") is None
    assert first.state == "queued" and first.generation == 0 and first.ledger_sequence == 1
    (receipt,) = store.history("r1")
    assert (receipt.kind, receipt.generation, receipt.worker) == ("initialized", 0, None)
    assert receipt.at == clock.now()


def test_reused_run_id_without_key_is_refused(store: sqlite.SqliteStore) -> None:
    store.create_run(new("r1"))
    with pytest.raises(errors.InvalidInput, match="already taken"):
        store.create_run(new("r1"))


def _create_in_process(path: str, run_id: str, barrier: Any, results: Any) -> None:
    opened = sqlite.SqliteStore(f"sqlite:///{path}")
    barrier.wait()
    run, created = opened.create_run(new(run_id, key="same"))
    results.put((run.run_id, created))
    opened.close()


def test_create_run_from_two_processes_creates_one(store: sqlite.SqliteStore) -> None:
    ctx = multiprocessing.get_context("fork")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    procs = [
        ctx.Process(target=_create_in_process, args=(store.path, rid, barrier, results))
        for rid in ("p1", "p2")
    ]
    for proc in procs:
        proc.start()
    got = [results.get(timeout=60) for _ in procs]
    for proc in procs:
        proc.join(timeout=60)
    assert sorted(created for _, created in got) == [False, True]
    winner = next(run_id for run_id, created in got if created)
    assert {run_id for run_id, _ in got} == {winner}
    assert [r.run_id for r in store.list_runs(APP)] == [winner]


def test_create_children_is_fenced_and_replay_safe(store: sqlite.SqliteStore) -> None:
    claim = started(store, "parent")
    kids = [new("c1", key="parent/1"), new("c2", key="parent/2")]
    made = store.create_children(claim, kids)
    assert [(c.run_id, c.parent_id) for c in made] == [("c1", "parent"), ("c2", "parent")]
    again = store.create_children(claim, [new("x1", key="parent/1")])
    assert [c.run_id for c in again] == ["c1"]
    assert store.child_counts("parent") == {"queued": 2}
    with pytest.raises(errors.InvalidInput, match="needs a key"):
        store.create_children(claim, [new("c3")])


# -- claims --------------------------------------------------------------------


def test_claim_takes_only_listed_workflow_versions_of_the_app(store: sqlite.SqliteStore) -> None:
    store.create_run(port.NewRun("other-app", "elsewhere", *WF, "{}"))
    store.create_run(port.NewRun("old", APP, "checkout", "0", "{}"))
    store.create_run(new("mine"))
    assert [c.run.run_id for c in store.claim(APP, "w", [WF], lease_ttl=5, limit=10)] == ["mine"]
    assert store.claim(APP, "w", [], lease_ttl=5) == []


def test_claim_orders_by_readiness_and_respects_backoff(
    store: sqlite.SqliteStore, clock: FakeClock
) -> None:
    store.create_run(new("a"))
    clock.advance(1)
    store.create_run(new("b"))
    claim = claim_one(store).claim
    store.release(claim, delay=10, failed=True)
    assert [c.run.run_id for c in store.claim(APP, "w", [WF], lease_ttl=60, limit=5)] == ["b"]
    assert store.claim(APP, "w", [WF], lease_ttl=60) == []
    clock.advance(10)
    again = claim_one(store)
    assert (again.run.run_id, again.run.failures, again.run.generation) == ("a", 1, 2)


def test_claim_is_exclusive_across_threads(sqlite_url: str, clock: FakeClock) -> None:
    stores = [sqlite.SqliteStore(sqlite_url, clock=clock) for _ in range(4)]
    stores[0].migrate()
    for i in range(40):
        stores[0].create_run(new(f"r{i:02d}"))
    barrier = threading.Barrier(8)
    got: list[list[str]] = [[] for _ in range(8)]

    def work(slot: int) -> None:
        mine = stores[slot % 4]
        barrier.wait()
        while claimed := mine.claim(APP, f"w{slot}", [WF], lease_ttl=30, limit=3):
            got[slot].extend(c.run.run_id for c in claimed)

    threads = [threading.Thread(target=work, args=(slot,)) for slot in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    everything = [run_id for slot in got for run_id in slot]
    assert sorted(everything) == [f"r{i:02d}" for i in range(40)]
    for run in stores[0].list_runs(APP, limit=100):
        assert (run.state, run.generation) == ("running", 1)
    for opened in stores:
        opened.close()


def test_lapsed_lease_is_recovered_with_a_failure(
    store: sqlite.SqliteStore, clock: FakeClock
) -> None:
    first = started(store, "r")
    assert store.claim(APP, "w2", [WF], lease_ttl=30) == []
    clock.advance(31)
    taken = claim_one(store, "w2")
    assert taken.recovered
    assert (taken.run.generation, taken.run.failures, taken.run.worker) == (2, 1, "w2")
    assert taken.claim.generation == first.generation + 1
    assert kinds(store, "r") == ["initialized", "claimed", "recovered"]


# -- fencing -------------------------------------------------------------------

FencedWrite = Callable[[sqlite.SqliteStore, port.Claim], object]

FENCED: dict[str, FencedWrite] = {
    "renew": lambda s, c: s.renew(c, lease_ttl=30),
    "release": lambda s, c: s.release(c, delay=0, failed=False),
    "begin_effect": lambda s, c: s.begin_effect(c, [entry(1, "started")]),
    "finish_step": lambda s, c: s.finish_step(c, [entry(1)], [port.Mark("step_completed")]),
    "transaction_step": lambda s, c: s.transaction_step(c, [], lambda conn: entry(1)),
    "park": lambda s, c: s.park(c, [entry(1)], [port.WaitSpec("w", "signal")], wake_at=None),
    "finish": lambda s, c: s.finish(c, [], state="succeeded", result="1"),
    "create_children": lambda s, c: s.create_children(c, [new("kid", key="k")]),
}


def _snapshot(store: sqlite.SqliteStore, run_id: str) -> tuple[object, ...]:
    return (
        store.get_run(run_id),
        store.journal(run_id),
        store.history(run_id),
        store.waits(APP),
        store.list_runs(APP),
    )


@pytest.mark.parametrize("op", sorted(FENCED))
def test_stale_claim_writes_nothing(store: sqlite.SqliteStore, clock: FakeClock, op: str) -> None:
    stale = started(store, "r")
    clock.advance(31)
    claim_one(store, "w2")
    before = _snapshot(store, "r")
    with pytest.raises(errors.StaleClaim) as caught:
        FENCED[op](store, stale)
    assert caught.value.run_id == "r"
    assert _snapshot(store, "r") == before


@pytest.mark.parametrize("op", sorted(FENCED))
def test_canceled_claim_writes_nothing_until_it_acknowledges(
    store: sqlite.SqliteStore, op: str
) -> None:
    claim = started(store, "r")
    assert store.request_cancel("r")
    before = _snapshot(store, "r")
    with pytest.raises(errors.Canceled):
        FENCED[op](store, claim)
    assert _snapshot(store, "r") == before
    FENCED[op](store, port.Claim("r", claim.worker, claim.generation, claim.lease_expires_at, True))


@pytest.mark.parametrize("state", ["canceled", "needs_attention"])
def test_finish_settling_a_cancel_ignores_the_flag(
    store: sqlite.SqliteStore, state: port.RunState
) -> None:
    claim = started(store, "r")
    store.request_cancel("r")
    with pytest.raises(errors.Canceled):
        store.finish(claim, [], state="succeeded", result="1")
    store.finish(claim, [], state=state, error='{"code": "canceled"}')
    assert store.get_run("r").state == state  # type: ignore[union-attr]
    assert kinds(store, "r")[-1] == ("canceled" if state == "canceled" else "finished")


def test_missing_run_is_a_stale_claim(store: sqlite.SqliteStore, clock: FakeClock) -> None:
    ghost = port.Claim("ghost", "w", 1, clock.now())
    with pytest.raises(errors.StaleClaim):
        store.renew(ghost, lease_ttl=5)


# -- journal -------------------------------------------------------------------


def test_journal_replaces_only_started_entries(store: sqlite.SqliteStore) -> None:
    claim = started(store, "r")
    store.begin_effect(
        claim, [entry(1), entry(2, "started", "charge")], [port.Mark("effect_started")]
    )
    store.finish_step(claim, [entry(2, "ok", "charge")])
    assert [(e.position, e.status) for e in store.journal("r")] == [(1, "ok"), (2, "ok")]
    before = _snapshot(store, "r")
    with pytest.raises(errors.CorruptState) as caught:
        store.finish_step(claim, [entry(3), entry(1, "error")])
    assert caught.value.invariant == "journal_position_taken"
    assert _snapshot(store, "r") == before


def test_finish_step_resets_failures(store: sqlite.SqliteStore, clock: FakeClock) -> None:
    claim = started(store, "r")
    store.release(claim, delay=0, failed=True)
    claim = claim_one(store).claim
    assert store.get_run("r").failures == 1  # type: ignore[union-attr]
    store.finish_step(claim, [entry(1)])
    assert store.get_run("r").failures == 0  # type: ignore[union-attr]


def test_transaction_step_body_shares_the_transaction(store: sqlite.SqliteStore) -> None:
    claim = started(store, "r")
    raw(store, "CREATE TABLE side (k TEXT)")

    def body(conn: sqlite3.Connection) -> port.JournalEntry:
        conn.execute("INSERT INTO side VALUES ('x')")
        return entry(1)

    def failing(conn: sqlite3.Connection) -> port.JournalEntry:
        conn.execute("INSERT INTO side VALUES ('y')")
        raise RuntimeError("boom")

    assert store.transaction_step(claim, [], body) == entry(1)
    with pytest.raises(RuntimeError, match="boom"):
        store.transaction_step(claim, [entry(2)], failing)
    conn = sqlite3.connect(store.path)
    assert conn.execute("SELECT k FROM side").fetchall() == [("x",)]
    conn.close()
    assert [e.position for e in store.journal("r")] == [1]


# -- ledger --------------------------------------------------------------------


@pytest.mark.parametrize("steps", [0, 3, 6, 7, 20, 29, 30, 31, 75])
def test_ledger_keeps_min_of_sequence_and_limit(store: sqlite.SqliteStore, steps: int) -> None:
    claim = started(store, "r")  # initialized, claimed
    for i in range(steps):
        store.finish_step(claim, [entry(i + 1)], [port.Mark("step_completed", step=f"s{i}")])
    total = 2 + steps
    kept = store.history("r")
    assert [r.sequence for r in kept] == list(range(max(1, total - 8 + 1), total + 1))
    assert store.get_run("r").ledger_sequence == total  # type: ignore[union-attr]
    assert all((r.generation, r.worker) == (1, "w1") for r in kept if r.kind != "initialized")
    # Exactly min(S, N) receipts are stored, not merely shown.
    conn = sqlite3.connect(store.path)
    stored = conn.execute("SELECT min(sequence), count(*) FROM ledger").fetchone()
    conn.close()
    assert stored == (max(1, total - 8 + 1), min(total, 8))


def test_unknown_mark_kind_is_refused_before_anything(store: sqlite.SqliteStore) -> None:
    claim = started(store, "r")
    before = _snapshot(store, "r")
    with pytest.raises(errors.InvalidInput):
        store.finish_step(claim, [entry(1)], [port.Mark("made_up")])
    assert _snapshot(store, "r") == before


# -- parking and waking --------------------------------------------------------


def test_park_registers_waits_and_drops_the_lease(
    store: sqlite.SqliteStore, clock: FakeClock
) -> None:
    claim = started(store, "r")
    deadline = clock.now() + timedelta(hours=1)
    waits = [port.WaitSpec("approval", "signal", deadline), port.WaitSpec("events", "channel")]
    assert store.park(claim, [entry(1)], waits, wake_at=clock.now() + timedelta(hours=2))
    run = store.get_run("r")
    assert run is not None
    assert (run.state, run.worker, run.lease_expires_at, run.ready_at) == (
        "waiting",
        None,
        None,
        deadline,
    )
    assert [(w.name, w.kind, w.deadline) for w in store.waits(APP, "r")] == [
        ("approval", "signal", deadline),
        ("events", "channel", None),
    ]
    assert kinds(store, "r")[-1] == "parked"


def test_park_replaces_earlier_registrations(store: sqlite.SqliteStore, clock: FakeClock) -> None:
    claim = started(store, "r")
    store.park(
        claim, [], [port.WaitSpec("a", "signal"), port.WaitSpec("b", "signal")], wake_at=None
    )
    clock.advance(5)
    store.wake("r")
    claim = claim_one(store).claim
    store.park(
        claim, [], [port.WaitSpec("b", "signal"), port.WaitSpec("c", "signal")], wake_at=None
    )
    found = store.waits(APP, "r")
    assert [w.name for w in found] == ["b", "c"]
    assert found[0].created_at < found[1].created_at  # b kept its first registration


@pytest.mark.parametrize("present", ["outcome", "message", "due"])
def test_park_with_something_already_there_does_not_park(
    store: sqlite.SqliteStore, clock: FakeClock, present: str
) -> None:
    claim = started(store, "r")
    waits = [port.WaitSpec("approval", "signal"), port.WaitSpec("events", "channel", None, 0)]
    wake_at = None
    if present == "outcome":
        store.settle_wait("r", "approval", signal())
    elif present == "message":
        store.send(port.NewMessage("r", "events", "m1", '"hi"'))
    else:
        wake_at = clock.now()
    assert store.park(claim, [entry(1)], waits, wake_at=wake_at) is False
    run = store.get_run("r")
    assert run is not None
    assert (run.state, run.generation, run.worker) == ("running", claim.generation, "w1")
    assert [e.position for e in store.journal("r")] == [1]
    assert "parked" not in kinds(store, "r")
    store.finish_step(claim, [entry(2)])  # the claim is still good


def test_channel_wait_is_met_only_by_a_newer_message(store: sqlite.SqliteStore) -> None:
    claim = started(store, "r")
    store.send(port.NewMessage("r", "events", "m1", '"one"'))
    consumed = store.next_message("r", "events", 0)
    assert consumed is not None and consumed.sequence == 1
    spec = port.WaitSpec("events", "channel", None, consumed.sequence)
    assert store.park(claim, [], [spec], wake_at=None)
    assert store.send(port.NewMessage("r", "other", "m1", '"x"'))
    assert store.get_run("r").state == "waiting"  # type: ignore[union-attr]
    assert store.send(port.NewMessage("r", "events", "m2", '"two"'))
    assert store.get_run("r").state == "queued"  # type: ignore[union-attr]
    assert not store.send(port.NewMessage("r", "events", "m2", '"dup"'))
    second = store.next_message("r", "events", 1)
    assert second is not None and (second.key, second.payload, second.sequence) == (
        "m2",
        '"two"',
        3,
    )
    assert store.next_message("r", "events", 3) is None


def test_settle_wait_is_put_if_absent_and_wakes(store: sqlite.SqliteStore) -> None:
    claim = started(store, "r")
    store.park(claim, [], [port.WaitSpec("approval", "signal")], wake_at=None)
    stored, created = store.settle_wait("r", "approval", signal('"first"'))
    again, created_again = store.settle_wait("r", "approval", signal('"second"'))
    assert (created, created_again) == (True, False)
    assert again == stored and stored.payload == '"first"' and stored.outcome == "signaled"
    assert store.get_run("r").state == "queued"  # type: ignore[union-attr]
    assert store.waits(APP) == []
    assert kinds(store, "r")[-2:] == ["parked", "woken"]


def test_settle_wait_refuses_unknown_and_ended_runs(store: sqlite.SqliteStore) -> None:
    with pytest.raises(errors.RunNotFound):
        store.settle_wait("nope", "approval", signal())
    claim = started(store, "r")
    store.finish(claim, [], state="succeeded", result="1")
    with pytest.raises(errors.RunFinished):
        store.settle_wait("r", "approval", signal())
    with pytest.raises(errors.RunFinished):
        store.send(port.NewMessage("r", "c", "k", "1"))


def test_signal_after_the_deadline_is_stored_as_timed_out(
    store: sqlite.SqliteStore, clock: FakeClock
) -> None:
    claim = started(store, "r")
    deadline = clock.now() + timedelta(minutes=5)
    store.park(claim, [], [port.WaitSpec("approval", "signal", deadline)], wake_at=None)
    clock.set(deadline)
    stored, created = store.settle_wait("r", "approval", signal())
    assert created
    assert (stored.outcome, stored.payload, stored.signal_id, stored.payload_digest) == (
        "timed_out",
        None,
        None,
        None,
    )
    assert stored.at == deadline
    assert store.get_run("r").state == "queued"  # type: ignore[union-attr]


def test_notify_reaches_every_store_on_the_file(store: sqlite.SqliteStore, sqlite_url: str) -> None:
    other = sqlite.SqliteStore(sqlite_url)
    assert other.wait_ready(0) is False  # starts listening; nothing pending yet
    store.create_run(new("r"))
    # The notification was sent before this wait: it is kept, not lost.
    assert other.wait_ready(5) is True
    assert other.wait_ready(0.01) is False
    other.close()


def _notify_from_another_process(url: str) -> None:
    child = sqlite.SqliteStore(url)
    child.create_run(new("from-child"))
    child.close()


def test_notify_reaches_another_process(store: sqlite.SqliteStore, sqlite_url: str) -> None:
    assert store.wait_ready(0) is False
    proc = multiprocessing.get_context("spawn").Process(
        target=_notify_from_another_process, args=(sqlite_url,)
    )
    proc.start()
    proc.join(30)
    assert proc.exitcode == 0
    assert store.wait_ready(5) is True


def test_a_dead_listener_is_skipped_and_removed(sqlite_url: str) -> None:
    waiter = sqlite.SqliteStore(sqlite_url)
    waiter.wait_ready(0)
    (path,) = [os.path.join(waiter._wakeup.folder, n) for n in os.listdir(waiter._wakeup.folder)]
    # A process killed without closing leaves its socket file behind.
    waiter._wakeup._sock.close()  # type: ignore[union-attr]
    sender = sqlite.SqliteStore(sqlite_url)
    sender.notify_ready()
    assert not os.path.exists(path)
    sender.close()


# -- end of run ----------------------------------------------------------------


def test_finish_cleans_up_and_settles_the_parent(store: sqlite.SqliteStore) -> None:
    parent = started(store, "p")
    store.create_children(parent, [new("c", key="p/c")])
    store.park(parent, [], [port.WaitSpec("child:c", "child")], wake_at=None)
    kid = claim_one(store).claim
    store.park(kid, [], [port.WaitSpec("x", "signal")], wake_at=None)
    store.settle_wait("c", "x", signal())
    kid = claim_one(store).claim
    store.send(port.NewMessage("c", "events", "k", "1"))
    store.finish(kid, [entry(1)], state="succeeded", result='{"n": 2}')

    assert store.outcomes("c") == [] and store.waits(APP, "c") == []
    assert store.next_message("c", "events", 0) is None
    (outcome,) = store.outcomes("p")
    assert (outcome.name, outcome.outcome) == ("child:c", "signaled")
    assert json.loads(outcome.payload or "") == {
        "run_id": "c",
        "state": "succeeded",
        "result": {"n": 2},
        "error": None,
    }
    assert store.get_run("p").state == "queued"  # type: ignore[union-attr]
    assert kinds(store, "p")[-1] == "woken"
    assert store.child_counts("p") == {"succeeded": 1}


def test_child_of_a_running_parent_leaves_an_outcome_without_waking(
    store: sqlite.SqliteStore,
) -> None:
    parent = started(store, "p")
    store.create_children(parent, [new("c", key="p/c")])
    kid = claim_one(store).claim
    store.finish(kid, [], state="failed", error='{"code": "boom"}')
    assert store.get_run("p").state == "running"  # type: ignore[union-attr]
    assert store.park(parent, [], [port.WaitSpec("child:c", "child")], wake_at=None) is False


# -- operators -----------------------------------------------------------------


def test_request_cancel_walks_the_tree(store: sqlite.SqliteStore, clock: FakeClock) -> None:
    root = started(store, "root")
    store.create_children(root, [new("a", key="a"), new("b", key="b")])
    a = claim_one(store).claim
    store.create_children(a, [new("a1", key="a1")])
    store.park(a, [], [port.WaitSpec("sig", "signal")], wake_at=None)
    b = claim_one(store).claim
    store.finish(b, [], state="succeeded", result="1")
    # root running, a waiting, a1 queued, b succeeded

    assert store.request_cancel("root") is True
    states = {r.run_id: (r.state, r.cancel_requested) for r in store.list_runs(APP)}
    assert states == {
        "root": ("running", True),
        "a": ("canceled", False),
        "a1": ("canceled", False),
        "b": ("succeeded", False),
    }
    assert kinds(store, "a")[-1] == "canceled" and kinds(store, "root")[-1] == "cancel_requested"
    assert store.waits(APP) == []
    # root is running: it hears of a's end; a (canceled) hears nothing of a1.
    assert sorted(o.name for o in store.outcomes("root")) == ["child:a", "child:b"]
    assert store.outcomes("a") == []
    assert store.request_cancel("root") is False
    with pytest.raises(errors.RunNotFound):
        store.request_cancel("nope")


def test_cancel_of_a_child_wakes_its_waiting_parent(store: sqlite.SqliteStore) -> None:
    parent = started(store, "p")
    store.create_children(parent, [new("c", key="c")])
    store.park(parent, [], [port.WaitSpec("child:c", "child")], wake_at=None)
    assert store.request_cancel("c")
    (outcome,) = store.outcomes("p")
    assert json.loads(outcome.payload or "")["state"] == "canceled"
    assert store.get_run("p").state == "queued"  # type: ignore[union-attr]


def _needs_attention(store: sqlite.SqliteStore, run_id: str, parent: str | None = None) -> int:
    store.create_run(new(run_id, parent=parent, key=run_id))
    claim = next(
        c.claim for c in store.claim(APP, "w", [WF], lease_ttl=5, limit=5) if c.run.run_id == run_id
    )
    store.begin_effect(claim, [entry(1, "started", "charge")], [port.Mark("effect_started")])
    store.finish(claim, [], state="needs_attention", error='{"code": "effect_outcome_unknown"}')
    return claim.generation


def test_resolve_requeues_with_the_given_entry(store: sqlite.SqliteStore) -> None:
    generation = _needs_attention(store, "r")
    fixed = port.JournalEntry(1, "step", "charge", "ok", output='"ch_1"')
    with pytest.raises(errors.NotResolvable):
        store.resolve("r", generation + 1, fixed, state="queued", error=None, note="op")
    with pytest.raises(errors.NotResolvable):
        wrong = port.JournalEntry(1, "step", "refund", "ok", output='"x"')
        store.resolve("r", generation, wrong, state="queued", error=None, note="op")
    store.resolve("r", generation, fixed, state="queued", error=None, note="checked by ops")
    run = store.get_run("r")
    assert run is not None and (run.state, run.failures, run.error) == ("queued", 0, None)
    assert store.journal("r") == [fixed]
    last = store.history("r")[-1]
    assert (last.kind, last.step, last.note, last.worker) == (
        "resolved",
        "charge",
        "checked by ops",
        None,
    )
    with pytest.raises(errors.NotResolvable):
        store.resolve("r", generation, fixed, state="queued", error=None, note="again")


def test_resolve_to_failed_ends_the_run(store: sqlite.SqliteStore) -> None:
    generation = _needs_attention(store, "r")
    failed = port.JournalEntry(1, "step", "charge", "error", error='{"message": "declined"}')
    store.resolve(
        "r",
        generation,
        failed,
        state="failed",
        error='{"code": "resolved_failed"}',
        note="declined",
    )
    run = store.get_run("r")
    assert run is not None and (run.state, run.error) == ("failed", '{"code": "resolved_failed"}')
    with pytest.raises(errors.RunNotFound):
        store.resolve("nope", 1, failed, state="failed", error=None, note="")


def test_sweep_times_out_requeues_and_cleans(store: sqlite.SqliteStore, clock: FakeClock) -> None:
    deadline = clock.now() + timedelta(minutes=1)
    waiting = started(store, "waits")
    store.park(waiting, [], [port.WaitSpec("approval", "signal", deadline)], wake_at=None)
    sleeping = started(store, "sleeps")
    store.park(sleeping, [], [], wake_at=deadline)
    open_ = started(store, "open")
    store.park(open_, [], [port.WaitSpec("forever", "signal")], wake_at=None)
    raw(store, "INSERT INTO outcomes VALUES ('gone', 'x', 'signaled', NULL, NULL, NULL, 0)")
    raw(store, "INSERT INTO messages VALUES ('gone', 'c', 'k', 1, '1', 0)")

    assert store.sweep() == 2  # the orphans
    assert store.sweep() == 0
    clock.set(deadline)
    assert store.sweep() == 3  # one timed out, two woken
    (outcome,) = store.outcomes("waits")
    assert (outcome.name, outcome.outcome) == ("approval", "timed_out")
    states = {r.run_id: r.state for r in store.list_runs(APP)}
    assert states == {"waits": "queued", "sleeps": "queued", "open": "waiting"}
    assert [w.run_id for w in store.waits(APP)] == ["open"]


# -- corrupt rows --------------------------------------------------------------


@pytest.mark.parametrize(
    ("sql", "invariant"),
    [
        ("UPDATE runs SET generation = -1", "run_generation"),
        ("UPDATE runs SET created_at = 'yesterday'", "run_created_at"),
        ("UPDATE runs SET ready_at = 1.5", "run_ready_at"),
        ("UPDATE runs SET cancel_requested = 2", "run_cancel_requested"),
        ("UPDATE runs SET input = x'00'", "run_input"),
        ("UPDATE runs SET worker = x'01'", "run_worker"),
    ],
)
def test_corrupt_run_rows_are_refused(store: sqlite.SqliteStore, sql: str, invariant: str) -> None:
    store.create_run(new("r"))
    raw(store, sql)
    with pytest.raises(errors.CorruptState) as caught:
        store.get_run("r")
    assert (caught.value.run_id, caught.value.invariant) == ("r", invariant)
    store.create_run(new("healthy"))
    # A claim never "repairs" a row: it sets the unreadable run aside and
    # claims the others.
    (claimed,) = store.claim(APP, "w", [WF], lease_ttl=5, limit=2)
    assert claimed.run.run_id == "healthy"
    conn = sqlite3.connect(store.path)
    state, error = conn.execute("SELECT state, error FROM runs WHERE run_id = 'r'").fetchone()
    conn.close()
    assert state == "needs_attention"
    assert json.loads(error)["code"] == "corrupt_state"
    assert json.loads(error)["invariant"] == invariant
    assert store.claim(APP, "w", [WF], lease_ttl=5) == []


def test_unknown_state_is_refused_and_never_claimed(store: sqlite.SqliteStore) -> None:
    store.create_run(new("r"))
    raw(store, "UPDATE runs SET state = 'paused'")
    with pytest.raises(errors.CorruptState) as caught:
        store.get_run("r")
    assert caught.value.invariant == "run_state"
    assert store.claim(APP, "w", [WF], lease_ttl=5) == []
    with pytest.raises(errors.CorruptState):
        store.request_cancel("r")


def test_corrupt_journal_ledger_and_outcome_rows_are_refused(store: sqlite.SqliteStore) -> None:
    claim = started(store, "r")
    store.finish_step(claim, [entry(1)])
    store.settle_wait("r", "x", signal())
    raw(store, "UPDATE journal SET status = 'maybe'")
    raw(store, "UPDATE ledger SET kind = 'forged' WHERE sequence = 1")
    raw(store, "UPDATE outcomes SET at = 'noon'")
    for read, invariant in [
        (store.journal, "journal_status"),
        (store.history, "ledger_kind"),
        (store.outcomes, "outcome_at"),
    ]:
        with pytest.raises(errors.CorruptState) as caught:
            read("r")
        assert caught.value.invariant == invariant
