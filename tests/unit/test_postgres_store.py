"""Focused tests of the PostgreSQL adapter: what only a shared database can get wrong.

The contract both adapters share is tested once, by the conformance suite
(``perdure.testing.conformance``, run in tests/conformance); these tests pin
row locks, SKIP LOCKED, LISTEN/NOTIFY, the server's clock, URLs and lost
connections.

Each test runs on a throwaway database. Races are ordered with barriers and
with row locks held from a second connection, never with sleeps.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

import pg  # tests/pg.py, on the path through tests/conftest.py
from perdure import errors
from perdure.store import liveport, port
from perdure.store.postgres import store as postgres
from perdure.testing.clock import FakeClock
from perdure.testing.conformance import harness

pytestmark = pytest.mark.postgres

WF = [("wf", "1")]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(postgres_url: str, clock: FakeClock) -> Iterator[postgres.PostgresStore]:
    opened = postgres.PostgresStore(postgres_url, clock=clock)
    opened.migrate()
    yield opened
    opened.close()


def new(run_id: str, key: str | None = None, parent_id: str | None = None) -> port.NewRun:
    return port.NewRun(run_id, "app", "wf", "1", '{"args": []}', key=key, parent_id=parent_id)


def claim_one(store: postgres.PostgresStore, worker: str = "w1", ttl: float = 30) -> port.Claimed:
    claimed = store.claim("app", worker, WF, lease_ttl=ttl)
    assert len(claimed) == 1, claimed
    return claimed[0]


def started(run_id: str, store: postgres.PostgresStore) -> port.Claim:
    """Create a run and claim it."""
    store.create_run(new(run_id))
    found = claim_one(store)
    assert found.run.run_id == run_id
    return found.claim


def state(store: postgres.PostgresStore, run_id: str) -> str:
    run = store.get_run(run_id)
    assert run is not None
    return run.state


def kinds(store: postgres.PostgresStore, run_id: str) -> list[str]:
    return [e.kind for e in store.history(run_id)]


def sql(url: str, query: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(query, params or None)
        return cur.fetchall() if cur.description else []


def wait_for_blocked(url: str, count: int) -> None:
    """Return once ``count`` sessions of the database wait on a lock (fail after 10 s)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        query = (
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        if sql(url, query)[0][0] >= count:
            return
        time.sleep(0.01)
    raise AssertionError(f"{count} sessions never blocked on a lock")


def in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    """Start ``fn`` in a thread; the list receives its result or exception."""
    out: list[Any] = []

    def target() -> None:
        try:
            out.append(fn())
        except BaseException as exc:
            out.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, out


# -- claims ---------------------------------------------------------------------


def test_claim_skips_a_candidate_another_transaction_holds(
    postgres_url: str, store: postgres.PostgresStore
) -> None:
    store.create_run(new("r1"))
    store.create_run(new("r2"))
    with psycopg.connect(postgres_url) as holder:
        holder.execute("SELECT 1 FROM perdure.runs WHERE run_id = 'r1' FOR UPDATE")
        thread, out = in_thread(lambda: store.claim("app", "w1", WF, lease_ttl=30, limit=2))
        thread.join(timeout=10)
        assert not thread.is_alive(), "claim waited on the locked row"
        holder.rollback()
    assert [c.run.run_id for c in out[0]] == ["r2"]


# -- parking and delivery ---------------------------------------------------------


def test_a_delivery_blocked_behind_park_wakes_the_parked_run(
    postgres_url: str, store: postgres.PostgresStore, clock: FakeClock
) -> None:
    claim = started("r1", store)
    offered = port.Outcome("r1", "approval", "signaled", "s1", '"yes"', "d", clock.now())
    entry = port.JournalEntry(1, "now", "now", "ok", '"t"')
    with psycopg.connect(postgres_url) as holder:
        # park will stop at its journal write, after taking the run's row lock.
        holder.execute(
            "INSERT INTO perdure.journal (run_id, position, kind, name, status, created_at,"
            " updated_at) VALUES ('r1', 1, 'x', 'x', 'started', now(), now())"
        )
        parking, parked = in_thread(
            lambda: store.park(claim, [entry], [port.WaitSpec("approval", "signal")], wake_at=None)
        )
        wait_for_blocked(postgres_url, 1)
        settling, settled = in_thread(lambda: store.settle_wait("r1", "approval", offered))
        wait_for_blocked(postgres_url, 2)
        holder.rollback()
    parking.join(timeout=10)
    settling.join(timeout=10)

    assert parked == [True]
    assert settled[0][1] is True
    run = store.get_run("r1")
    assert run is not None and run.state == "queued"
    assert kinds(store, "r1")[-2:] == ["parked", "woken"]


def test_an_end_racing_an_update_delivery_abandons_the_update(
    postgres_url: str, store: postgres.PostgresStore
) -> None:
    claim = started("r1", store)
    with psycopg.connect(postgres_url) as holder:
        # The delivery will stop at its insert, holding the run's row lock.
        holder.execute(
            "INSERT INTO perdure.updates (run_id, update_id, name, sequence, payload, state, at)"
            " VALUES ('r1', 'u1', 'ping', 1, '1', 'pending', now())"
        )
        update = liveport.NewUpdate("r1", "u1", "ping", "1")
        delivering, delivered = in_thread(lambda: store.deliver_update(update))
        wait_for_blocked(postgres_url, 1)
        # The end's one statement takes its snapshot now, then waits for that lock.
        ending, ended = in_thread(
            lambda: store.finish(claim, [], state="succeeded", result='"done"')
        )
        wait_for_blocked(postgres_url, 2)
        holder.rollback()
    delivering.join(timeout=10)
    ending.join(timeout=10)
    assert ended == [None]
    [(record, created)] = delivered
    assert created and record.state == "pending"
    assert state(store, "r1") == "succeeded"
    # Stored before the end, so settled by it: its sender is not left waiting.
    found = store.get_update("r1", "u1")
    assert found is not None and found.state == "abandoned"


def woken_by_an_update(store: postgres.PostgresStore) -> port.Claim:
    """A run parked on an update, then woken by its delivery: queued at generation 1."""
    claim = started("r1", store)
    assert store.park(claim, [], [port.WaitSpec("ask", "update")], wake_at=None)
    store.deliver_update(liveport.NewUpdate("r1", "u1", "ask", "1"))
    assert state(store, "r1") == "queued"
    return claim


def answer_ahead(store: postgres.PostgresStore, worker: str) -> bool:
    claim = port.Claim("r1", worker, 2, datetime.now(UTC))
    entry = port.JournalEntry(1, "respond", "ask#1", "ok", "2")
    return store.answer_ahead(claim, [entry], "u1", "2")


@pytest.mark.parametrize("outcome", ["claimed here", "claimed elsewhere", "not claimed"])
def test_an_answer_ahead_waits_for_the_claim_in_progress_and_writes_only_under_it(
    postgres_url: str, store: postgres.PostgresStore, outcome: str
) -> None:
    woken_by_an_update(store)
    before = harness.snapshot(store) if outcome == "not claimed" else None
    with psycopg.connect(postgres_url) as holder:
        # A claim of the run in progress: its row is locked until it commits.
        holder.execute(
            "UPDATE perdure.runs SET generation = 2, state = 'running', worker = %s,"
            " ledger_sequence = ledger_sequence + 1 WHERE run_id = 'r1'",
            ["w1" if outcome == "claimed here" else "w2"],
        )
        holder.execute(
            "INSERT INTO perdure.ledger (run_id, sequence, kind, at, generation, worker)"
            " SELECT run_id, ledger_sequence, 'claimed', now(), 2, worker"
            " FROM perdure.runs WHERE run_id = 'r1'"
        )
        answering, answered = in_thread(lambda: answer_ahead(store, "w1"))
        wait_for_blocked(postgres_url, 1)
        if outcome == "not claimed":
            holder.rollback()
        else:
            holder.commit()
    answering.join(timeout=10)
    found = store.get_update("r1", "u1")
    assert found is not None
    if outcome == "claimed here":
        # Judged on the row as the claim left it: written under that claim.
        assert answered == [True]
        assert (found.state, found.response) == ("answered", "2")
        assert [e.kind for e in store.journal("r1")] == ["respond"]
        assert kinds(store, "r1")[-1] == "claimed"
    else:
        # Another worker's claim, or none: nothing written.
        assert answered == [False]
        assert found.state == "pending"
        assert store.journal("r1") == []
    if before is not None:
        assert harness.snapshot(store) == before


def claim_answering(store: postgres.PostgresStore) -> tuple[port.Claimed | None, bool]:
    """Claim r1 as its worker parked it (on the update "ask", generation 1) and answer u1."""
    known = port.KnownJournal(1, tuple(store.journal("r1")), frozenset(), (("ask", 0),))
    entry = port.JournalEntry(1, "respond", "ask#1", "ok", "2")
    return store.claim_answering(
        "app",
        "w1",
        WF,
        run_id="r1",
        known=known,
        lease_ttl=30,
        dry_run=False,
        entries=[entry],
        update_id="u1",
        response="2",
    )


def test_an_answer_that_carries_its_claim_writes_both_in_one_transaction(
    postgres_url: str, store: postgres.PostgresStore
) -> None:
    woken_by_an_update(store)
    found, answered = claim_answering(store)
    assert found is not None and answered
    assert (found.claim.worker, found.claim.generation) == ("w1", 2)
    assert (found.run.state, found.run.worker) == ("running", "w1")
    update = store.get_update("r1", "u1")
    assert update is not None and (update.state, update.response) == ("answered", "2")
    assert [e.kind for e in store.journal("r1")] == ["respond"]
    assert kinds(store, "r1")[-1] == "claimed"
    # One transaction wrote the claim's receipt and the answer's entry.
    [(receipt,)] = sql(
        postgres_url,
        "SELECT xmin::text FROM perdure.ledger WHERE kind = 'claimed' AND generation = 2",
    )
    [(entry,)] = sql(postgres_url, "SELECT xmin::text FROM perdure.journal WHERE run_id = 'r1'")
    assert receipt == entry


def test_an_answer_that_carries_a_claim_refused_writes_nothing(
    postgres_url: str, store: postgres.PostgresStore
) -> None:
    woken_by_an_update(store)
    # Another worker claimed the run first.
    claimed = claim_one(store, worker="w2")
    assert claimed.claim.generation == 2
    before = harness.snapshot(store)
    assert claim_answering(store) == (None, False)
    assert harness.snapshot(store) == before


def test_a_claim_carried_by_an_answer_stands_when_the_answer_is_refused(
    postgres_url: str, store: postgres.PostgresStore
) -> None:
    woken_by_an_update(store)
    sql(postgres_url, "UPDATE perdure.runs SET cancel_requested = true WHERE run_id = 'r1'")
    found, answered = claim_answering(store)
    # The claim is made (the run unwinds under it); the answer's fence refuses a canceled run.
    assert found is not None and found.run.cancel_requested and not answered
    assert (state(store, "r1"), found.claim.generation) == ("running", 2)
    update = store.get_update("r1", "u1")
    assert update is not None and update.state == "pending"
    assert store.journal("r1") == []


def test_an_answer_that_carries_its_claim_and_fails_leaves_neither(
    postgres_url: str, store: postgres.PostgresStore
) -> None:
    woken_by_an_update(store)
    # The answer's position holds a recorded entry: the answer fails, and the claim with it.
    sql(
        postgres_url,
        "INSERT INTO perdure.journal (run_id, position, kind, name, status, output,"
        " created_at, updated_at) VALUES ('r1', 1, 'step', 'x', 'ok', '1', now(), now())",
    )
    before = harness.snapshot(store)
    with pytest.raises(errors.CorruptState, match="journal_position_taken"):
        claim_answering(store)
    assert harness.snapshot(store) == before
    assert state(store, "r1") == "queued"


def test_park_blocked_behind_a_delivery_sees_its_outcome(
    postgres_url: str, store: postgres.PostgresStore, clock: FakeClock
) -> None:
    claim = started("r1", store)
    offered = port.Outcome("r1", "approval", "signaled", "s1", '"yes"', "d", clock.now())
    with psycopg.connect(postgres_url) as holder:
        # settle_wait will stop at its outcome insert, after taking the run's row lock.
        holder.execute(
            "INSERT INTO perdure.outcomes (run_id, name, outcome, at)"
            " VALUES ('r1', 'approval', 'canceled', now())"
        )
        settling, settled = in_thread(lambda: store.settle_wait("r1", "approval", offered))
        wait_for_blocked(postgres_url, 1)
        parking, parked = in_thread(
            lambda: store.park(claim, [], [port.WaitSpec("approval", "signal")], wake_at=None)
        )
        wait_for_blocked(postgres_url, 2)
        holder.rollback()
    settling.join(timeout=10)
    parking.join(timeout=10)

    assert settled[0][1] is True and settled[0][0].outcome == "signaled"
    assert parked == [False]
    assert state(store, "r1") == "running"


# -- readiness ----------------------------------------------------------------------


def test_wait_ready_wakes_on_a_notify_from_another_connection(
    postgres_url: str, store: postgres.PostgresStore
) -> None:
    assert not store.wait_ready(0)  # opens the listener
    other = postgres.PostgresStore(postgres_url)
    try:
        other.create_run(new("r1"))
        started_at = time.monotonic()
        assert store.wait_ready(10)
        assert time.monotonic() - started_at < 5
        assert not store.wait_ready(0.05)

        barrier = threading.Barrier(2)

        def waiting() -> bool:
            barrier.wait(timeout=10)
            return store.wait_ready(10)

        thread, woke = in_thread(waiting)
        barrier.wait(timeout=10)
        store.create_run(new("r2"))  # the pool keeps serving while a thread listens
        other.notify_ready()
        thread.join(timeout=10)
        assert woke == [True]
    finally:
        other.close()


def _heard(store: postgres.PostgresStore) -> tuple[set[str], bool]:
    """Everything the wake-ups named, until they stop coming."""
    runs: set[str] = set()
    others = False
    while store.wait_ready(0.5):
        woken = store.woken()
        runs |= woken.runs
        others = others or woken.others
    return runs, others


def test_wake_ups_name_the_runs_one_transaction_woke(
    postgres_url: str, store: postgres.PostgresStore
) -> None:
    store.wait_ready(0)
    other = postgres.PostgresStore(postgres_url)
    try:
        woken = [{"app": "app", "run_id": f"r{i}"} for i in range(3)]
        # Sent in one packet: a listener that read only its first would lose two runs.
        other._transact(lambda cur: other._notify_woken(cur, woken))
        assert _heard(store) == ({"r0", "r1", "r2"}, False)
        # Many at once are announced by app, which names no run.
        many = [{"app": "app", "run_id": f"r{i}"} for i in range(postgres._NAMED_WAKES + 1)]
        other._transact(lambda cur: other._notify_woken(cur, many))
        assert _heard(store) == (set(), True)
        other.create_run(new("fresh"))
        assert _heard(store) == (set(), True)
    finally:
        other.close()


def _heard_all(
    store: postgres.PostgresStore,
) -> tuple[set[str], bool, dict[str, liveport.UpdateRecord]]:
    """What the wake-ups named and the updates they carried, until they stop coming."""
    runs: set[str] = set()
    others = False
    carried: dict[str, liveport.UpdateRecord] = {}
    while store.wait_ready(0.5):
        woken = store.woken()
        runs |= woken.runs
        others = others or woken.others
        carried.update(woken.updates)
    return runs, others, carried


@pytest.mark.parametrize("size", [1, 8_000])
def test_a_delivery_names_the_run_it_wakes_and_carries_an_update_that_fits(
    postgres_url: str, store: postgres.PostgresStore, size: int
) -> None:
    claim = started("r1", store)
    assert store.park(claim, [], [port.WaitSpec("ask", "update")], wake_at=None)
    store.wait_ready(0)
    store.woken()
    update = liveport.NewUpdate("r1", "u1", "ask", json.dumps("x" * size))
    other = postgres.PostgresStore(postgres_url)
    try:
        delivered, created = other.deliver_update(update)
        runs, others, carried = _heard_all(store)
        # Delivered again (the same id): stored before, it wakes nothing.
        other.deliver_update(update)
        assert _heard_all(store) == (set(), False, {})
    finally:
        other.close()
    assert created and (runs, others) == ({"r1"}, False)
    if size == 1:
        # The stored record, as next_update reads it.
        assert carried == {"r1": delivered}
        assert store.next_update("r1", "ask", 0) == delivered
    else:
        # Past the notification's room (8,000 bytes): the worker reads it.
        assert carried == {}


def test_a_wake_up_that_carries_no_readable_update_carries_none(
    store: postgres.PostgresStore,
) -> None:
    store._named("app\x1fr1\x1f{not json")
    store._named("app\x1fr2\x1f" + json.dumps({"update_id": "u", "name": "ask"}))
    store._named("app\x1fr3")
    woken = store.woken()
    assert woken.runs == {"r1", "r2", "r3"} and not woken.others
    assert woken.updates == {}


def test_a_warm_claim_that_waited_for_a_changed_row_claims_nothing(
    postgres_url: str, store: postgres.PostgresStore
) -> None:
    claim = started("r1", store)
    held = (port.JournalEntry(1, "wait", "go", "started"),)
    assert store.park(claim, held, [port.WaitSpec("go", "signal")], wake_at=None)
    assert store.wake("r1")
    known = port.KnownJournal(claim.generation, held)
    with psycopg.connect(postgres_url) as locker:
        # A write to the run's row, open while the warm claim takes its snapshot.
        locker.execute("UPDATE perdure.runs SET updated_at = updated_at WHERE run_id = 'r1'")
        thread, out = in_thread(
            lambda: store.claim_warm("app", "w1", WF, run_id="r1", known=known, lease_ttl=30)
        )
        wait_for_blocked(postgres_url, 1)
        locker.commit()
    thread.join(timeout=10)
    # Judged in a snapshot older than the row it would claim: it claims nothing,
    # and the ordinary claim takes the run.
    assert out == [None]
    assert state(store, "r1") == "queued"
    assert claim_one(store).claim.generation == claim.generation + 1


def test_a_broken_listener_is_reopened(postgres_url: str, store: postgres.PostgresStore) -> None:
    assert not store.wait_ready(0)
    sql(
        postgres_url,
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
        " WHERE datname = current_database() AND query LIKE '%%LISTEN perdure_ready'",
    )
    assert store.wait_ready(10)  # spurious, which the port allows
    assert not store.wait_ready(0)
    store.create_run(new("r1"))
    assert store.wait_ready(10)


def test_notify_ready_wakes_every_local_waiter(store: postgres.PostgresStore) -> None:
    store.wait_ready(0)
    barrier = threading.Barrier(4)

    def waiting() -> bool:
        barrier.wait(timeout=10)
        return store.wait_ready(20)

    waiters = [in_thread(waiting) for _ in range(3)]
    barrier.wait(timeout=10)
    # Notify only once every waiter is waiting: one holds the listening
    # connection and two wait on the condition (a waiter that started late
    # would have read the wake count after the notify and wait for the next).
    deadline = time.monotonic() + 10
    while not (store._listen_lock.locked() and len(store._wake_cond._waiters) == 2):  # type: ignore[attr-defined]
        assert time.monotonic() < deadline, "the waiters never all waited"
        time.sleep(0.005)
    store.notify_ready()
    for thread, _ in waiters:
        thread.join(timeout=10)
    assert [woke for _, woke in waiters] == [[True]] * 3


# -- time ---------------------------------------------------------------------------


def test_without_a_clock_the_database_decides_the_time(postgres_url: str) -> None:
    store = postgres.PostgresStore(postgres_url)
    try:
        store.migrate()
        (server,) = sql(postgres_url, "SELECT clock_timestamp()")[0]
        assert abs((store.now() - server).total_seconds()) < 5
        store.create_run(new("r1"))
        claim = claim_one(store, ttl=60).claim
        run = store.get_run("r1")
        assert run is not None and claim.lease_expires_at == run.updated_at + timedelta(seconds=60)
    finally:
        store.close()


# -- refusals ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "mysql://127.0.0.1/db",
        "postgresql://[::1/db",
        "postgresql://postgres:secret@127.0.0.1:notaport/db",
        "postgresql://127.0.0.1/db?no_such_option=1",
    ],
)
def test_a_malformed_url_is_refused(url: str) -> None:
    with pytest.raises(errors.InvalidStoreURL) as refused:
        postgres.PostgresStore(url)
    assert "secret" not in str(refused.value)


