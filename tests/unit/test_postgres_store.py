"""Focused tests of the PostgreSQL adapter: what only a shared database can get wrong.

Each test runs on a throwaway database. Races are ordered with barriers and
with row locks held from a second connection, never with sleeps.
"""

from __future__ import annotations

import json
import multiprocessing
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest

import pg  # tests/pg.py, on the path through tests/conftest.py
from perdure import errors
from perdure.store import port
from perdure.store.postgres import store as postgres
from perdure.testing.clock import FakeClock

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


# -- fencing --------------------------------------------------------------------


def test_a_lapsed_claim_is_fenced_out_by_the_recovery(
    store: postgres.PostgresStore, clock: FakeClock
) -> None:
    old = started("r1", store)
    clock.advance(31)
    recovered = claim_one(store, "w2")
    assert recovered.recovered and recovered.claim.generation == old.generation + 1
    assert recovered.run.failures == 1
    before = kinds(store, "r1")

    entry = port.JournalEntry(1, "step", "a", "ok", "1")
    with pytest.raises(errors.StaleClaim):
        store.finish_step(old, [entry], [port.Mark("step_completed", "a")])
    with pytest.raises(errors.StaleClaim):
        store.renew(old, lease_ttl=30)
    with pytest.raises(errors.StaleClaim):
        store.finish(old, [], state="succeeded", result="1")

    assert store.journal("r1") == []
    assert kinds(store, "r1") == before == ["initialized", "claimed", "recovered"]
    store.finish_step(recovered.claim, [entry])
    assert store.journal("r1") == [entry]


def test_a_lapsed_lease_still_writes_while_nobody_took_over(
    store: postgres.PostgresStore, clock: FakeClock
) -> None:
    claim = started("r1", store)
    clock.advance(3600)
    renewed = store.renew(claim, lease_ttl=30)
    assert renewed.lease_expires_at == clock.now() + timedelta(seconds=30)


def test_a_cancel_request_stops_the_owner_until_it_acknowledges(
    store: postgres.PostgresStore,
) -> None:
    claim = started("r1", store)
    assert store.request_cancel("r1")
    entry = port.JournalEntry(1, "step", "cleanup", "ok", "1")

    with pytest.raises(errors.Canceled):
        store.finish_step(claim, [entry])
    with pytest.raises(errors.Canceled):
        store.renew(claim, lease_ttl=30)
    with pytest.raises(errors.Canceled):
        store.finish(claim, [], state="succeeded", result="1")

    acknowledged = port.Claim(
        claim.run_id, claim.worker, claim.generation, claim.lease_expires_at, True
    )
    store.finish_step(acknowledged, [entry])
    store.finish(claim, [], state="canceled")  # settling a cancel needs no acknowledgement
    run = store.get_run("r1")
    assert run is not None and run.state == "canceled"
    assert kinds(store, "r1")[-2:] == ["cancel_requested", "canceled"]


# -- claims ---------------------------------------------------------------------


def test_concurrent_claims_never_share_a_run(store: postgres.PostgresStore) -> None:
    for i in range(60):
        store.create_run(new(f"r{i:02}"))
    workers = 6
    barrier = threading.Barrier(workers)
    taken: list[list[str]] = [[] for _ in range(workers)]

    def work(index: int) -> None:
        barrier.wait(timeout=10)
        while found := store.claim("app", f"w{index}", WF, lease_ttl=30, limit=3):
            taken[index] += [c.run.run_id for c in found]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    every = [run_id for mine in taken for run_id in mine]
    assert sorted(every) == [f"r{i:02}" for i in range(60)]
    assert sum(1 for mine in taken if mine) > 1


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


def test_claim_takes_queued_due_waiting_and_lapsed_runs_of_its_workflows(
    store: postgres.PostgresStore, clock: FakeClock
) -> None:
    store.create_run(new("queued"))
    store.create_run(port.NewRun("other", "app", "wf", "2", "{}"))
    store.create_run(port.NewRun("elsewhere", "app2", "wf", "1", "{}"))
    store.create_run(new("sleeper"))
    store.create_run(new("backoff"))
    store.create_run(new("lapsed"))
    got = {c.run.run_id: c.claim for c in store.claim("app", "w", WF, lease_ttl=30, limit=10)}
    assert sorted(got) == ["backoff", "lapsed", "queued", "sleeper"]
    store.finish(got["queued"], [], state="succeeded", result="1")
    assert store.park(got["sleeper"], [], [], wake_at=clock.now() + timedelta(seconds=60))
    store.release(got["backoff"], delay=90, failed=True)

    assert store.claim("app", "w", WF, lease_ttl=30, limit=10) == []
    clock.advance(61)
    assert [c.run.run_id for c in store.claim("app", "w", WF, lease_ttl=30, limit=10)] == [
        "lapsed",
        "sleeper",
    ]
    clock.advance(30)
    again = store.claim("app", "w", WF, lease_ttl=30, limit=10)
    assert sorted((c.run.run_id, c.recovered) for c in again) == [
        ("backoff", False),
        ("lapsed", True),
        ("sleeper", True),
    ]
    backoff = next(c.run for c in again if c.run.run_id == "backoff")
    assert backoff.failures == 1


