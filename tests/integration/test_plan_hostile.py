"""Hostile fixtures for plans: a plan run's task rows are forged behind the store's back.

Each case creates a real plan run through the store (``a -> b, a -> c,
(b, c) -> d``, nothing claimed), forges one of its rows with SQL, and asserts
that the store fails closed: ``tasks(run_id)`` raises ``CorruptState`` naming
the invariant, and ``claim_tasks`` claims nothing of the run and sets it aside
(``needs_attention`` with that invariant, as a claim of runs does) without
rewriting a task row. Every case runs on SQLite and PostgreSQL.
"""

from __future__ import annotations

import json
import sqlite3
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from perdure import errors
from perdure.store import open_store, planport, port
from perdure.store.sqlite import connection as sqlite_connection
from perdure.testing.clock import FakeClock

APP = "hostile-plans"
PLAN = "nightly"
DIGEST = "digest-1"
SHAPE = (("a", ()), ("b", ("a",)), ("c", ("a",)), ("d", ("b", "c")))


class Db:
    """Execute SQL on a store's database; statements name ``{tasks}`` and ``{runs}``."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.kind = "sqlite" if url.startswith("sqlite:") else "postgres"
        prefix = "" if self.kind == "sqlite" else "perdure."
        self.names = {t: prefix + t for t in ("tasks", "runs", "ledger")}
        # A JSON column is text on SQLite and jsonb on PostgreSQL.
        self.names["json"] = "" if self.kind == "sqlite" else "::jsonb"
        self.names["one"] = "1" if self.kind == "sqlite" else "true"

    def execute(self, sql: str, *params: Any) -> list[dict[str, Any]]:
        """Run one statement in its own transaction; return its rows as dicts."""
        sql = sql.format(**self.names)
        if self.kind == "sqlite":
            conn = sqlite3.connect(sqlite_connection.database_path(self.url), timeout=10)
            conn.row_factory = sqlite3.Row
            try:
                found = [dict(row) for row in conn.execute(sql.replace("%s", "?"), params)]
                conn.commit()
                return found
            finally:
                conn.close()
        import psycopg
        from psycopg.rows import dict_row

        with psycopg.connect(self.url, autocommit=True, row_factory=dict_row) as shared:
            cur = shared.execute(sql, params)
            return list(cur.fetchall()) if cur.description else []

    def snapshot(self, run_id: str) -> dict[str, Any]:
        """Return every row the store holds for the run."""
        return {
            table: self.execute(f"SELECT * FROM {{{table}}} WHERE run_id = %s ORDER BY 2", run_id)
            for table in ("runs", "tasks", "ledger")
        }


@dataclass
class Scene:
    store: port.Store
    db: Db
    clock: FakeClock
    run_id: str

    @property
    def plans(self) -> planport.PlanStore:
        assert isinstance(self.store, planport.PlanStore)
        return self.store


@pytest.fixture
def scene(store_url: str) -> Iterator[Scene]:
    clock = FakeClock()
    store = open_store(store_url, clock=clock)
    try:
        tasks = tuple(planport.TaskSpec(n, p, "pure", i) for i, (n, p) in enumerate(SHAPE))
        new = port.NewRun(
            str(uuid.uuid4()), APP, PLAN, "1", "{}", plan=planport.PlanSpec(DIGEST, 1, tasks)
        )
        run, _ = store.create_run(new)
        yield Scene(store, Db(store_url), clock, run.run_id)
    finally:
        store.close()


def set_task(name: str, assignments: str, *params: Any) -> Callable[[Scene], str]:
    def damage(s: Scene) -> str:
        s.db.execute(
            f"UPDATE {{tasks}} SET {assignments} WHERE run_id = %s AND name = %s",
            *params,
            s.run_id,
            name,
        )
        return s.run_id

    return damage


def running(name: str, *, generation: int, worker: str | None) -> Callable[[Scene], str]:
    def damage(s: Scene) -> str:
        s.db.execute(
            "UPDATE {tasks} SET state = 'running', generation = %s, worker = %s, "
            "lease_expires_at = created_at, started_at = created_at "
            "WHERE run_id = %s AND name = %s",
            generation,
            worker,
            s.run_id,
            name,
        )
        return s.run_id

    return damage


def tasks_on_a_workflow_run(s: Scene) -> str:
    """Task rows forged onto a running workflow run of the plan's name."""
    run, _ = s.store.create_run(port.NewRun(str(uuid.uuid4()), APP, PLAN, "1", "{}"))
    [claimed] = s.store.claim(APP, "w-1", [(PLAN, "1")], lease_ttl=30)
    assert claimed.run.run_id == run.run_id
    s.db.execute(
        "INSERT INTO {tasks} (run_id, name, position, parents, effect, state, max_recoveries, "
        "created_at, updated_at) SELECT %s, name, position, parents, effect, state, "
        "max_recoveries, created_at, updated_at FROM {tasks} WHERE run_id = %s",
        run.run_id,
        s.run_id,
    )
    s.db.execute("DELETE FROM {tasks} WHERE run_id = %s", s.run_id)
    s.db.execute(
        "UPDATE {runs} SET state = 'succeeded', result = 'null' WHERE run_id = %s", s.run_id
    )
    return run.run_id