def test_unreachable_servers_and_missing_databases_are_one_clear_sentence(
    postgres_url: str,
) -> None:
    missing = pg.url_of("perdure_test_no_such_database")
    cases = {
        "postgresql://postgres:secret@127.0.0.1:1/postgres": "Connection refused",
        missing: 'database "perdure_test_no_such_database" does not exist',
        postgres_url.replace("postgres@", "no_such_role@"): 'role "no_such_role" does not exist',
    }
    for url, reason in cases.items():
        with pytest.raises(errors.StoreUnavailable) as refused:
            postgres.PostgresStore(url)
        message = str(refused.value)
        assert reason in message
        assert "\n" not in message and "secret" not in message and "Traceback" not in message
        assert refused.value.__cause__ is None


def test_connections_the_server_closed_in_the_pool_are_replaced_before_use(
    postgres_url: str, store: postgres.PostgresStore
) -> None:
    store.create_run(new("r1"))
    # Waits for the backends to exit: their connections are closed when the
    # store takes one again (a server restarted, a primary failed over).
    sql(
        postgres_url,
        "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity"
        " WHERE datname = current_database() AND pid <> pg_backend_pid()",
    )
    store.create_run(new("r2"))
    assert sorted(r.run_id for r in store.list_runs("app")) == ["r1", "r2"]
    assert state(store, "r2") == "queued"