def _create_after_barrier(url: str, run_id: str, barrier: Any, results: Any) -> None:
    """Child process: create the run keyed "same" as soon as the other child is ready."""
    try:
        store = postgres.PostgresStore(url)
        try:
            barrier.wait(timeout=30)
            run, created = store.create_run(new(run_id, key="same"))
        finally:
            store.close()
        results.put((run.run_id, created))
    except BaseException as exc:
        results.put(f"{type(exc).__name__}: {exc}")


def test_create_run_from_two_processes_creates_one_run(
    postgres_url: str, store: postgres.PostgresStore
) -> None:
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    results = ctx.Queue()
    children = [
        ctx.Process(target=_create_after_barrier, args=(postgres_url, run_id, barrier, results))
        for run_id in ("a", "b")
    ]
    for child in children:
        child.start()
    outcomes = sorted(results.get(timeout=60) for _ in children)
    for child in children:
        child.join(timeout=30)

    winners = {run_id for run_id, _ in outcomes}
    assert len(winners) == 1 and sorted(created for _, created in outcomes) == [False, True]
    assert [r.run_id for r in store.list_runs("app")] == list(winners)
    assert kinds(store, winners.pop()) == ["initialized"]


# -- parking and delivery ---------------------------------------------------------


def test_park_returns_false_when_a_wait_is_already_met(
    store: postgres.PostgresStore, clock: FakeClock
) -> None:
    claim = started("r1", store)
    offered = port.Outcome("r1", "approval", "signaled", "s1", '"yes"', "d", clock.now())
    _, created = store.settle_wait("r1", "approval", offered)
    assert created
    entry = port.JournalEntry(1, "now", "now", "ok", '"t"')

    assert not store.park(claim, [entry], [port.WaitSpec("approval", "signal")], wake_at=None)
    run = store.get_run("r1")
    assert run is not None and run.state == "running" and run.worker == "w1"
    assert store.journal("r1") == [entry]
    assert "parked" not in kinds(store, "r1")
    store.renew(claim, lease_ttl=30)  # the claim is still good

    assert store.send(port.NewMessage("r1", "events", "k1", '"m"'))
    channel = port.WaitSpec("events", "channel", after_sequence=0)
    assert not store.park(claim, [], [channel], wake_at=None)
    assert not store.park(claim, [], [], wake_at=clock.now())
    consumed = port.WaitSpec("events", "channel", after_sequence=1)
    assert store.park(claim, [], [consumed], wake_at=None)
    assert state(store, "r1") == "waiting"


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


def test_settle_wait_is_put_if_absent_and_refuses_late_signals(
    store: postgres.PostgresStore, clock: FakeClock
) -> None:
    claim = started("r1", store)
    deadline = clock.now() + timedelta(seconds=10)
    assert store.park(claim, [], [port.WaitSpec("approval", "signal", deadline)], wake_at=None)
    clock.advance(11)
    late = port.Outcome("r1", "approval", "signaled", "s1", '"yes"', "d", clock.now())
    stored, created = store.settle_wait("r1", "approval", late)
    assert created and stored.outcome == "timed_out"
    assert (stored.payload, stored.signal_id, stored.at) == (None, None, clock.now())
    again, created = store.settle_wait("r1", "approval", late)
    assert (again, created) == (stored, False)
    assert state(store, "r1") == "queued"

    with pytest.raises(errors.RunNotFound):
        store.settle_wait("nope", "approval", late)
    second = claim_one(store).claim
    store.finish(second, [], state="succeeded", result="1")
    with pytest.raises(errors.RunFinished):
        store.settle_wait("r1", "other", late)
    with pytest.raises(errors.RunFinished):
        store.send(port.NewMessage("r1", "events", "k", "1"))


