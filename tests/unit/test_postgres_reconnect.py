"""Lost PostgreSQL connections: replaced quickly, retried only when nothing can have happened.

A transaction cut off before its commit did not happen, so it runs again on
a fresh connection (a few times, within a couple of seconds); a single
statement or a commit whose answer was lost may have happened, so it is
reported as ``StoreUnavailable`` (unless running it twice is running it
once, as an update's delivery is). Connections are lost on purpose by the
backend terminating itself, so the moment of the loss is exact.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from perdure import errors
from perdure.store.postgres import connection
from perdure.store.postgres import store as postgres

pytestmark = pytest.mark.postgres

SUICIDE = "SELECT pg_terminate_backend(pg_backend_pid())"


@pytest.fixture
def store(postgres_url: str) -> Iterator[postgres.PostgresStore]:
    opened = postgres.PostgresStore(postgres_url)
    opened.migrate()
    yield opened
    opened.close()


def test_a_transaction_lost_before_its_commit_runs_again_on_a_fresh_connection(
    store: postgres.PostgresStore,
) -> None:
    backends: list[int] = []

    def work(cur: Any) -> int:
        backends.append(cur.execute("SELECT pg_backend_pid() AS pid").fetchone()["pid"])
        if len(backends) == 1:
            cur.execute(SUICIDE)
        return int(cur.execute("SELECT 1 AS one").fetchone()["one"])

    assert store._transact(work) == 1
    assert len(backends) == 2 and backends[0] != backends[1]


def test_a_store_that_stays_away_is_reported_after_a_bounded_retry(
    store: postgres.PostgresStore,
) -> None:
    calls: list[float] = []

    def work(cur: Any) -> None:
        calls.append(time.monotonic())
        cur.execute(SUICIDE)

    began = time.monotonic()
    with pytest.raises(errors.StoreUnavailable) as lost:
        store._transact(work)
    assert len(calls) == connection._LOST_ATTEMPTS
    assert time.monotonic() - began < connection._LOST_BUDGET + 1
    assert "\n" not in str(lost.value) and "lost the PostgreSQL store" in str(lost.value)
    assert store._transact(lambda cur: cur.execute("SELECT 1 AS one").fetchone()["one"]) == 1


def test_a_lost_single_statement_may_have_happened_so_it_is_not_run_again(
    store: postgres.PostgresStore,
) -> None:
    calls: list[int] = []

    def work(cur: Any) -> None:
        calls.append(1)
        cur.execute(SUICIDE)

    with pytest.raises(errors.StoreUnavailable):
        store._transact(work, single=True)
    with pytest.raises(errors.StoreUnavailable):
        store._transact(work, retry=False)
    assert len(calls) == 2


def test_the_pool_tries_to_replace_a_lost_connection_every_half_second_at_most() -> None:
    # The pool's hook must still exist, or its 1, 2, 4, 8 s backoff is back.
    assert "_add_connection" in vars(connection.ConnectionPool)
    attempt = connection._Attempts(timeout=300)
    delays = []
    for now in range(8):
        attempt.update_delay(float(now))
        delays.append(attempt.delay)
    assert 0.05 < delays[0] < 0.15
    assert max(delays) == connection._RECONNECT_MAX


def test_a_canceled_statement_is_not_a_lost_connection(store: postgres.PostgresStore) -> None:
    calls: list[int] = []

    def work(cur: Any) -> None:
        calls.append(1)
        cur.execute("SET LOCAL statement_timeout = 1")
        cur.execute("SELECT pg_sleep(1)")

    with pytest.raises(errors.StoreError):
        store._transact(work)
    assert len(calls) == 1


def test_a_lost_idempotent_single_statement_runs_again(store: postgres.PostgresStore) -> None:
    backends: list[int] = []

    def work(cur: Any) -> int:
        backends.append(cur.execute("SELECT pg_backend_pid() AS pid").fetchone()["pid"])
        if len(backends) == 1:
            cur.execute(SUICIDE)
        return 1

    assert store._transact(work, single=True, idempotent=True) == 1
    assert len(backends) == 2 and backends[0] != backends[1]


def test_a_lost_delivery_is_sent_again_and_stored_once(store: postgres.PostgresStore) -> None:
    from perdure.store import liveport
    from perdure.testing.conformance.harness import new_run

    run, _ = store.create_run(new_run())
    execute = store._exec
    lost: list[str] = []

    def exec_(cur: Any, query: str, **params: Any) -> Any:
        if query == "update_deliver" and not lost:
            lost.append(query)
            cur.execute(SUICIDE)  # the connection goes before the delivery is sent
        return execute(cur, query, **params)

    store._exec = exec_  # type: ignore[method-assign]
    stored, created = store.deliver_update(liveport.NewUpdate(run.run_id, "u-1", "ask", "1"))
    assert lost and created and stored.sequence == 1
    again, created = store.deliver_update(liveport.NewUpdate(run.run_id, "u-1", "ask", "2"))
    assert (again, created) == (stored, False)


def test_a_transaction_opened_in_one_round_trip_commits_or_rolls_back_whole(
    store: postgres.PostgresStore,
) -> None:
    store._transact(lambda cur: cur.execute("CREATE TABLE opened (n int)"), single=True)

    def count() -> int:
        row = store._transact(
            lambda cur: cur.execute("SELECT count(*) AS n FROM opened").fetchone()
        )
        return int(row["n"])

    def refused(cur: Any) -> None:
        cur.execute("INSERT INTO opened VALUES (1)")
        raise ValueError("refused")

    with pytest.raises(ValueError):
        store._transact(refused, begin="BEGIN; SET LOCAL statement_timeout = 5000")
    assert count() == 0
    backends: list[int] = []

    def work(cur: Any) -> None:
        backends.append(cur.execute("SELECT pg_backend_pid() AS pid").fetchone()["pid"])
        cur.execute("INSERT INTO opened VALUES (1)")
        if len(backends) == 1:
            cur.execute(SUICIDE)  # lost before the commit: nothing happened, run again

    store._transact(work, begin="BEGIN; SET LOCAL statement_timeout = 5000")
    assert len(backends) == 2 and count() == 1
    # The connection the transaction used is back in the pool, idle.
    assert store._transact(lambda cur: cur.execute("SELECT 1 AS one").fetchone()["one"]) == 1