def test_the_url_is_shown_without_its_password(postgres_url: str) -> None:
    with_password = postgres_url.replace("postgres@", "postgres:hunter2@")
    store = postgres.PostgresStore(with_password + "?password=hunter2&application_name=x")
    try:
        assert "hunter2" not in store.url
        assert store.url == postgres_url + "?application_name=x"
    finally:
        store.close()


def test_a_multi_host_url_connects_to_the_first_host_that_answers(postgres_url: str) -> None:
    # A failover pair is named host by host; libpq tries them in order and
    # target_session_attrs keeps only the one that accepts writes.
    hosts = postgres_url.replace("@127.0.0.1:5432/", "@127.0.0.1:1,127.0.0.1:5432/")
    assert hosts != postgres_url
    multi = postgres.PostgresStore(hosts + "?target_session_attrs=read-write")
    try:
        multi.migrate()
        multi.create_run(new("r1"))
        assert state(multi, "r1") == "queued"
        assert multi.url == hosts + "?target_session_attrs=read-write"
    finally:
        multi.close()


@pytest.mark.parametrize("ports", ["1,notaport", "1,70000", "1,"])
def test_a_multi_host_url_with_a_bad_port_is_refused(ports: str) -> None:
    host, port_ = ports.split(",")
    with pytest.raises(errors.InvalidStoreURL):
        postgres.PostgresStore(f"postgresql://postgres@127.0.0.1:{host},127.0.0.1:{port_}/db")


