"""The SQLite adapter's own tests: its URLs, WAL, the wake-up channel, rows of SQLite's types.

The contract both adapters share is tested once, by the conformance suite
(``perdure.testing.conformance``, run in tests/conformance); these tests pin
only what is specific to this adapter. Time moves only through FakeClock.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
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


# -- group commit ------------------------------------------------------------------


def _scratch(store: sqlite.SqliteStore) -> list[str]:
    conn = sqlite3.connect(store.path)
    try:
        return [row[0] for row in conn.execute("SELECT x FROM scratch ORDER BY x")]
    finally:
        conn.close()


def _insert(value: str, *, fail: bool = False) -> Any:
    def work(tx: Any) -> str:
        tx.conn.execute("INSERT INTO scratch (x) VALUES (?)", (value,))
        if fail:
            raise RuntimeError(f"{value} failed")
        return value

    return work


def test_a_failed_write_alone_in_its_commit_leaves_nothing(store: sqlite.SqliteStore) -> None:
    raw(store, "CREATE TABLE scratch (x TEXT)")
    with pytest.raises(RuntimeError, match="a failed"):
        store._write(_insert("a", fail=True))
    assert store._group is None  # the transaction was rolled back and ended
    assert store._write(_insert("b"))[0] == "b"
    assert _scratch(store) == ["b"]


@pytest.mark.parametrize("second_fails", [False, True])
def test_writes_queued_behind_each_other_share_one_commit(
    store: sqlite.SqliteStore, second_fails: bool
) -> None:
    """The first write holds its commit for the one queued behind it; a failure of
    that second write takes back only its own rows."""
    raw(store, "CREATE TABLE scratch (x TEXT)")
    commits: list[str] = []
    original = store._commit

    def commit(group: Any, **options: Any) -> None:
        commits.append(f"members={group.members}")
        original(group, **options)

    store._commit = commit  # type: ignore[method-assign]
    second_queued = threading.Event()
    results: dict[str, Any] = {}

    def first(tx: Any) -> str:
        tx.conn.execute("INSERT INTO scratch (x) VALUES ('a')")
        thread.start()
        # The second writer is queued once it counts itself and waits on the mutex.
        assert second_queued.wait(10)
        deadline = time.monotonic() + 10
        while store._queued == 0:
            assert time.monotonic() < deadline, "the second write never queued"
            time.sleep(0.001)
        return "a"

    def second() -> None:
        second_queued.set()
        try:
            results["b"] = store._write(_insert("b", fail=second_fails))[0]
        except RuntimeError as exc:
            results["b"] = exc

    thread = threading.Thread(target=second)
    assert store._write(first)[0] == "a"
    thread.join(10)
    assert commits == ["members=2"] if not second_fails else commits == ["members=1"]
    if second_fails:
        assert isinstance(results["b"], RuntimeError)
        assert _scratch(store) == ["a"]
    else:
        assert results["b"] == "b"
        assert _scratch(store) == ["a", "b"]


# -- waking waiters -------------------------------------------------------------


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