CASES: dict[str, tuple[Callable[[Scene], str], str]] = {
    "running_with_generation_0": (running("d", generation=0, worker="w-1"), "task_claim"),
    "running_without_worker": (running("d", generation=1, worker=None), "task_claim"),
    "unknown_state": (set_task("d", "state = %s", "exploded"), "task_state"),
    "parents_not_a_list": (set_task("d", "parents = %s{json}", '{"b": 1}'), "task_parents"),
    "parents_not_names": (set_task("d", "parents = %s{json}", "[1, 2]"), "task_parents"),
    "succeeded_below_a_pending_parent": (
        set_task("b", "state = 'succeeded', generation = 1, output = '1'"),
        "task_parents",
    ),
    "running_below_a_pending_parent": (running("b", generation=1, worker="w-1"), "task_parents"),
    "unknown_parent": (set_task("d", "parents = %s{json}", '["b", "zz"]'), "task_unknown_parent"),
    "tasks_on_a_workflow_run": (tasks_on_a_workflow_run, "task_run"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_forged_task_rows_are_refused_and_left_as_they_are(scene: Scene, case: str) -> None:
    damage, invariant = CASES[case]
    run_id = damage(scene)
    before = scene.db.snapshot(run_id)
    with pytest.raises(errors.CorruptState) as read:
        scene.plans.tasks(run_id)
    assert (read.value.run_id, read.value.invariant) == (run_id, invariant)
    assert scene.db.snapshot(run_id) == before
    scene.clock.advance(3600)  # any forged lease has lapsed: the claim meets every row
    claimed = scene.plans.claim_tasks(
        APP, "w-2", [(PLAN, "1", DIGEST)], lease_ttl=30, recover_until=scene.clock.now()
    )
    assert [c for c in claimed if c.run_id == run_id] == []
    _assert_set_aside(scene, run_id, invariant, before)


def _assert_set_aside(scene: Scene, run_id: str, invariant: str | None, before: Any) -> None:
    after = scene.db.snapshot(run_id)
    assert after["tasks"] == before["tasks"]
    run = scene.store.get_run(run_id)
    assert run is not None and run.state == "needs_attention"
    error = json.loads(run.error or "{}")
    assert error["code"] == "corrupt_state"
    if invariant is not None:
        assert error["invariant"] == invariant


def test_parents_that_are_not_json_are_refused(scene: Scene) -> None:
    if scene.db.kind != "sqlite":
        pytest.skip("a jsonb column holds only JSON")
    set_task("d", "parents = %s", "not json")(scene)
    before = scene.db.snapshot(scene.run_id)
    with pytest.raises(errors.CorruptState):
        scene.plans.tasks(scene.run_id)
    assert scene.plans.claim_tasks(APP, "w-2", [(PLAN, "1", DIGEST)], lease_ttl=30) == []
    _assert_set_aside(scene, scene.run_id, None, before)


def test_a_task_running_in_a_run_that_ended_is_refused_and_never_claimed(scene: Scene) -> None:
    running("a", generation=1, worker="w-1")(scene)
    scene.db.execute(
        "UPDATE {runs} SET state = 'succeeded', result = 'null' WHERE run_id = %s", scene.run_id
    )
    before = scene.db.snapshot(scene.run_id)
    with pytest.raises(errors.CorruptState) as read:
        scene.plans.tasks(scene.run_id)
    assert read.value.invariant == "task_run"
    scene.clock.advance(3600)
    claimed = scene.plans.claim_tasks(
        APP, "w-2", [(PLAN, "1", DIGEST)], lease_ttl=30, recover_until=scene.clock.now()
    )
    assert claimed == []
    assert scene.db.snapshot(scene.run_id) == before
