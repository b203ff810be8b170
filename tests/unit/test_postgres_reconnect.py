"""Lost PostgreSQL connections: replaced quickly, retried only when nothing can have happened.

A transaction cut off before its commit did not happen, so it runs again on
a fresh connection (a few times, within a couple of seconds); a single
statement or a commit whose answer was lost may have happened, so it is
reported as ``StoreUnavailable``. Connections are lost on purpose by the
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
