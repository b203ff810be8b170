"""The queries a worker runs on every claim and sweep read only what is live.

A store keeps every ended run until retention removes it, so a query on the
claim path that walks the app's runs (through a console page index, or the
table itself) costs time in proportion to history: at a million ended runs
one claim took a second. SQLite plans without statistics, so the plans are
checked here as SQLite makes them on a fresh store.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator

import pytest

from perdure.store import sqlfiles
from perdure.store.sqlite import store as sqlite
from perdure.store.sqlite.connection import database_path

# Each worker loop, claim and sweep runs these; the ranges they read hold live
# runs only (queued, due, lapsed, waiting), never the ended ones.
HOT = (
    "claim",
    "claim_one",
    "queue_candidates",
    "sweep_due_runs",
    "sweep_clamp_leases",
    "deadline_due",
)
# The partial indexes of live runs: a scan of one of them is a scan of live runs.
LIVE_ONLY = ("runs_running", "runs_waiting_ready", "runs_deadline", "runs_claim", "runs_queue ")


@pytest.fixture
def conn(sqlite_url: str) -> Iterator[sqlite3.Connection]:
    opened = sqlite.SqliteStore(sqlite_url)
    opened.migrate()
    opened.close()
    connection = sqlite3.connect(database_path(sqlite_url))
    yield connection
    connection.close()


def _statements(sql: str) -> list[str]:
    found, pending = [], ""
    for line in sql.splitlines(keepends=True):
        pending += line
        if sqlite3.complete_statement(pending):
            found.append(pending)
            pending = ""
    return [*found, pending] if pending.strip() else found


def _plan(conn: sqlite3.Connection, statement: str) -> list[str]:
    class Nulls(dict[str, object]):
        def __missing__(self, key: str) -> object:
            return "[]" if key in {"workflows", "plans"} else None

    rows = conn.execute(f"EXPLAIN QUERY PLAN {statement}", Nulls()).fetchall()
    return [str(row[3]) for row in rows]


def _reads_history(step: str) -> bool:
    if not step.startswith(("SCAN runs", "SEARCH runs", "SCAN r ", "SEARCH r ")):
        return False
    if step.startswith(
        ("SEARCH runs USING INDEX sqlite_autoindex", "SEARCH r USING INDEX sqlite_autoindex")
    ):
        return "(run_id=?)" not in step
    return not any(f"INDEX {index}" in f"{step} " for index in LIVE_ONLY)


@pytest.mark.parametrize("name", HOT)
def test_a_hot_query_reads_no_ended_runs(conn: sqlite3.Connection, name: str) -> None:
    queries = sqlfiles.queries("sqlite")
    assert name in queries
    for statement in _statements(queries[name]):
        wrong = [step for step in _plan(conn, statement) if _reads_history(step)]
        assert not wrong, f"{name} reads ended runs: {wrong}"
