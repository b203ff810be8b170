"""A run's tree of descendants, its attempts, timers and result, and the app's waits and timers."""

from __future__ import annotations

from typing import Any

from shop import World, settle

from perdure.web import api


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _names(node: dict[str, Any]) -> list[str]:
    return [c["workflow"] for c in node["children"]]


def test_the_tree_nests_children_and_marks_what_it_leaves_out(
    any_world: World, any_family: str
) -> None:
    world, family = any_world, any_family
    http, head = world.client(), _bearer(world.token("read"))
    answer = http.get(f"/api/v1/runs/{family}/tree", headers=head)
    assert answer.status_code == 200
    root = answer.json()
    assert (root["run_id"], root["workflow"], root["state"]) == (family, "family", "waiting")
    assert root["total"] == 4 and root["counts"] == {"succeeded": 4}
    assert (root["truncated"], root["more"], root["next_cursor"]) == (False, 0, None)
    assert root["limits"] == {"depth": 3, "width": 10, "limit": 50, "budget": 500}
    assert _names(root) == ["parcel", "parcel", "parcel", "batch"]
    parcel, batch = root["children"][0], root["children"][3]
    assert set(parcel) == {
        "run_id",
        "workflow",
        "state",
        "total",
        "truncated",
        "more",
        "children",
    }
    assert (parcel["total"], parcel["truncated"], parcel["children"]) == (0, False, [])
    # Below the first level each run shows its first ten children: the other two are marked.
    assert (batch["total"], batch["truncated"], batch["more"]) == (12, True, 2)
    assert _names(batch) == ["parcel"] * 10
    assert all(c["total"] == 0 and not c["truncated"] for c in batch["children"])
    # The batch's own tree has all twelve at its first level.
    own = http.get(f"/api/v1/runs/{batch['run_id']}/tree", headers=head).json()
    assert own["total"] == 12 and len(own["children"]) == 12 and not own["truncated"]


def test_the_tree_is_cut_by_depth_width_and_pages(world: World, family: str) -> None:
    http, head = world.client(), _bearer(world.token("read"))
    url = f"/api/v1/runs/{family}/tree"
    shallow = http.get(url, params={"depth": 1}, headers=head).json()
    batch = shallow["children"][3]
    assert (batch["children"], batch["total"], batch["truncated"], batch["more"]) == (
        [],
        12,
        True,
        12,
    )
    narrow = http.get(url, params={"width": 3}, headers=head).json()["children"][3]
    assert (len(narrow["children"]), narrow["more"]) == (3, 9)
    first = http.get(url, params={"limit": 3}, headers=head).json()
    assert _names(first) == ["parcel"] * 3
    assert first["truncated"] is True and first["more"] == 1 and first["next_cursor"]
    rest = http.get(url, params={"limit": 3, "cursor": first["next_cursor"]}, headers=head).json()
    assert _names(rest) == ["batch"] and rest["next_cursor"] is None
    assert rest["truncated"] is False
    seen = [c["run_id"] for c in first["children"] + rest["children"]]
    assert len(set(seen)) == 4


def test_the_tree_refuses_bad_bounds_and_unknown_runs(world: World, family: str) -> None:
    http, head = world.client(), _bearer(world.token("read"))
    url = f"/api/v1/runs/{family}/tree"
    for query in ({"depth": 0}, {"depth": 11}, {"width": "x"}, {"limit": 201}, {"cursor": "bad"}):
        answer = http.get(url, params=query, headers=head)
        assert answer.status_code == 400, query
        assert answer.json()["error"]["code"] == "invalid_input"
    assert http.get("/api/v1/runs/nope/tree", headers=head).status_code == 404
    assert http.get(url, headers=_bearer(world.token("signal"))).status_code == 403
    assert http.get(url, headers=_bearer(world.token("read", app="other"))).status_code == 403
    assert http.get(url).status_code == 401
    # A run with no children is a tree of one.
    alone = http.get(f"/api/v1/runs/{world.failed}/tree", headers=head).json()
    assert (alone["total"], alone["children"], alone["truncated"]) == (0, [], False)


def test_attempts_timers_and_result(world: World) -> None:
    http, head = world.client(), _bearer(world.token("read"))
    attempts = http.get(f"/api/v1/runs/{world.failed}/attempts", headers=head).json()
    assert [(a["step"], a["attempt"]) for a in attempts] == [("charge_card", 1), ("charge_card", 2)]
    assert "insufficient funds" in attempts[0]["message"]
    assert http.get(f"/api/v1/runs/{world.waiting}/timers", headers=head).json() == []

    done = http.get(f"/api/v1/runs/{world.hostile}/result", headers=head)
    assert done.status_code == 200
    assert done.json() == {
        "run_id": world.hostile,
        "state": "succeeded",
        "result": "<script>alert(1)</script>",
    }
    failed = http.get(f"/api/v1/runs/{world.failed}/result", headers=head)
    assert failed.status_code == 409
    body = failed.json()
    assert body["error"]["code"] == "run_failed"
    assert body["run"]["state"] == "failed" and body["run"]["error"]["step"] == "charge_card"
    pending = http.get(f"/api/v1/runs/{world.waiting}/result?timeout=0.05", headers=head)
    assert pending.status_code == 504 and pending.json()["error"]["code"] == "result_timeout"
    for bad in ("-1", "61", "soon"):
        answer = http.get(f"/api/v1/runs/{world.waiting}/result?timeout={bad}", headers=head)
        assert answer.status_code == 400, bad
    for tail in ("attempts", "timers", "result"):
        assert http.get(f"/api/v1/runs/nope/{tail}", headers=head).status_code == 404


def test_the_apps_waits_and_timers(world: World) -> None:
    http, head = world.client(), _bearer(world.token("read"))
    waits = http.get("/api/v1/waits", headers=head).json()
    assert [(w["run_id"], w["name"]) for w in waits["items"]] == [(world.waiting, "approve")]
    assert waits["more"] == 0
    assert http.get("/api/v1/timers", headers=head).json() == {"items": [], "more": 0}
    started = [world.app.start("approval", f"o-{n}").run_id for n in (20, 21)]
    settle(world.app, started)
    assert len(http.get("/api/v1/waits", headers=head).json()["items"]) == 3
    cut = http.get("/api/v1/waits?limit=2", headers=head).json()
    assert len(cut["items"]) == 2 and cut["more"] == 1
    for bad in ("0", "1001", "x"):
        assert http.get(f"/api/v1/waits?limit={bad}", headers=head).status_code == 400
    assert http.get("/api/v1/waits", headers=_bearer(world.token("signal"))).status_code == 403


def test_every_client_call_has_an_endpoint() -> None:
    handlers = {e.handler.__name__.strip("_") for e in api.ENDPOINTS}
    for call in (
        "start",
        "get",
        "runs",
        "signal",
        "send",
        "waits",
        "all_waits",
        "resume",
        "cancel",
        "resolve",
        "fork",
        "history",
        "journal",
        "children",
        "tree",
        "attempts",
        "timers",
        "all_timers",
        "result",
        "update",
        "query",
        "events",
        "event",
        "stream",
        "schedules",
        "schedule",
        "pause_schedule",
        "resume_schedule",
        "trigger_schedule",
    ):
        assert call in handlers, call