def test_send_dedupes_orders_and_wakes_a_run_waiting_on_the_channel(
    store: postgres.PostgresStore,
) -> None:
    claim = started("r1", store)
    assert store.park(claim, [], [port.WaitSpec("events", "channel")], wake_at=None)
    assert store.send(port.NewMessage("r1", "other", "k0", '"x"'))
    assert state(store, "r1") == "waiting"
    assert store.send(port.NewMessage("r1", "events", "k1", '"first"'))
    assert not store.send(port.NewMessage("r1", "events", "k1", '"second"'))
    assert store.send(port.NewMessage("r1", "events", "k2", '"third"'))
    assert state(store, "r1") == "queued"

    first = store.next_message("r1", "events", 0)
    assert first is not None and (first.key, first.payload, first.sequence) == ("k1", '"first"', 2)
    following = store.next_message("r1", "events", first.sequence)
    assert following is not None and following.key == "k2"
    assert store.next_message("r1", "events", following.sequence) is None


# -- journal and ledger -------------------------------------------------------------


def test_only_a_started_entry_may_be_replaced(store: postgres.PostgresStore) -> None:
    claim = started("r1", store)
    store.begin_effect(claim, [port.JournalEntry(1, "step", "charge", "started")])
    done = port.JournalEntry(1, "step", "charge", "ok", '"ch_1"')
    store.finish_step(claim, [done])
    before = kinds(store, "r1")

    with pytest.raises(errors.CorruptState) as refused:
        store.finish_step(
            claim,
            [port.JournalEntry(2, "step", "b", "ok", "2"), port.JournalEntry(1, "step", "x", "ok")],
            [port.Mark("step_completed", "b")],
        )
    assert refused.value.invariant == "journal_position_taken"
    assert store.journal("r1") == [done]
    assert kinds(store, "r1") == before


def test_the_ledger_keeps_exactly_the_newest_receipts(postgres_url: str, clock: FakeClock) -> None:
    store = postgres.PostgresStore(postgres_url, clock=clock, ledger_limit=3)
    try:
        store.migrate()
        claim = started("r1", store)
        assert [(e.sequence, e.kind) for e in store.history("r1")] == [
            (1, "initialized"),
            (2, "claimed"),
        ]
        marks = [port.Mark("step_completed", f"s{i}") for i in range(5)]
        store.finish_step(claim, [], marks)
        history = store.history("r1")
        assert [(e.sequence, e.step) for e in history] == [(5, "s2"), (6, "s3"), (7, "s4")]
        assert {(e.generation, e.worker) for e in history} == {(1, "w1")}
        store.release(claim, delay=0, failed=False)
        assert [e.sequence for e in store.history("r1")] == [6, 7, 8]
        assert [r.ledger_sequence for r in store.list_runs("app")] == [8]
        assert sql(postgres_url, "SELECT count(*) FROM perdure.ledger")[0][0] == 3
        with pytest.raises(errors.InvalidInput):
            store.finish_step(claim, [], [port.Mark("no_such_kind")])
    finally:
        store.close()


def test_transaction_step_writes_with_its_entry_or_not_at_all(
    postgres_url: str, store: postgres.PostgresStore
) -> None:
    sql(postgres_url, "CREATE TABLE public.orders (id int PRIMARY KEY)")
    claim = started("r1", store)

    def failing(conn: psycopg.Connection[Any]) -> port.JournalEntry:
        conn.execute("INSERT INTO public.orders VALUES (1)")
        raise KeyError("boom")

    with pytest.raises(KeyError, match="boom"):
        store.transaction_step(claim, [], failing)
    assert sql(postgres_url, "SELECT id FROM public.orders") == []
    assert store.journal("r1") == []

    def inserting(conn: psycopg.Connection[Any]) -> port.JournalEntry:
        conn.execute("INSERT INTO public.orders VALUES (1)")
        return port.JournalEntry(1, "step", "order", "ok", "1")

    entry = store.transaction_step(claim, [], inserting, [port.Mark("step_completed", "order")])
    assert sql(postgres_url, "SELECT id FROM public.orders") == [(1,)]
    assert store.journal("r1") == [entry]


# -- ending runs ------------------------------------------------------------------


