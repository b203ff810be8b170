"""A plan run's tasks: ``GET /api/v1/runs/{id}/tasks``, and the run page's task table and graph."""

from __future__ import annotations

import dataclasses
import re
from datetime import datetime

import pytest
from shop import World

import perdure
from perdure import records
from perdure.web import graph


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_the_api_lists_a_plan_runs_tasks(world: World, nightly: str) -> None:
    http, head = world.client(), _bearer(world.token("read"))
    answer = http.get(f"/api/v1/runs/{nightly}/tasks", headers=head)
    assert answer.status_code == 200, answer.text
    found = answer.json()
    fields = [f.name for f in dataclasses.fields(perdure.TaskInfo)]
    assert [list(t) for t in found] == [fields] * 6
    by_name = {t["name"]: t for t in found}
    assert [t["name"] for t in found] == [
        "extract",
        "transform",
        "audit",
        "load",
        "report",
        "publish",
    ]
    assert {n: t["state"] for n, t in by_name.items()} == {
        "extract": "succeeded",
        "transform": "failed",
        "audit": "succeeded",
        "load": "blocked",
        "report": "succeeded",
        "publish": "blocked",
    }
    assert by_name["transform"]["error"]["code"] == "task_error"
    assert by_name["transform"]["attempt"] == 2
    assert by_name["publish"]["blocked_by"] == "transform"
    assert by_name["publish"]["parents"] == ["load", "report"]
    assert by_name["publish"]["effect"] == "once"
    assert by_name["extract"]["output"] == ["2026-11-30", "orders", "refunds"]
    assert datetime.fromisoformat(by_name["extract"]["ended_at"]).tzinfo is not None
    assert by_name["load"]["started_at"] is None


def test_the_api_refuses_an_unknown_run_and_lists_no_tasks_of_a_workflow_run(
    world: World,
) -> None:
    http, head = world.client(), _bearer(world.token("read"))
    missing = http.get("/api/v1/runs/no-such-run/tasks", headers=head)
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "run_not_found"
    assert http.get(f"/api/v1/runs/{world.failed}/tasks", headers=head).json() == []
    assert http.get(f"/api/v1/runs/{world.failed}/tasks").status_code == 401


def test_the_openapi_document_lists_the_tasks_endpoint(world: World) -> None:
    document = world.client().get("/api/v1/openapi.json").json()
    listed = document["paths"]["/runs/{run_id}/tasks"]["get"]
    assert listed["x-scope"] == "read" and "404" in listed["responses"]
    assert [p["name"] for p in listed["parameters"]] == ["run_id"]


def test_resolve_names_a_plan_runs_task(world: World, nightly: str) -> None:
    http, head = world.client(), _bearer(world.token("operate"))
    answer = http.post(
        f"/api/v1/runs/{nightly}/resolve", json={"task": "transform", "output": 3}, headers=head
    )
    # transform failed for good: a fork runs it again, resolve does not.
    assert answer.status_code == 409, answer.text
    assert answer.json()["error"]["code"] == "not_resolvable"


def test_a_plan_run_page_shows_a_task_table_and_a_graph(world: World, nightly: str) -> None:
    http = world.client()
    page = http.get(f"/runs/{nightly}", headers=_bearer(world.token("read"))).text
    table = page[page.index('<table class="tasks">') :]
    table = table[: table.index("</table>")]
    rows = re.findall(r'<tr class="task (\w+)" id="task-(\w+)"', table)
    assert rows == [
        ("succeeded", "extract"),
        ("failed", "transform"),
        ("succeeded", "audit"),
        ("blocked", "load"),
        ("succeeded", "report"),
        ("blocked", "publish"),
    ]
    assert '<span class="state blocked">blocked</span>' in table
    assert "the warehouse is unreachable" in table and "task_error" in table
    svg = page[page.index("<svg") : page.index("</svg>")]
    nodes = dict(re.findall(r'data-task="(\w+)" data-depth="(\d)"', svg))
    assert nodes == {
        "extract": "0",
        "transform": "1",
        "audit": "1",
        "load": "2",
        "report": "2",
        "publish": "3",
    }
    edges = set(re.findall(r'data-edge="(\w+) (\w+)"', svg))
    assert edges == {
        ("extract", "transform"),
        ("extract", "audit"),
        ("transform", "load"),
        ("audit", "report"),
        ("load", "publish"),
        ("report", "publish"),
    }
    assert "blocked by transform" in svg
    # A plan run has no journal, and takes no signal, update or suspend.
    assert "<h2>Journal</h2>" not in page
    assert "/actions/signal" not in page and "/actions/suspend" not in page


def test_a_workflow_run_page_has_no_plan(world: World) -> None:
    page = world.client().get(f"/runs/{world.failed}", headers=_bearer(world.token("read"))).text
    assert 'id="plan"' not in page and "<svg" not in page
    assert "<h2>Journal</h2>" in page


def _task(name: str, *parents: str, state: str = "pending") -> records.TaskInfo:
    return records.TaskInfo(name, state, 0, None, None, None, None, parents=parents)


def test_depth_is_the_longest_path_from_a_root() -> None:
    # d is after a (depth 0) and c (depth 2): it stands at 3, right of c.
    tasks = [
        _task("d", "a", "c"),
        _task("a"),
        _task("b", "a"),
        _task("c", "b"),
        _task("e"),
    ]
    assert graph.depths(tasks) == {"a": 0, "b": 1, "c": 2, "d": 3, "e": 0}
    drawn = graph.layout(tasks)
    x = {n.name: n.x for n in drawn.nodes}
    assert x["a"] == x["e"] < x["b"] < x["c"] < x["d"]
    assert all(x[e.parent] < x[e.child] for e in drawn.edges), "every edge points right"
    assert len(drawn.edges) == 4
    assert drawn.width == 2 * graph.MARGIN + 4 * graph.BOX_WIDTH + 3 * graph.COLUMN_GAP


@pytest.mark.parametrize("size", [1, 300])
def test_a_long_chain_is_laid_out_without_recursion(size: int) -> None:
    tasks = [_task("t0")] + [_task(f"t{i}", f"t{i - 1}") for i in range(1, size)]
    assert graph.depths(tasks)[f"t{size - 1}"] == size - 1


def test_a_cycle_in_damaged_rows_is_cut_not_followed() -> None:
    tasks = [_task("a", "b"), _task("b", "a"), _task("c", "c")]
    found = graph.depths(tasks)
    assert set(found) == {"a", "b", "c"} and found["c"] == 0
    assert len(graph.layout(tasks).nodes) == 3
