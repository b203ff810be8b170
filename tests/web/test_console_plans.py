"""The console's listings walk an index in order on both stores, whatever the filters.

Each named query the console pages with is explained against a migrated
store. On SQLite the plan must search the named index with no temporary
B-tree for the order; on PostgreSQL, with sequential scans, bitmap scans and
sorts priced out, it must still be an index scan of that index with no sort
(a plan that cannot use the index keeps its Sort node however it is priced).
"""

from __future__ import annotations

import json
import re
import sqlite3
from datetime import UTC, datetime
from typing import Any

import pytest

import perdure
from perdure.store import sqlfiles

_NOW = datetime(2026, 11, 30, tzinfo=UTC)
PARAMS: dict[str, Any] = {
    "app": "shop",
    "state": "waiting",
    "workflow": "approval",
    "after_at": _NOW,
    "after_id": "",
    "since": datetime(2026, 11, 1, tzinfo=UTC),
    "limit": 51,
    "run_id": "parent",
}
CASES = [
    ("page_runs", "runs_page", {}),
    ("page_runs_by_state", "runs_page_state", {"workflow": None}),
    # A state and a workflow: either index gives the order.
    ("page_runs_by_state", "runs_page_state|runs_page_workflow", {}),
    ("page_runs_by_workflow", "runs_page_workflow", {}),
    ("page_children", "runs_children", {}),
]


def _sqlite_plan(path: str, name: str, params: dict[str, Any]) -> str:
    text = sqlfiles.queries("sqlite")[name]
    used = set(re.findall(r":([a-z_]+)", text))
    params = {
        k: (
            int((v - datetime(1970, 1, 1, tzinfo=UTC)).total_seconds() * 1e6)
            if isinstance(v, datetime)
            else v
        )
        for k, v in params.items()
        if k in used
    }
    conn = sqlite3.connect(path)
    try:
        return "\n".join(str(r[-1]) for r in conn.execute("EXPLAIN QUERY PLAN " + text, params))
    finally:
        conn.close()


def _postgres_plan(url: str, name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    import psycopg

    text = sqlfiles.queries("postgres")[name]
    with psycopg.connect(url) as conn:
        for setting in ("enable_seqscan", "enable_bitmapscan", "enable_sort"):
            conn.execute(f"SET {setting} = off")
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


@pytest.mark.parametrize(("query", "index", "given"), CASES)
def test_listings_walk_their_index_in_order(
    store_url: str, query: str, index: str, given: dict[str, Any]
) -> None:
    params = {**PARAMS, **given}
    indexes = index.split("|")
    app = perdure.App(store_url, name="shop")
    try:
        app.store.migrate()
    finally:
        app.close()
    if store_url.startswith("sqlite"):
        plan = _sqlite_plan(store_url.removeprefix("sqlite:///"), query, params)
        assert any(f"INDEX {i} " in plan for i in indexes), plan
        assert "TEMP B-TREE" not in plan, plan
    else:
        nodes = _postgres_plan(store_url, query, params)
        kinds = [n["Node Type"] for n in nodes]
        assert "Sort" not in kinds and "Seq Scan" not in kinds, kinds
        used = [n.get("Index Name") for n in nodes if "Index Name" in n]
        assert set(used) & set(indexes), (used, kinds)