def test_rows_that_break_an_invariant_are_refused(
    postgres_url: str, store: postgres.PostgresStore
) -> None:
    for i in range(3):
        store.create_run(new(f"r{i}"))
    sql(postgres_url, "UPDATE perdure.runs SET state = 'bogus' WHERE run_id = 'r0'")
    sql(postgres_url, "UPDATE perdure.runs SET generation = -1 WHERE run_id = 'r1'")
    sql(postgres_url, "ALTER TABLE perdure.runs ALTER COLUMN input DROP NOT NULL")
    sql(postgres_url, "UPDATE perdure.runs SET input = NULL WHERE run_id = 'r2'")

    for run_id, invariant in [("r0", "run_state"), ("r1", "run_generation"), ("r2", "run_input")]:
        with pytest.raises(errors.CorruptState) as refused:
            store.get_run(run_id)
        assert (refused.value.run_id, refused.value.invariant) == (run_id, invariant)


@pytest.mark.parametrize("alone", [False, True], ids=["first-claim", "claim-alone"])
def test_claim_sets_a_corrupt_run_aside_and_takes_the_others(
    postgres_url: str, store: postgres.PostgresStore, alone: bool
) -> None:
    if alone:
        # A claim that found no queues lets the next claims run alone in
        # their transactions (opened by claim_begin, with its savepoint).
        assert store.claim("app", "w1", WF, lease_ttl=30, limit=2) == []
        assert "app" in store._queues_known()
    for run_id in ("bad", "good"):
        store.create_run(new(run_id))
    sql(
        postgres_url,
        "INSERT INTO perdure.journal (run_id, position, kind, name, status, created_at,"
        " updated_at) VALUES ('bad', 1, 'step', 's', 'bogus', now(), now())",
    )
    claimed = store.claim("app", "w1", WF, lease_ttl=30, limit=2)
    assert [c.run.run_id for c in claimed] == ["good"]
    bad = store.get_run("bad")
    # Set aside, not claimed: needs_attention with the invariant named, and
    # the unreadable journal row left as it was.
    assert bad is not None and (bad.state, bad.generation) == ("needs_attention", 0)
    assert bad.error is not None and json.loads(bad.error)["code"] == "corrupt_state"
    assert store.history("bad")[-1].kind == "finished"
    assert store.claim("app", "w1", WF, lease_ttl=30, limit=2) == []


def test_connections_bound_a_silent_network_unless_the_url_says_otherwise(
    postgres_url: str,
) -> None:
    from perdure.store.postgres import connection

    found = connection._connect_kwargs(postgres_url, postgres_url)
    assert (found["keepalives"], found["keepalives_idle"], found["tcp_user_timeout"]) == (
        1,
        10,
        30_000,
    )
    mine = f"{postgres_url}?keepalives_idle=60&tcp_user_timeout=0"
    assert "keepalives_idle" not in connection._connect_kwargs(mine, mine)
    # libpq takes them: a store connects and answers with them set.
    opened = postgres.PostgresStore(postgres_url)
    try:
        row = opened._transact(lambda cur: cur.execute("SELECT 1 AS one").fetchone(), single=True)
        assert row == {"one": 1}
    finally:
        opened.close()
