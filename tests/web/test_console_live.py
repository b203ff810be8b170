"""Live runs through the API and the console: updates, queries, events, streams, child trees."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from shop import World, start_family

from perdure import errors, reads
from perdure.web import api, pages
from perdure.web import app as web_app


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


# -- updates ------------------------------------------------------------------


def test_update_returns_the_runs_answer_once_per_update_id(
    any_world: World, any_family: str
) -> None:
    world, run_id = any_world, any_family
    http, head = world.client(), _bearer(world.token("operate"))
    url = f"/api/v1/runs/{run_id}/updates/add_item"
    first = http.post(url, json={"payload": {"qty": 1}, "update_id": "u-1"}, headers=head)
    assert first.status_code == 200, first.text
    assert first.json() == {
        "run_id": run_id,
        "name": "add_item",
        "update_id": "u-1",
        "response": {"count": 1},
    }
    again = http.post(url, json={"payload": {"qty": 9}, "update_id": "u-1"}, headers=head)
    assert again.json() == first.json()
    fresh = http.post(url, json={"payload": {"qty": 2}}, headers=head)
    assert fresh.status_code == 200 and fresh.json()["response"] == {"count": 2}
    assert len(fresh.json()["update_id"]) == 32
    assert world.app.client.result(run_id, timeout=20) == {"items": [{"qty": 1}, {"qty": 2}]}
    ended = http.post(url, json={"payload": {"qty": 3}, "update_id": "u-3"}, headers=head)
    assert ended.status_code == 409 and ended.json()["error"]["code"] == "run_finished"
    # An answered update_id keeps its answer after the run ended.
    assert http.post(url, json={"update_id": "u-1"}, headers=head).json() == first.json()


def test_update_refusals(world: World, family: str) -> None:
    http, head = world.client(), _bearer(world.token("operate"))
    url = f"/api/v1/runs/{family}/updates/add_item"
    rejected = http.post(url, json={"payload": {"qty": 0}, "update_id": "bad"}, headers=head)
    assert rejected.status_code == 400
    assert rejected.json()["error"]["code"] == "update_rejected"
    assert "qty must be positive" in rejected.json()["error"]["message"]
    assert world.app.client.store.get_update(family, "bad") is None  # type: ignore[attr-defined]
    for body in ({"timeout": -1}, {"timeout": 301}, {"timeout": "soon"}, {"update_id": 5}):
        answer = http.post(url, json={"payload": {"qty": 1}, **body}, headers=head)
        assert answer.status_code == 400, body
        assert answer.json()["error"]["code"] == "invalid_input"
    missing = http.post("/api/v1/runs/nope/updates/add_item", json={}, headers=head)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "run_not_found"
    # Nobody consumes "other": no answer in time, and the id to retry with.
    late = http.post(
        f"/api/v1/runs/{family}/updates/other",
        json={"update_id": "o-1", "timeout": 0},
        headers=head,
    )
    assert late.status_code == 504
    assert late.json()["error"]["code"] == "update_timeout" and late.json()["update_id"] == "o-1"
    finished = http.post(
        f"/api/v1/runs/{world.failed}/updates/add_item", json={"payload": {"qty": 1}}, headers=head
    )
    assert finished.status_code == 409 and finished.json()["error"]["code"] == "run_finished"
    world.app.cancel(family)
    abandoned = http.post(
        f"/api/v1/runs/{family}/updates/other", json={"update_id": "o-1"}, headers=head
    )
    assert abandoned.status_code == 409
    assert abandoned.json()["error"]["code"] == "update_abandoned"
    assert abandoned.json()["update_id"] == "o-1"


def test_update_needs_the_operate_scope(world: World, family: str) -> None:
    http = world.client()
    url = f"/api/v1/runs/{family}/updates/add_item"
    for scope in ("read", "signal"):
        refused = http.post(url, json={"payload": {"qty": 1}}, headers=_bearer(world.token(scope)))
        assert refused.status_code == 403 and refused.json()["error"]["code"] == "forbidden"
    assert http.post(url, json={"payload": {"qty": 1}}).status_code == 401
    assert world.app.client.store.list_updates(family) == []  # type: ignore[attr-defined]


def test_update_without_code_runs_no_validator(world: World, family: str) -> None:
    bare = web_app.create_app(world.app.client)
    from starlette.testclient import TestClient

    http = TestClient(bare, base_url="http://127.0.0.1:8025")
    answer = http.post(
        f"/api/v1/runs/{family}/updates/add_item",
        json={"payload": {"qty": 5}},
        headers=_bearer(world.token("operate")),
    )
    assert answer.status_code == 200 and answer.json()["response"] == {"count": 1}
    query = http.get(
        f"/api/v1/runs/{family}/queries/item_count", headers=_bearer(world.token("read"))
    )
    assert query.status_code == 400 and "MODULE:APP" in query.json()["error"]["message"]


# -- queries, events, streams ---------------------------------------------------------


def test_query_answers_from_the_journal(world: World, family: str) -> None:
    http, head = world.client(), _bearer(world.token("read"))
    url = f"/api/v1/runs/{family}/queries/item_count"
    assert http.get(url, headers=head).json() == {
        "run_id": family,
        "query": "item_count",
        "answer": 0,
    }
    world.app.update(family, "add_item", {"qty": 1}, timeout=20)
    assert http.get(url, headers=head).json()["answer"] == 1
    unknown = http.get(f"/api/v1/runs/{family}/queries/nothing", headers=head)
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "unknown_query"
    assert "item_count" in unknown.json()["error"]["message"]
    broken = http.get(f"/api/v1/runs/{family}/queries/broken", headers=head)
    assert broken.status_code == 500 and broken.json()["error"]["code"] == "query_failed"
    assert http.get("/api/v1/runs/nope/queries/item_count", headers=head).status_code == 404
    refused = http.get(url, headers=_bearer(world.token("signal")))
    assert refused.status_code == 403


def test_events_all_and_one(any_world: World, any_family: str) -> None:
    world, run_id = any_world, any_family
    http, head = world.client(), _bearer(world.token("read"))
    assert http.get(f"/api/v1/runs/{run_id}/events", headers=head).json() == {
        "status": "<script>open</script>"
    }
    one = http.get(f"/api/v1/runs/{run_id}/events/status", headers=head)
    assert one.json() == {"key": "status", "value": "<script>open</script>"}
    missing = http.get(f"/api/v1/runs/{run_id}/events/count", headers=head)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "run_event_missing"
    world.app.update(run_id, "add_item", {"qty": 1}, timeout=20)
    waited = http.get(f"/api/v1/runs/{run_id}/events/count?timeout=10", headers=head)
    assert waited.json() == {"key": "count", "value": 1}
    for bad in ("timeout=-1", "timeout=61", "timeout=soon"):
        answer = http.get(f"/api/v1/runs/{run_id}/events/count?{bad}", headers=head)
        assert answer.status_code == 400, bad
    assert http.get("/api/v1/runs/nope/events", headers=head).status_code == 404
    assert http.get("/api/v1/runs/nope/events/status", headers=head).status_code == 404
    for url in (f"/api/v1/runs/{run_id}/events", f"/api/v1/runs/{run_id}/events/status"):
        assert http.get(url, headers=_bearer(world.token("signal"))).status_code == 403
        assert http.get(url).status_code == 401


def test_streams_read_from_an_offset(any_world: World, any_family: str) -> None:
    world, run_id = any_world, any_family
    http, head = world.client(), _bearer(world.token("read"))
    url = f"/api/v1/runs/{run_id}/streams/progress"
    whole = http.get(url, headers=head).json()
    assert whole == {
        "key": "progress",
        "items": [{"packed": 0}, {"packed": 1}, {"packed": 2}],
        "after": 0,
        "next_after": 3,
        "total": 3,
        "closed": False,
        "run_ended": False,
    }
    part = http.get(url + "?after=1&limit=1", headers=head).json()
    assert (part["items"], part["next_after"]) == ([{"packed": 1}], 2)
    assert http.get(url + "?after=3", headers=head).json()["items"] == []
    empty = http.get(f"/api/v1/runs/{run_id}/streams/nothing", headers=head).json()
    assert (empty["items"], empty["total"], empty["closed"]) == ([], 0, False)
    for bad in ("after=-1", "limit=0", "limit=1001", "after=x"):
        assert http.get(f"{url}?{bad}", headers=head).status_code == 400, bad
    assert http.get("/api/v1/runs/nope/streams/progress", headers=head).status_code == 404
    assert http.get(url, headers=_bearer(world.token("signal"))).status_code == 403
    assert http.get(url).status_code == 401
    world.app.update(run_id, "add_item", {"qty": 1}, timeout=20)
    world.app.update(run_id, "add_item", {"qty": 2}, timeout=20)
    world.app.client.result(run_id, timeout=20)
    done = http.get(url + "?after=3", headers=head).json()
    assert (done["items"], done["closed"], done["run_ended"]) == ([], True, True)


def test_the_openapi_document_has_the_live_calls(world: World) -> None:
    document = world.client().get("/api/v1/openapi.json").json()
    paths = document["paths"]
    assert paths["/runs/{run_id}/updates/{name}"]["post"]["x-scope"] == "operate"
    assert "504" in paths["/runs/{run_id}/updates/{name}"]["post"]["responses"]
    for path in (
        "/runs/{run_id}/queries/{name}",
        "/runs/{run_id}/events",
        "/runs/{run_id}/events/{key}",
        "/runs/{run_id}/streams/{key}",
    ):
        assert paths[path]["get"]["x-scope"] == "read", path
    stream = paths["/runs/{run_id}/streams/{key}"]["get"]["parameters"]
    assert {p["name"] for p in stream} == {"run_id", "key", "after", "limit"}
    runs = {p["name"] for p in paths["/runs"]["get"]["parameters"]}
    assert {"created_after", "created_before", "state", "workflow", "cursor"} <= runs
    assert {(e.method, e.path) for e in api.ENDPOINTS} >= {
        ("POST", "/runs/{run_id}/updates/{name}"),
        ("GET", "/runs/{run_id}/streams/{key}"),
    }


# -- the run page ----------------------------------------------------------------------


def test_run_page_shows_the_tree_events_streams_and_updates(
    any_world: World, any_family: str
) -> None:
    world, family = any_world, any_family
    http, head = world.client(), _bearer(world.token("read"))
    page = http.get(f"/runs/{family}", headers=head).text
    batch = world.app.client.store.page_children(family, limit=10)[-1]  # type: ignore[attr-defined]
    assert batch.workflow == "batch"
    grandchildren = world.app.client.store.page_children(batch.run_id, limit=20)  # type: ignore[attr-defined]
    assert len(grandchildren) == 12
    # Children, then the batch's first ten children, then a link to the rest.
    for child in world.app.client.store.page_children(family):  # type: ignore[attr-defined]
        assert f'href="/runs/{child.run_id}"' in page
    shown = [g for g in grandchildren if f'href="/runs/{g.run_id}"' in page]
    assert shown == grandchildren[:10]
    assert f'href="/runs/{batch.run_id}#children">and 2 more' in page
    assert 'Child runs <span class="muted">(4)</span>' in page
    # The event and the stream, escaped.
    assert "<script>open</script>" not in page
    assert "&lt;script&gt;open&lt;/script&gt;" in page
    assert 'data-stream="progress"' in page and "3 items" in page
    assert "<h2>Updates</h2>" not in page  # none yet
    world.app.update(family, "add_item", {"qty": 1}, update_id="u-page", timeout=20)
    with pytest.raises(errors.UpdateTimedOut):
        world.app.update(family, "other", {"note": "<b>x</b>"}, update_id="o-page", timeout=0)
    page = http.get(f"/runs/{family}", headers=head).text
    assert "<h2>Updates</h2>" in page
    assert re.search(r'class="update answered">.*?u-page.*?&#34;count&#34;: 1', page, re.S)
    assert re.search(r'class="update pending">.*?o-page.*?waiting for the run', page, re.S)
    assert "<b>x</b>" not in page
    world.app.cancel(family)
    page = http.get(f"/runs/{family}", headers=head).text
    assert re.search(r'class="update abandoned">.*?o-page.*?without answering', page, re.S)


def test_a_run_page_without_live_parts_shows_none(world: World) -> None:
    page = world.client().get(f"/runs/{world.failed}", headers=_bearer(world.token("read"))).text
    assert 'id="live"' not in page and 'id="children"' not in page
    assert "No child runs." in page


def test_the_tree_pages_a_runs_many_children(world: World) -> None:
    run_id = start_family(world.app, parcels=60)
    http, head = world.client(), _bearer(world.token("read"))
    first = http.get(f"/runs/{run_id}", headers=head).text
    children = world.app.client.store.page_children(run_id, limit=100)  # type: ignore[attr-defined]
    assert len(children) == 61
    on_first = [c for c in children if f'href="/runs/{c.run_id}"' in first]
    assert on_first == children[:50]
    more = re.search(
        r'href="(/runs/[0-9a-f]+\?children=[^"#]+)#children" rel="next">and 11 more', first
    )
    assert more, "no link to the next children"
    second = http.get(more.group(1).replace("&amp;", "&"), headers=head).text
    on_second = [c for c in children if f'data-run="{c.run_id}"' in second]
    assert on_second == children[50:]
    assert "« first children" in second
    bad = http.get(f"/runs/{run_id}?children=nope", headers=head)
    assert bad.status_code == 400


def test_the_tree_is_cut_to_its_bounds(world: World, family: str) -> None:
    tree = reads.Reads(world.app.client).tree(family, page=2, width=1, depth=2, budget=3)
    assert tree.total == 4 and len(tree.nodes) == 2 and tree.next_cursor and tree.more == 2
    assert len(tree.nodes) + sum(len(n.children) for n in tree.nodes) <= 3
    shallow = reads.Reads(world.app.client).tree(family, depth=1)
    batch = [n for n in shallow.nodes if n.run.workflow == "batch"]
    assert batch and batch[0].children == [] and batch[0].total == 12 and batch[0].more == 12


# -- the time window -------------------------------------------------------------------


def test_runs_filter_by_creation_time(any_world: World) -> None:
    world = any_world
    http, head = world.client(), _bearer(world.token("read"))
    every = http.get("/api/v1/runs", headers=head).json()["runs"]
    assert len(every) == 4
    recent = http.get("/api/v1/runs?created_after=1h", headers=head).json()["runs"]
    assert [r["run_id"] for r in recent] == [r["run_id"] for r in every]
    assert http.get("/api/v1/runs?created_before=1h", headers=head).json()["runs"] == []
    newest = datetime.fromisoformat(every[0]["created_at"])
    oldest = datetime.fromisoformat(every[-1]["created_at"])
    window = {"created_after": oldest.isoformat(), "created_before": newest.isoformat()}
    inside = http.get("/api/v1/runs", params=window, headers=head).json()["runs"]
    assert {r["run_id"] for r in inside} == {
        r["run_id"] for r in every if oldest < datetime.fromisoformat(r["created_at"]) < newest
    }
    # With a state, a workflow and a cursor.
    waiting = http.get("/api/v1/runs?created_after=7d&state=waiting", headers=head).json()
    assert [r["run_id"] for r in waiting["runs"]] == [world.waiting]
    by_wf = http.get("/api/v1/runs?created_after=2w&workflow=checkout", headers=head).json()
    assert [r["run_id"] for r in by_wf["runs"]] == [world.failed]
    later = (newest + timedelta(days=1)).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    seen, cursor = [], None
    while True:
        query = {"created_before": later, "created_after": "1d", "limit": 3}
        answer = http.get(
            "/api/v1/runs", params={**query, **({"cursor": cursor} if cursor else {})}, headers=head
        ).json()
        seen += [r["run_id"] for r in answer["runs"]]
        cursor = answer["next_cursor"]
        if cursor is None:
            break
    assert seen == [r["run_id"] for r in every]


def test_runs_refuse_a_bad_time(world: World) -> None:
    http, head = world.client(), _bearer(world.token("read"))
    for query, word in (
        ("created_after=yesterday", "created_after"),
        ("created_before=12x", "created_before"),
        ("created_after=2026-13-45", "created_after"),
        ("created_after=99999999999d", "created_after"),
    ):
        answer = http.get(f"/api/v1/runs?{query}", headers=head)
        assert answer.status_code == 400, query
        assert answer.json()["error"]["code"] == "invalid_input"
        assert word in answer.json()["error"]["message"]
    page = http.get("/runs?created_after=%3Cscript%3Eyesterday", headers=head)
    assert page.status_code == 400
    assert "created_after must be an ISO-8601 instant" in page.text
    assert 'value="&lt;script&gt;yesterday"' in page.text and "<script>yesterday" not in page.text


def test_runs_page_filters_by_creation_time(world: World) -> None:
    http, head = world.client(), _bearer(world.token("read"))
    page = http.get("/runs?created_after=1h&state=failed", headers=head).text
    assert f"/runs/{world.failed}" in page and f"/runs/{world.waiting}" not in page
    none = http.get("/runs?created_before=1h", headers=head).text
    assert "match these filters" in none


def test_parse_instant_forms() -> None:
    now = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
    assert reads.parse_instant("t", "90m", now) == now - timedelta(minutes=90)
    assert reads.parse_instant("t", "2w", now) == now - timedelta(weeks=2)
    assert reads.parse_instant("t", "2026-11-30", now) == datetime(2026, 11, 30, tzinfo=UTC)
    assert reads.parse_instant("t", "2026-11-30T10:00:00Z", now) == datetime(
        2026, 11, 30, 10, tzinfo=UTC
    )
    offset = reads.parse_instant("t", "2026-11-30T10:00:00+02:00", now)
    assert offset == datetime(2026, 11, 30, 8, tzinfo=UTC)
    for bad in ("", "1y", "-1h", "now", "x" * 50):
        with pytest.raises(errors.InvalidInput):
            reads.parse_instant("t", bad, now)


def test_the_update_form_sends_an_update_and_shows_the_answer(
    world: World, family: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pages, "UPDATE_WAIT", 0.2)
    http = world.client()
    answer = http.post("/login", data={"token": world.token("operate")}, follow_redirects=False)
    assert answer.status_code == 303
    page = http.get(f"/runs/{family}").text
    assert re.search(r'actions/update".*?name="name" required value="add_item"', page, re.S)
    csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
    assert csrf
    form = {"csrf": csrf.group(1), "name": "add_item", "payload": '{"qty": 4}', "update_id": "f-1"}
    done = http.post(f"/runs/{family}/actions/update", data=form)
    assert done.status_code == 200 and "&#34;count&#34;: 1" in done.text
    assert 'data-answer="ok"' in done.text
    rejected = http.post(
        f"/runs/{family}/actions/update", data={**form, "payload": '{"qty": 0}', "update_id": "f-2"}
    )
    assert rejected.status_code == 400 and "update_rejected" in rejected.text
    late = http.post(
        f"/runs/{family}/actions/update",
        data={**form, "name": "other", "update_id": "f-3"},
    )
    # Nobody consumes "other": the page names the update id to send again.
    assert late.status_code == 504 and "update_timeout" in late.text and "f-3" in late.text
    read_only = world.client()
    read_only.post("/login", data={"token": world.token("read")})
    token = re.search(r'name="csrf" value="([0-9a-f]+)"', read_only.get(f"/runs/{family}").text)
    assert token
    refused = read_only.post(
        f"/runs/{family}/actions/update", data={**form, "csrf": token.group(1), "update_id": "f-4"}
    )
    assert refused.status_code == 403
    stored = world.app.client.store.list_updates(family)  # type: ignore[attr-defined]
    assert sorted(u.update_id for u in stored) == ["f-1", "f-3"]
