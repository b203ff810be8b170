"""Pruning picks its runs on runs_page_state whatever the planner's statistics say.

The store these tests build is the shape that once misled PostgreSQL: most
runs of the app succeeded, a tenth wait, statistics were taken, then most
succeeded runs were deleted without taking them again (a server without
autovacuum). With ``state = :state`` the planner treated the state as a
constant, walked runs_page in created_at order and stepped over every waiting
run and every deleted one. The pick must stay on runs_page_state, and no
other index may be able to serve its order at all.
"""

from __future__ import annotations

import json
import sqlite3
from datetime import UTC, datetime
from typing import Any

import pytest

import perdure
from perdure.store import sqlfiles

_CUTOFF = datetime(2030, 1, 1, tzinfo=UTC)
_LOAD = """
INSERT INTO perdure.runs (run_id, app, workflow, version, state, input, created_at, updated_at)
SELECT 'r' || lpad(i::text, 8, '0'), 'shop', 'wf', 'v1',
       CASE WHEN i % 11 = 0 THEN 'waiting' ELSE 'succeeded' END, '{}',
       timestamptz '2026-01-01' + i * interval '1 second',
       timestamptz '2026-01-01' + i * interval '1 second' + interval '1 second'
FROM generate_series(1, 110000) AS i
"""


def _migrated(url: str) -> None:
    app = perdure.App(url, name="shop")
    try:
        app.store.migrate()
    finally:
        app.close()


def _postgres_nodes(conn: Any, params: dict[str, Any]) -> list[dict[str, Any]]:
    text = sqlfiles.queries("postgres")["prune_pick"]
    row = conn.execute("EXPLAIN (FORMAT JSON) " + text, params).fetchone()
    assert row is not None
    found = row[0] if not isinstance(row[0], str) else json.loads(row[0])
    nodes: list[dict[str, Any]] = []

    def walk(node: dict[str, Any]) -> None:
        nodes.append(node)
        for child in node.get("Plans", []):
            walk(child)

    walk(found[0]["Plan"])
    return nodes


@pytest.mark.postgres
def test_postgres_picks_on_the_state_index_with_stale_statistics(postgres_url: str) -> None:
    import psycopg

    _migrated(postgres_url)
    params = {"app": "shop", "state": "succeeded", "before": _CUTOFF, "limit": 500}
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(_LOAD)
        conn.execute("ANALYZE perdure.runs")
        conn.execute("DELETE FROM perdure.runs WHERE state = 'succeeded' AND run_id < 'r00090000'")
        nodes = _postgres_nodes(conn, params)
        used = [n.get("Index Name") for n in nodes if "Index Name" in n]
        assert used == ["runs_page_state"], [n["Node Type"] for n in nodes]
        assert "Sort" not in [n["Node Type"] for n in nodes]


@pytest.mark.postgres
def test_postgres_no_other_index_serves_the_picks_order(postgres_url: str) -> None:
    import psycopg

    _migrated(postgres_url)
    params = {"app": "shop", "state": "succeeded", "before": _CUTOFF, "limit": 500}
    with psycopg.connect(postgres_url) as conn:
        # Without runs_page_state, however scans are priced, the order needs a sort.
        conn.execute("DROP INDEX perdure.runs_page_state")
        for setting in ("enable_seqscan", "enable_bitmapscan", "enable_sort"):
            conn.execute(f"SET LOCAL {setting} = off")
        kinds = [n["Node Type"] for n in _postgres_nodes(conn, params)]
        conn.rollback()
    assert "Sort" in kinds or "Incremental Sort" in kinds, kinds


def _sqlite_plan(conn: sqlite3.Connection, text: str, params: dict[str, Any]) -> str:
    return "\n".join(str(r[-1]) for r in conn.execute("EXPLAIN QUERY PLAN " + text, params))


def test_sqlite_picks_on_the_state_index_whatever_the_statistics(sqlite_url: str) -> None:
    _migrated(sqlite_url)
    text = sqlfiles.queries("sqlite")["prune_pick"]
    params = {"app": "shop", "state": "succeeded", "before": 1_900_000_000_000_000, "limit": 500}
    path = sqlite_url.removeprefix("sqlite:///")
    conn = sqlite3.connect(path)
    try:
        plans = [_sqlite_plan(conn, text, params)]
        # Statistics that make the app alone look selective and the state useless.
        conn.execute("ANALYZE")
        conn.execute("DELETE FROM sqlite_stat1 WHERE tbl = 'runs'")
        conn.executemany(
            "INSERT INTO sqlite_stat1 VALUES ('runs', ?, ?)",
            [
                ("runs_page", "1100000 10 1 1"),
                ("runs_page_state", "1100000 1100000 1100000 1100000 1100000"),
            ],
        )
        conn.commit()
    finally:
        conn.close()
    conn = sqlite3.connect(path)
    try:
        plans.append(_sqlite_plan(conn, text, params))
    finally:
        conn.close()
    for plan in plans:
        assert "INDEX runs_page_state " in plan, plan
        assert "TEMP B-TREE" not in plan, plan
