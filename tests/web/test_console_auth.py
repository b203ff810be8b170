"""Who may do what: tokens by app and scope, revoked and expired tokens, no token.

Every refusal is checked twice: the status and code, and the store unchanged.
"""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest
from shop import World

from perdure.store import tokens
from perdure.web import api, auth


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _signal(world: World, head: dict[str, str]) -> tuple[int, str]:
    answer = world.client().post(
        f"/api/v1/runs/{world.waiting}/signals/approve", json={"payload": 1}, headers=head
    )
    return answer.status_code, answer.json()["error"]["code"] if answer.status_code >= 400 else ""


def _unchanged(world: World) -> None:
    assert world.app.get(world.waiting).state == "waiting"
    assert [w.name for w in world.app.waits(world.waiting)] == ["approve"]
    assert world.app.get(world.attention).state == "needs_attention"


def test_no_token_is_refused_and_changes_nothing(any_world: World) -> None:
    world = any_world
    http = world.client()
    assert http.get("/api/v1/runs").status_code == 401
    assert http.get("/api/v1/runs").headers["www-authenticate"] == "Bearer"
    assert http.get("/api/v1/runs").json()["error"]["code"] == "unauthorized"
    assert _signal(world, {}) == (401, "unauthorized")
    _unchanged(world)


@pytest.mark.parametrize(
    "header",
    ["Bearer ", "Basic abc", "Bearer pdt_nothing", "Bearer pdt_abc_def", "Bearer x" * 60],
)
def test_malformed_or_unknown_tokens_are_refused(world: World, header: str) -> None:
    assert _signal(world, {"Authorization": header}) == (401, "unauthorized")
    _unchanged(world)


def test_a_token_no_store_can_hold_is_refused_before_any_lookup(any_world: World) -> None:
    """A NUL in the id would make PostgreSQL refuse the lookup itself (a 500)."""
    world = any_world
    http = world.client()
    for forged in ("pdt_ab\x00cd_secret", "pdt_ABCD_secret", "pdt_abcd_sec ret"):
        answer = http.post("/login", data={"token": forged}, follow_redirects=False)
        assert answer.status_code in (401, 400, 200), answer.status_code
        assert answer.status_code != 500
        assert "not valid" in answer.text or "malformed" in answer.text
    _unchanged(world)


def test_a_wrong_secret_is_refused(world: World) -> None:
    token = world.token("operate")
    forged = token[:-4] + ("AAAA" if not token.endswith("AAAA") else "BBBB")
    assert _signal(world, _bearer(forged)) == (401, "unauthorized")
    _unchanged(world)


def test_a_token_of_another_app_never_sees_nor_touches_this_apps_runs(any_world: World) -> None:
    world = any_world
    other = _bearer(world.token("operate", app="another_app"))
    http = world.client()
    assert http.get("/api/v1/runs", headers=other).status_code == 403
    assert http.get(f"/api/v1/runs/{world.waiting}", headers=other).status_code == 403
    assert _signal(world, other) == (403, "forbidden")
    resolve = http.post(
        f"/api/v1/runs/{world.attention}/resolve",
        json={"step": "ship", "output": 1},
        headers=other,
    )
    assert resolve.status_code == 403
    _unchanged(world)


def test_runs_of_another_app_are_not_found_with_this_apps_token(world: World) -> None:
    stranger = world.app.client.__class__(world.store, "another_app")
    foreign = stranger.start("approval", "1", ["o"]).run_id
    http, head = world.client(), _bearer(world.token("operate"))
    assert http.get(f"/api/v1/runs/{foreign}", headers=head).status_code == 404
    assert http.post(f"/api/v1/runs/{foreign}/cancel", json={}, headers=head).status_code == 404
    assert world.store.get_run(foreign).state == "queued"  # type: ignore[union-attr]
    listed = http.get("/api/v1/runs", headers=head).json()["runs"]
    assert foreign not in {r["run_id"] for r in listed}


def test_a_read_token_reads_and_nothing_else(world: World) -> None:
    http, head = world.client(), _bearer(world.token("read"))
    assert http.get(f"/api/v1/runs/{world.waiting}/journal", headers=head).status_code == 200
    assert _signal(world, head) == (403, "forbidden")
    for tail, body in (
        ("cancel", {}),
        ("resolve", {"step": "ship", "output": 1}),
        ("fork", {}),
        ("resume", {}),
    ):
        run = world.attention if tail == "resolve" else world.waiting
        answer = http.post(f"/api/v1/runs/{run}/{tail}", json=body, headers=head)
        assert answer.status_code == 403, tail
    started = http.post("/api/v1/runs", json={"workflow": "approval", "args": ["x"]}, headers=head)
    assert started.status_code == 403
    assert len(world.app.runs()) == 4
    _unchanged(world)