def test_ending_a_child_cleans_up_and_settles_the_parents_wait(
    store: postgres.PostgresStore, clock: FakeClock
) -> None:
    parent = started("p", store)
    (child,) = store.create_children(parent, [new("c", key="p/1")])
    assert child.parent_id == "p"
    assert store.park(parent, [], [port.WaitSpec("child:c", "child")], wake_at=None)
    mine = claim_one(store).claim
    store.settle_wait(
        "c", "early", port.Outcome("c", "early", "signaled", None, "1", None, clock.now())
    )
    store.send(port.NewMessage("c", "events", "k", "1"))
    assert not store.park(mine, [], [port.WaitSpec("events", "channel")], wake_at=None)

    store.finish(mine, [], state="failed", error='{"code": "boom", "message": "no"}')

    assert store.outcomes("c") == []
    assert store.waits("app", "c") == []
    assert store.next_message("c", "events", 0) is None
    (outcome,) = store.outcomes("p")
    assert outcome.name == "child:c" and outcome.outcome == "signaled"
    assert json.loads(outcome.payload or "") == {
        "run_id": "c",
        "state": "failed",
        "result": None,
        "error": {"code": "boom", "message": "no"},
    }
    assert state(store, "p") == "queued"
    assert kinds(store, "p")[-1] == "woken"
    assert store.child_counts("p") == {"failed": 1}


def test_a_child_wakes_its_parent_only_when_the_parent_waits_on_it(
    store: postgres.PostgresStore,
) -> None:
    parent = started("p", store)
    store.create_children(parent, [new("c1", key="c1"), new("c2", key="c2")])
    assert store.park(parent, [], [port.WaitSpec("child:c1", "child")], wake_at=None)
    claims = {c.run.run_id: c.claim for c in store.claim("app", "w", WF, lease_ttl=30, limit=2)}

    store.finish(claims["c2"], [], state="succeeded", result="2")
    assert [o.name for o in store.outcomes("p")] == ["child:c2"]
    assert state(store, "p") == "waiting"

    store.finish(claims["c1"], [], state="succeeded", result="1")
    assert state(store, "p") == "queued"
    assert kinds(store, "p").count("woken") == 1


def test_create_run_stores_a_forks_journal_only_when_it_creates(
    store: postgres.PostgresStore,
) -> None:
    prefix = [
        port.JournalEntry(1, "step", "a", "ok", "1"),
        port.JournalEntry(2, "now", "now", "ok"),
    ]
    run, created = store.create_run(new("fork", key="fork"), prefix)
    assert created and store.journal("fork") == prefix
    again, created = store.create_run(new("other", key="fork"), [prefix[0]])
    assert (again, created) == (run, False)
    assert store.journal("fork") == prefix
    assert store.get_run("other") is None


def test_create_children_fans_out_in_one_call_and_replays_without_duplicates(
    store: postgres.PostgresStore,
) -> None:
    parent = started("p", store)
    children = [new(f"c{i}", key=f"p/{i}") for i in range(2000)]
    created = store.create_children(parent, children)
    assert [c.run_id for c in created] == [c.run_id for c in children]
    replayed = store.create_children(parent, [new(f"x{i}", key=f"p/{i}") for i in range(2000)])
    assert replayed == created
    assert store.child_counts("p") == {"queued": 2000}
    with pytest.raises(errors.InvalidInput):
        store.create_children(parent, [new("nokey")])


def test_request_cancel_walks_the_whole_tree(store: postgres.PostgresStore) -> None:
    root = started("root", store)
    store.create_children(root, [new(n, key=n) for n in ("queued", "waiting", "running")])
    claims = {c.run.run_id: c.claim for c in store.claim("app", "w", WF, lease_ttl=30, limit=3)}
    store.park(claims["waiting"], [], [port.WaitSpec("approval", "signal")], wake_at=None)
    store.release(claims["queued"], delay=0, failed=False)
    store.create_children(claims["running"], [new("grandchild", key="grandchild")])

    assert store.request_cancel("root")

    states = {r.run_id: (r.state, r.cancel_requested) for r in store.list_runs("app")}
    assert states == {
        "root": ("running", True),
        "queued": ("canceled", True),
        "waiting": ("canceled", True),
        "running": ("running", True),
        "grandchild": ("canceled", True),
    }
    assert store.waits("app", "waiting") == []
    assert sorted(o.name for o in store.outcomes("root")) == ["child:queued", "child:waiting"]
    assert [o.name for o in store.outcomes("running")] == ["child:grandchild"]
    assert kinds(store, "root")[-1] == "cancel_requested"
    assert kinds(store, "waiting")[-1] == "canceled"
    assert not store.request_cancel("root")
    with pytest.raises(errors.RunNotFound):
        store.request_cancel("nope")


