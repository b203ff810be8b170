"""The console's pages: login, session cookie, anti-forgery field, escaping, actions."""

from __future__ import annotations

import re

from shop import World
from starlette.testclient import TestClient


def _logged_in(world: World, scope: str = "operate") -> TestClient:
    http = world.client()
    answer = http.post("/login", data={"token": world.token(scope)}, follow_redirects=False)
    assert answer.status_code == 303 and answer.headers["location"] == "/runs"
    cookie = answer.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict")
    return http


def _csrf(page: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
    assert found
    return found.group(1)


def test_home_redirects_to_runs_and_runs_need_a_login(world: World) -> None:
    http = world.client()
    assert http.get("/", follow_redirects=False).headers["location"] == "/runs"
    answer = http.get("/runs", follow_redirects=False)
    assert answer.status_code == 303 and answer.headers["location"].startswith("/login")
    assert 'name="token"' in http.get("/login").text


def test_a_bad_login_is_refused(world: World) -> None:
    answer = world.client().post("/login", data={"token": "pdt_x_y"})
    assert answer.status_code == 401 and "unauthorized" in answer.text
    assert "set-cookie" not in answer.headers


def test_bearer_header_works_on_pages(world: World) -> None:
    head = {"Authorization": f"Bearer {world.token('read')}"}
    page = world.client().get(f"/runs/{world.failed}", headers=head)
    assert page.status_code == 200 and "insufficient funds" in page.text


def test_runs_page_lists_filters_and_searches(world: World) -> None:
    http = _logged_in(world, "read")
    page = http.get("/runs").text
    for run_id in (world.failed, world.waiting, world.attention, world.hostile):
        assert f"/runs/{run_id}" in page
    failed = http.get("/runs?state=failed").text
    assert f"/runs/{world.failed}" in failed and f"/runs/{world.waiting}" not in failed
    by_key = http.get("/runs?q=order-2", follow_redirects=False)
    assert by_key.headers["location"] == f"/runs/{world.waiting}"
    by_id = http.get(f"/runs?q={world.failed}", follow_redirects=False)
    assert by_id.headers["location"] == f"/runs/{world.failed}"
    assert "No run of" in http.get("/runs?q=nothing-like-it").text


def test_runs_page_paginates_by_cursor(world: World) -> None:
    for i in range(55):
        world.app.start("hostile", f"n{i}")
    http = _logged_in(world, "read")
    first = http.get("/runs").text
    older = re.search(r'href="(/runs\?cursor=[^"]+)" rel="next"', first)
    assert older
    second = http.get(older.group(1).replace("&amp;", "&")).text
    ids_first = set(re.findall(r'href="/runs/([0-9a-f]{32})"', first))
    ids_second = set(re.findall(r'href="/runs/([0-9a-f]{32})"', second))
    assert len(ids_first) == 50 and len(ids_second) == 9 and not ids_first & ids_second


def test_output_is_escaped_everywhere(world: World) -> None:
    http = _logged_in(world, "read")
    page = http.get(f"/runs/{world.hostile}").text
    assert "<script>alert(1)</script>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    listing = http.get("/runs").text
    assert "<script>k</script>" not in listing and "&lt;script&gt;k&lt;/script&gt;" in listing


def test_run_page_shows_the_failing_step(world: World) -> None:
    http = _logged_in(world, "read")
    page = http.get(f"/runs/{world.failed}").text
    assert "charge_card" in page and "card declined for o-1: insufficient funds" in page
    assert "step_failed" in page and "Provenance ledger" in page
    waiting = http.get(f"/runs/{world.waiting}").text
    assert 'data-live="1"' in waiting and "approve" in waiting
    assert http.get("/runs/nope").status_code == 404


def test_an_action_without_the_anti_forgery_field_is_refused(world: World) -> None:
    http = _logged_in(world)
    answer = http.post(f"/runs/{world.waiting}/actions/cancel", data={})
    assert answer.status_code == 403
    forged = http.post(f"/runs/{world.waiting}/actions/cancel", data={"csrf": "0" * 64})
    assert forged.status_code == 403
    assert world.app.get(world.waiting).state == "waiting"


def test_actions_show_the_engines_answer(world: World) -> None:
    http = _logged_in(world)
    token = _csrf(http.get(f"/runs/{world.waiting}").text)
    signaled = http.post(
        f"/runs/{world.waiting}/actions/signal",
        data={"csrf": token, "name": "approve", "payload": '{"ok": true}', "signal_id": "s1"},
    )
    assert signaled.status_code == 200 and "signaled" in signaled.text
    refused = http.post(
        f"/runs/{world.waiting}/actions/signal",
        # The first wait, named exactly: settled, so refused (the bare name would
        # keep the signal for a second wait).
        data={"csrf": token, "name": "approve#1", "payload": "1", "signal_id": "s2"},
    )
    assert refused.status_code == 409 and "wait_settled" in refused.text
    bad_json = http.post(
        f"/runs/{world.attention}/actions/resolve",
        data={"csrf": token, "step": "ship", "outcome": "output", "output": "{nope"},
    )
    assert bad_json.status_code == 400 and "invalid_input" in bad_json.text
    assert world.app.get(world.attention).state == "needs_attention"
    failed = http.post(
        f"/runs/{world.attention}/actions/resolve",
        data={"csrf": token, "step": "ship", "outcome": "error", "error": "lost in transit"},
    )
    assert failed.status_code == 200
    info = world.app.get(world.attention)
    assert info.state == "failed" and info.error == {
        "code": "resolved_failed",
        "message": "lost in transit",
        "step": "ship",
    }
    forked = http.post(f"/runs/{world.failed}/actions/fork", data={"csrf": token})
    assert forked.status_code == 200 and "forked" in forked.text


def test_a_read_session_cannot_act(world: World) -> None:
    http = _logged_in(world, "read")
    token = _csrf(http.get(f"/runs/{world.waiting}").text)
    answer = http.post(f"/runs/{world.waiting}/actions/cancel", data={"csrf": token})
    assert answer.status_code == 403 and "forbidden" in answer.text
    assert world.app.get(world.waiting).state == "waiting"


def test_logout_ends_the_session(world: World) -> None:
    http = _logged_in(world, "read")
    assert http.get("/runs").status_code == 200
    http.post("/logout")
    assert http.get("/runs", follow_redirects=False).status_code == 303


def test_suspend_and_resume_from_the_run_page(world: World) -> None:
    http = _logged_in(world, "operate")
    page = http.get(f"/runs/{world.waiting}").text
    assert f"/runs/{world.waiting}/actions/suspend" in page
    suspended = http.post(f"/runs/{world.waiting}/actions/suspend", data={"csrf": _csrf(page)})
    assert suspended.status_code == 200, suspended.text
    assert world.app.get(world.waiting).state == "suspended"
    page = http.get(f"/runs/{world.waiting}").text
    assert f"/runs/{world.waiting}/actions/suspend" not in page
    resumed = http.post(f"/runs/{world.waiting}/actions/resume", data={"csrf": _csrf(page)})
    assert resumed.status_code == 200, resumed.text
    assert world.app.get(world.waiting).state == "waiting"
