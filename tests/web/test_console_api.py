"""The HTTP API under /api/v1: every endpoint, its answers and its refusals."""

from __future__ import annotations

import time
from typing import Any

from shop import World

from perdure.web import api


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _until(world: World, run_id: str, state: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while world.app.get(run_id).state != state:
        assert time.monotonic() < deadline, f"{run_id} is {world.app.get(run_id).state}"
        time.sleep(0.02)


def test_runs_are_listed_by_pages_that_walk_every_run_once(any_world: World) -> None:
    world = any_world
    http, head = world.client(), _bearer(world.token("read"))
    for i in range(5):
        world.app.start("hostile", f"n{i}")
    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        query: dict[str, Any] = {"limit": 3, **({"cursor": cursor} if cursor else {})}
        answer = http.get("/api/v1/runs", params=query, headers=head)
        assert answer.status_code == 200
        body = answer.json()
        seen += [r["run_id"] for r in body["runs"]]
        pages += 1
        cursor = body["next_cursor"]
        if cursor is None:
            break
    assert pages == 3
    assert len(seen) == len(set(seen)) == 9
    stored = [r.run_id for r in world.app.runs(limit=100)]
    assert seen == stored


def test_runs_filter_by_state_and_workflow(world: World) -> None:
    http, head = world.client(), _bearer(world.token("read"))
    failed = http.get("/api/v1/runs?state=failed", headers=head).json()
    assert [r["run_id"] for r in failed["runs"]] == [world.failed]
    assert failed["runs"][0]["error"]["step"] == "charge_card"
    fulfil = http.get("/api/v1/runs?workflow=fulfil", headers=head).json()
    assert [r["run_id"] for r in fulfil["runs"]] == [world.attention]
    assert http.get("/api/v1/runs?workflow=nothing", headers=head).json() == {
        "runs": [],
        "next_cursor": None,
    }


def test_runs_refuse_bad_queries(world: World) -> None:
    http, head = world.client(), _bearer(world.token("read"))
    for query, word in (
        ("state=sleeping", "state"),
        ("cursor=not-a-cursor", "cursor"),
        ("limit=0", "limit"),
        ("limit=ten", "limit"),
    ):
        answer = http.get(f"/api/v1/runs?{query}", headers=head)
        assert answer.status_code == 400, query
        assert answer.json()["error"]["code"] == "invalid_input"
        assert word in answer.json()["error"]["message"]


def test_get_a_run_and_refuse_an_unknown_one(any_world: World) -> None:
    world = any_world
    http, head = world.client(), _bearer(world.token("read"))
    info = http.get(f"/api/v1/runs/{world.waiting}", headers=head).json()
    assert (info["run_id"], info["state"], info["workflow"], info["key"]) == (
        world.waiting,
        "waiting",
        "approval",
        "order-2",
    )
    missing = http.get("/api/v1/runs/nope", headers=head)
    assert missing.status_code == 404
    assert missing.json() == {
        "error": {"code": "run_not_found", "message": missing.json()["error"]["message"]}
    }


def test_start_a_run_idempotently_by_key(world: World) -> None:
    http, head = world.client(), _bearer(world.token("operate"))
    body = {"workflow": "approval", "args": ["o-9"], "key": "order-9"}
    first = http.post("/api/v1/runs", json=body, headers=head)
    assert first.status_code == 201 and first.json()["created"] is True
    again = http.post("/api/v1/runs", json=body, headers=head)
    assert again.json() == {"run_id": first.json()["run_id"], "created": False}
    conflict = http.post("/api/v1/runs", json={**body, "args": ["other"]}, headers=head)
    assert conflict.status_code == 409 and conflict.json()["error"]["code"] == "key_conflict"
    unknown = http.post("/api/v1/runs", json={"workflow": "nothing"}, headers=head)
    assert unknown.status_code == 404
    assert unknown.json()["error"]["code"] == "workflow_not_found"
    bad = http.post("/api/v1/runs", json={"workflow": "approval", "args": [1, 2]}, headers=head)
    assert bad.status_code == 400
    assert world.app.get(first.json()["run_id"]).workflow == "approval"


def test_writes_take_json_only(world: World) -> None:
    http, head = world.client(), _bearer(world.token("operate"))
    before = len(world.app.runs())
    form = http.post("/api/v1/runs", data={"workflow": "approval"}, headers=head)
    assert form.status_code == 400 and "application/json" in form.json()["error"]["message"]
    broken = http.post(
        "/api/v1/runs", content=b"{nope", headers={**head, "Content-Type": "application/json"}
    )
    assert broken.status_code == 400
    listed = http.post("/api/v1/runs", json=[1], headers=head)
    assert listed.status_code == 400
    assert len(world.app.runs()) == before


def test_signal_is_idempotent_by_signal_id_and_a_refusal_carries_the_receipt(
    any_world: World,
) -> None:
    world = any_world
    http, head = world.client(), _bearer(world.token("signal"))
    url = f"/api/v1/runs/{world.waiting}/signals/approve"
    first = http.post(url, json={"payload": True, "signal_id": "pay-1"}, headers=head)
    assert first.status_code == 200
    receipt = first.json()
    assert (receipt["outcome"], receipt["signal_id"]) == ("signaled", "pay-1")
    again = http.post(url, json={"payload": True, "signal_id": "pay-1"}, headers=head)
    assert again.status_code == 200 and again.json() == receipt
    # Naming the first wait itself ("approve#1", URL-encoded): it is settled.
    other = http.post(f"{url}%231", json={"payload": False, "signal_id": "pay-2"}, headers=head)
    assert other.status_code == 409
    assert other.json()["error"]["code"] == "wait_settled"
    assert other.json()["receipt"] == receipt
    _until(world, world.waiting, "succeeded")
    assert world.app.get(world.waiting).result == {"approved": True}
    bad_name = http.post(f"/api/v1/runs/{world.waiting}/signals/child:x", json={}, headers=head)
    assert bad_name.status_code in (400, 409)


def test_signal_refusals(world: World) -> None:
    http, head = world.client(), _bearer(world.token("operate"))
    missing = http.post("/api/v1/runs/nope/signals/approve", json={}, headers=head)
    assert missing.status_code == 404
    ended = http.post(f"/api/v1/runs/{world.failed}/signals/approve", json={}, headers=head)
    assert ended.status_code == 409 and ended.json()["error"]["code"] == "run_finished"
    bad = http.post(
        f"/api/v1/runs/{world.waiting}/signals/approve", json={"signal_id": 7}, headers=head
    )
    assert bad.status_code == 400
    assert world.app.get(world.waiting).state == "waiting"


def test_send_a_channel_message_once_per_key(world: World) -> None:
    http, head = world.client(), _bearer(world.token("signal"))
    url = f"/api/v1/runs/{world.waiting}/channels/events"
    assert http.post(url, json={"key": "e1", "payload": 1}, headers=head).json() == {"stored": True}
    assert http.post(url, json={"key": "e1", "payload": 2}, headers=head).json() == {
        "stored": False
    }
    missing_key = http.post(url, json={"payload": 1}, headers=head)
    assert missing_key.status_code == 400
    ended = http.post(
        f"/api/v1/runs/{world.failed}/channels/events", json={"key": "e"}, headers=head
    )
    assert ended.status_code == 409


def test_cancel_then_cancel_again(world: World) -> None:
    http, head = world.client(), _bearer(world.token("operate"))
    done = http.post(f"/api/v1/runs/{world.waiting}/cancel", json={}, headers=head)
    assert done.status_code == 200
    assert done.json()["canceled"] is True and done.json()["run"]["state"] == "canceled"
    again = http.post(
        f"/api/v1/runs/{world.waiting}/cancel", headers=head | {"Content-Type": "application/json"}
    )
    assert again.status_code == 409 and again.json()["error"]["code"] == "not_canceled"
    assert world.app.get(world.waiting).state == "canceled"


def test_resume_refuses_a_run_with_an_open_wait(world: World) -> None:
    http, head = world.client(), _bearer(world.token("operate"))
    still = http.post(f"/api/v1/runs/{world.waiting}/resume", json={}, headers=head)
    assert still.status_code == 409 and still.json()["error"]["code"] == "wait_still_open"
    ended = http.post(f"/api/v1/runs/{world.failed}/resume", json={}, headers=head)
    assert ended.status_code == 409 and ended.json()["error"]["code"] == "run_finished"
    assert world.app.get(world.waiting).state == "waiting"


def test_resolve_an_ambiguous_step(world: World) -> None:
    http, head = world.client(), _bearer(world.token("operate"))
    url = f"/api/v1/runs/{world.attention}/resolve"
    wrong = http.post(url, json={"step": "reserve", "output": "x"}, headers=head)
    assert wrong.status_code == 409 and wrong.json()["error"]["code"] == "not_resolvable"
    both = http.post(url, json={"step": "ship", "output": "x", "error": "y"}, headers=head)
    assert both.status_code == 400
    neither = http.post(url, json={"step": "ship"}, headers=head)
    assert neither.status_code == 400
    assert world.app.get(world.attention).state == "needs_attention"
    done = http.post(url, json={"step": "ship", "output": "parcel-42"}, headers=head)
    assert done.status_code == 200 and done.json()["state"] == "queued"
    _until(world, world.attention, "succeeded")
    assert world.app.get(world.attention).result == "parcel-42"


def test_fork_a_failed_run_and_refuse_a_live_one(world: World) -> None:
    http, head = world.client(), _bearer(world.token("operate"))
    forked = http.post(f"/api/v1/runs/{world.failed}/fork", json={}, headers=head)
    assert forked.status_code == 201
    new_id = forked.json()["run_id"]
    assert new_id != world.failed and world.app.get(new_id).workflow == "checkout"
    live = http.post(f"/api/v1/runs/{world.waiting}/fork", json={}, headers=head)
    assert live.status_code == 409 and live.json()["error"]["code"] == "run_not_finished"
    unknown = http.post(
        f"/api/v1/runs/{world.failed}/fork", json={"from_step": "nothing"}, headers=head
    )
    assert unknown.status_code == 400


def test_history_journal_waits_children(any_world: World) -> None:
    world = any_world
    http, head = world.client(), _bearer(world.token("read"))
    journal = http.get(f"/api/v1/runs/{world.failed}/journal", headers=head).json()
    assert [(e["name"], e["status"]) for e in journal] == [
        ("reserve", "ok"),
        ("charge_card", "error"),
    ]
    assert journal[0]["output"] == {"order": "o-1", "cents": 1200}
    assert "insufficient funds" in journal[1]["error"]["message"]
    assert journal[1]["attempt"] == 2
    history = http.get(f"/api/v1/runs/{world.failed}/history", headers=head).json()
    assert history[0]["sequence"] == 1 and history[-1]["kind"] == "finished"
    waits = http.get(f"/api/v1/runs/{world.waiting}/waits", headers=head).json()
    assert [(w["name"], w["kind"]) for w in waits] == [("approve", "signal")]
    assert waits[0]["deadline"] is not None
    assert http.get(f"/api/v1/runs/{world.waiting}/children", headers=head).json() == {}
    for tail in ("journal", "history", "waits", "children"):
        assert http.get(f"/api/v1/runs/nope/{tail}", headers=head).status_code == 404


def test_the_openapi_document_lists_every_endpoint(world: World) -> None:
    document = world.client().get("/api/v1/openapi.json").json()
    assert document["openapi"].startswith("3.")
    listed = {(m.upper(), p) for p, ops in document["paths"].items() for m in ops}
    assert listed == {(e.method, e.path) for e in api.ENDPOINTS}
    signal = document["paths"]["/runs/{run_id}/signals/{name}"]["post"]
    assert signal["x-scope"] == "signal" and "409" in signal["responses"]


def test_suspend_and_resume_a_waiting_run(world: World) -> None:
    http, head = world.client(), _bearer(world.token("operate"))
    url = f"/api/v1/runs/{world.waiting}"
    first = http.post(f"{url}/suspend", json={}, headers=head)
    assert first.status_code == 200, first.text
    assert first.json()["suspended"] is True and first.json()["run"]["state"] == "suspended"
    again = http.post(f"{url}/suspend", json={}, headers=head).json()
    assert again["suspended"] is False
    listed = http.get("/api/v1/runs?state=suspended", headers=head).json()["runs"]
    assert [r["run_id"] for r in listed] == [world.waiting]
    resumed = http.post(f"{url}/resume", json={}, headers=head).json()
    assert resumed["resumed"] is True and resumed["run"]["state"] == "waiting"
    ended = http.post(f"/api/v1/runs/{world.failed}/suspend", json={}, headers=head)
    assert ended.status_code == 409 and ended.json()["error"]["code"] == "run_finished"
    read = _bearer(world.token("read"))
    assert http.post(f"{url}/suspend", json={}, headers=read).status_code == 403


def test_start_with_a_deadline(world: World) -> None:
    http, head = world.client(), _bearer(world.token("operate"))
    body = {"workflow": "approval", "args": ["dl"], "deadline": 60}
    started = http.post("/api/v1/runs", json=body, headers=head)
    assert started.status_code == 201, started.text
    info = http.get(f"/api/v1/runs/{started.json()['run_id']}", headers=head).json()
    assert info["deadline"] is not None
    bad = http.post("/api/v1/runs", json={**body, "deadline": -1}, headers=head)
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_input"