def test_resolve_settles_the_ambiguous_entry(store: postgres.PostgresStore) -> None:
    claim = started("r1", store)
    store.begin_effect(claim, [port.JournalEntry(1, "step", "charge", "started")])
    store.finish(claim, [], state="needs_attention", error='{"code": "effect_outcome_unknown"}')
    done = port.JournalEntry(1, "step", "charge", "ok", '"ch_1"')

    with pytest.raises(errors.NotResolvable):
        store.resolve("r1", 2, done, state="queued", error=None, note="by hand")
    with pytest.raises(errors.NotResolvable):
        store.resolve(
            "r1", 1, port.JournalEntry(2, "step", "x", "ok"), state="queued", error=None, note=""
        )

    store.resolve("r1", 1, done, state="queued", error=None, note="charged, per the bank")
    run = store.get_run("r1")
    assert run is not None and (run.state, run.failures, run.error) == ("queued", 0, None)
    assert store.journal("r1") == [done]
    last = store.history("r1")[-1]
    assert (last.kind, last.step, last.note) == ("resolved", "charge", "charged, per the bank")
    with pytest.raises(errors.NotResolvable):
        store.resolve("r1", 1, done, state="queued", error=None, note="again")


def test_a_run_that_needs_attention_keeps_its_records_until_resolved(
    store: postgres.PostgresStore, clock: FakeClock
) -> None:
    parent = started("p", store)
    store.create_children(parent, [new("c", key="c")])
    store.park(parent, [], [port.WaitSpec("child:c", "child")], wake_at=None)
    child = claim_one(store).claim
    early = port.Outcome("c", "early", "signaled", None, "1", None, clock.now())
    store.settle_wait("c", "early", early)
    store.begin_effect(child, [port.JournalEntry(1, "step", "charge", "started")])
    store.finish(child, [], state="needs_attention", error='{"code": "effect_outcome_unknown"}')

    store.sweep()
    assert [o.name for o in store.outcomes("c")] == ["early"]
    assert (state(store, "p"), store.outcomes("p")) == ("waiting", [])

    failed = port.JournalEntry(1, "step", "charge", "error", '{"code": "resolved_failed"}')
    store.resolve("c", 1, failed, state="failed", error='{"code": "resolved_failed"}', note="")
    assert store.outcomes("c") == []
    (outcome,) = store.outcomes("p")
    assert json.loads(outcome.payload or "")["state"] == "failed"
    assert state(store, "p") == "queued"


# -- sweeps -----------------------------------------------------------------------


def test_sweep_times_out_waits_wakes_due_runs_and_drops_orphans(
    postgres_url: str, store: postgres.PostgresStore, clock: FakeClock
) -> None:
    signal = started("signal", store)
    deadline = clock.now() + timedelta(seconds=10)
    store.park(signal, [], [port.WaitSpec("approval", "signal", deadline)], wake_at=None)
    sleeper = started("sleeper", store)
    store.park(sleeper, [], [], wake_at=clock.now() + timedelta(seconds=5))
    sql(
        postgres_url,
        "INSERT INTO perdure.outcomes (run_id, name, outcome, at)"
        " VALUES ('gone', 'x', 'canceled', now())",
    )
    assert store.sweep() == 1  # the orphan only

    clock.advance(11)
    assert store.sweep() == 3  # one timed out, two woken
    (outcome,) = store.outcomes("signal")
    assert (outcome.name, outcome.outcome, outcome.at) == ("approval", "timed_out", clock.now())
    states = {r.run_id: r.state for r in store.list_runs("app")}
    assert states == {"signal": "queued", "sleeper": "queued"}
    assert store.waits("app") == []
    assert store.sweep() == 0


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


def test_a_broken_listener_is_reopened(postgres_url: str, store: postgres.PostgresStore) -> None:
    assert not store.wait_ready(0)
    sql(
        postgres_url,
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
        " WHERE datname = current_database() AND query = 'LISTEN perdure_ready'",
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


def test_a_lost_connection_is_unavailable_then_replaced(
    postgres_url: str, store: postgres.PostgresStore
) -> None:
    store.create_run(new("r1"))
    sql(
        postgres_url,
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
        " WHERE datname = current_database() AND pid <> pg_backend_pid()",
    )
    with pytest.raises(errors.StoreUnavailable) as lost:
        store.create_run(new("r2"))
    assert "\n" not in str(lost.value)
    assert [r.run_id for r in store.list_runs("app")] == ["r1"]
    store.create_run(new("r2"))
    assert state(store, "r2") == "queued"


def test_the_url_is_shown_without_its_password(postgres_url: str) -> None:
    with_password = postgres_url.replace("postgres@", "postgres:hunter2@")
    store = postgres.PostgresStore(with_password + "?password=hunter2&application_name=x")
    try:
        assert "hunter2" not in store.url
        assert store.url == postgres_url + "?application_name=x"
    finally:
        store.close()


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


def test_claim_sets_a_corrupt_run_aside_and_takes_the_others(
    postgres_url: str, store: postgres.PostgresStore
) -> None:
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