def test_a_signal_token_only_signals_and_sends(world: World) -> None:
    http, head = world.client(), _bearer(world.token("signal"))
    assert http.get("/api/v1/runs", headers=head).status_code == 403
    assert http.get(f"/api/v1/runs/{world.waiting}", headers=head).status_code == 403
    cancel = http.post(f"/api/v1/runs/{world.waiting}/cancel", json={}, headers=head)
    assert cancel.status_code == 403
    _unchanged(world)
    sent = http.post(
        f"/api/v1/runs/{world.waiting}/channels/inbox", json={"key": "k"}, headers=head
    )
    assert sent.json() == {"stored": True}
    assert _signal(world, head) == (200, "")


def test_revoked_and_expired_tokens_are_refused(any_world: World) -> None:
    world = any_world
    revoked = world.token("operate")
    held = auth.token_store(world.store)
    assert _signal(world, _bearer(revoked)) == (200, "")  # usable until revoked
    # That signal settled the wait; the needs_attention run serves from here on.
    token_id = revoked.split("_")[1]
    held.revoke_token(token_id)
    http = world.client()
    url = f"/api/v1/runs/{world.attention}/resolve"
    body = {"step": "ship", "output": 1}
    answer = http.post(url, json=body, headers=_bearer(revoked))
    assert answer.status_code == 401 and "revoked" in answer.json()["error"]["message"]
    now = world.store.now()
    secret = "s" * 40
    held.create_token(tokens.NewToken("01d1", world.app.name, "operate", auth.digest(secret), now))
    expired = http.post(url, json=body, headers=_bearer(f"pdt_01d1_{secret}"))
    assert expired.status_code == 401 and "expired" in expired.json()["error"]["message"]
    assert world.app.get(world.attention).state == "needs_attention"


def test_an_open_console_serves_loopback_only_until_a_token_exists(world: World) -> None:
    http = world.client(open_local=True)
    assert http.get("/api/v1/runs").status_code == 200
    world.token("read")
    assert http.get("/api/v1/runs").status_code == 401
    closed = world.client(open_local=False)
    assert closed.get("/api/v1/runs").status_code == 401


def test_an_open_console_answers_only_requests_for_a_loopback_host(world: World) -> None:
    rebound = world.client(open_local=True, base_url="http://attacker.example:8025")
    assert rebound.get("/api/v1/runs").status_code == 401
    assert rebound.post(f"/api/v1/runs/{world.waiting}/cancel", json={}).status_code == 401
    assert world.app.get(world.waiting).state == "waiting"
    for host in ("http://localhost:8025", "http://[::1]:8025", "http://127.0.0.1"):
        assert world.client(open_local=True, base_url=host).get("/api/v1/runs").status_code == 200


def test_tokens_never_reach_the_logs(world: World, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    token = world.token("operate")
    secret = token.split("_", 2)[2]
    http = world.client()
    http.get("/api/v1/runs", headers=_bearer(token))
    http.get("/api/v1/runs", headers=_bearer(token + "x"))
    http.post("/login", data={"token": token})
    assert secret not in caplog.text
    stored = auth.token_store(world.store).get_token(token.split("_")[1])
    assert stored is not None and secret not in repr(stored) and stored.digest != secret


def test_scopes_grant_what_the_design_says() -> None:
    assert [auth.allows("read", n) for n in ("read", "signal", "operate")] == [True, False, False]
    assert [auth.allows("signal", n) for n in ("read", "signal", "operate")] == [False, True, False]
    assert [auth.allows("operate", n) for n in ("read", "signal", "operate")] == [True, True, True]
    assert not auth.allows("admin", "read")


def test_mint_refuses_bad_input(world: World) -> None:
    held = auth.token_store(world.store)
    now = world.store.now()
    for app, scope, life in (
        ("shop", "admin", None),
        ("", "read", None),
        ("shop", "read", timedelta(0)),
    ):
        with pytest.raises(ValueError):
            auth.mint(held, app, scope, life, now)
    assert held.list_tokens() == []


@pytest.mark.parametrize("endpoint", api.ENDPOINTS, ids=lambda e: f"{e.method} {e.path}")
def test_every_endpoint_needs_a_token(world: World, endpoint: api.Endpoint) -> None:
    path = (
        endpoint.path.replace("{run_id}", world.waiting)
        .replace("{name}", "approve")
        .replace("{channel}", "inbox")
    )
    before = [(r.run_id, r.state, r.updated_at) for r in world.app.runs()]
    answer = world.client().request(endpoint.method, "/api/v1" + path, json={"key": "k"})
    assert answer.status_code == 401
    assert answer.json()["error"]["code"] == "unauthorized"
    assert [(r.run_id, r.state, r.updated_at) for r in world.app.runs()] == before
    _unchanged(world)
