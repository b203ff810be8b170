"""Schedules in the HTTP API and on the console's schedules page, on a fake clock."""

from __future__ import annotations

import contextlib
import re
from datetime import timedelta
from typing import Any

from timetable import START, Timetable, served

from perdure import schedules
from perdure.store import scheduleport


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _iso(hours: float) -> str:
    return (START + timedelta(hours=hours)).isoformat()


def test_list_the_schedules_with_their_ticks(any_timetable: Timetable) -> None:
    t = any_timetable
    http, head = t.client(), _bearer(t.token("read"))
    answer = http.get("/api/v1/schedules", headers=head)
    assert answer.status_code == 200
    listed = answer.json()
    assert [s["name"] for s in listed] == ["cleanup_eu", "morning_report"]
    cleanup, morning = listed
    assert {k: cleanup[k] for k in ("workflow", "cron", "tz", "catch_up", "paused")} == {
        "workflow": "cleanup",
        "cron": "15 * * * *",
        "tz": "UTC",
        "catch_up": "latest",
        "paused": False,
    }
    # Two hours on the fake clock: ticks at 00:15 and 01:15, the next at 02:15.
    assert (cleanup["last_tick"], cleanup["next_tick"]) == (_iso(1.25), _iso(2.25))
    [last] = [r for r in t.runs_of("cleanup_eu") if r.run_id == cleanup["last_run_id"]]
    assert last.state == "succeeded" and last.result == "eu:30"
    # 06:00 in Berlin is 05:00 UTC in winter; it has not ticked yet.
    assert (morning["tz"], morning["last_tick"], morning["last_run_id"]) == (
        "Europe/Berlin",
        None,
        None,
    )
    assert morning["next_tick"] == _iso(5)
    one = http.get("/api/v1/schedules/morning_report", headers=head)
    assert one.status_code == 200 and one.json() == morning


def test_pause_resume_and_trigger(any_timetable: Timetable) -> None:
    t = any_timetable
    http, head = t.client(), _bearer(t.token("operate"))
    paused = http.post("/api/v1/schedules/cleanup_eu/pause", json={}, headers=head)
    assert paused.status_code == 200
    assert paused.json()["paused"] is True and paused.json()["next_tick"] is None
    assert t.paused("cleanup_eu")
    before = len(t.runs_of("cleanup_eu"))
    t.env.advance(timedelta(hours=2))
    assert len(t.runs_of("cleanup_eu")) == before  # no tick while paused
    # Pausing twice is no error: the schedule stays paused.
    again = http.post("/api/v1/schedules/cleanup_eu/pause", json={}, headers=head)
    assert again.status_code == 200 and again.json()["paused"] is True

    triggered = [
        http.post("/api/v1/schedules/cleanup_eu/trigger", json={}, headers=head) for _ in range(2)
    ]
    assert [r.status_code for r in triggered] == [201, 201]
    bodies = [r.json() for r in triggered]
    assert bodies[0]["run_id"] != bodies[1]["run_id"]
    for body in bodies:
        assert body["schedule"] == "cleanup_eu"
        assert body["run"]["run_id"] == body["run_id"]
        assert body["run"]["workflow"] == "cleanup" and body["run"]["state"] == "queued"
        assert body["run"]["key"].startswith("schedule:cleanup_eu:")
    t.env.run_until_idle()
    assert {t.app.get(b["run_id"]).result for b in bodies} == {"eu:30"}

    resumed = http.post("/api/v1/schedules/cleanup_eu/resume", json={}, headers=head)
    assert resumed.status_code == 200 and resumed.json()["paused"] is False
    assert resumed.json()["next_tick"] == _iso(4.25)
    assert not t.paused("cleanup_eu")


def test_a_schedule_declared_but_not_stored_yet(sqlite_url: str) -> None:
    # No time passes and nothing runs: no worker has stored the schedules.
    with contextlib.contextmanager(served)(sqlite_url, advance=None) as t:
        # With the code, the declared schedules are listed; pausing one stores it.
        http, head = t.client(), _bearer(t.token("operate"))
        assert schedules.listing(t.app.store, t.app.name) == []
        listed = http.get("/api/v1/schedules", headers=head).json()
        assert [s["name"] for s in listed] == ["cleanup_eu", "morning_report"]
        # From the store alone nothing exists yet.
        bare = t.client(code=False)
        assert bare.get("/api/v1/schedules", headers=head).json() == []
        empty = bare.get("/schedules", headers=head)
        assert empty.status_code == 200
        assert "No schedules in the store (a schedule is stored when a worker" in empty.text
        assert 'data-schedule="cleanup_eu"' in http.get("/schedules", headers=head).text
        missing = bare.post("/api/v1/schedules/cleanup_eu/pause", json={}, headers=head)
        assert missing.status_code == 404
        assert missing.json()["error"]["code"] == "schedule_not_found"
        assert http.post("/api/v1/schedules/cleanup_eu/pause", json={}, headers=head).json()[
            "paused"
        ]
        assert t.paused("cleanup_eu")
        assert [s["name"] for s in bare.get("/api/v1/schedules", headers=head).json()] == [
            "cleanup_eu",
            "morning_report",
        ]


def test_from_the_store_alone(timetable: Timetable) -> None:
    t = timetable
    http, head = t.client(code=False), _bearer(t.token("operate"))
    listed = http.get("/api/v1/schedules", headers=head).json()
    assert [s["name"] for s in listed] == ["cleanup_eu", "morning_report"]
    assert listed[0]["next_tick"] == _iso(2.25)
    assert http.post("/api/v1/schedules/morning_report/pause", json={}, headers=head).json()[
        "paused"
    ]
    assert t.paused("morning_report")
    started = http.post("/api/v1/schedules/morning_report/trigger", json={}, headers=head)
    assert started.status_code == 201
    t.env.run_until_idle()
    # The tick the workflow is given is the trigger's instant: the store's clock.
    assert t.app.get(started.json()["run_id"]).result == _iso(2)
    assert http.post("/api/v1/schedules/morning_report/resume", json={}, headers=head).json()[
        "next_tick"
    ] == _iso(5)


def test_unknown_schedules_and_other_apps(any_timetable: Timetable) -> None:
    t = any_timetable
    http = t.client()
    read, operate = _bearer(t.token("read")), _bearer(t.token("operate"))
    # Another app in the same store, with a schedule of its own.
    spec = scheduleport.ScheduleSpec(
        name="nightly",
        workflow="cleanup",
        version="1",
        cron="0 0 * * *",
        tz="UTC",
        catch_up="latest",
        input="[]",
        tick_arg=False,
    )
    schedules.save(t.app.store, "other", [spec])
    for method, path, head in (
        ("GET", "/api/v1/schedules/nope", read),
        ("GET", "/api/v1/schedules/nightly", read),
        ("POST", "/api/v1/schedules/nope/pause", operate),
        ("POST", "/api/v1/schedules/nightly/resume", operate),
        ("POST", "/api/v1/schedules/nightly/trigger", operate),
    ):
        answer = http.request(method, path, json={} if method == "POST" else None, headers=head)
        assert answer.status_code == 404, path
        error = answer.json()["error"]
        assert error["code"] == "schedule_not_found" and "no schedule named" in error["message"]
    assert [s["name"] for s in http.get("/api/v1/schedules", headers=read).json()] == [
        "cleanup_eu",
        "morning_report",
    ]
    assert not [r for r in schedules.listing(t.app.store, "other") if r.paused]
    assert t.app.runs(workflow="cleanup", limit=100) == t.runs_of("cleanup_eu")


def test_scopes_and_tokens(any_timetable: Timetable) -> None:
    t = any_timetable
    http = t.client()
    read, signal = _bearer(t.token("read")), _bearer(t.token("signal"))
    elsewhere = _bearer(t.token("operate", app="other"))
    before = len(t.runs_of("cleanup_eu"))
    for action in ("pause", "resume", "trigger"):
        for head in (read, signal):
            refused = http.post(f"/api/v1/schedules/cleanup_eu/{action}", json={}, headers=head)
            assert refused.status_code == 403, (action, head)
            assert refused.json()["error"]["code"] == "forbidden"
        other = http.post(f"/api/v1/schedules/cleanup_eu/{action}", json={}, headers=elsewhere)
        assert other.status_code == 403 and "another app" in other.json()["error"]["message"]
        nobody = http.post(f"/api/v1/schedules/cleanup_eu/{action}", json={})
        assert nobody.status_code == 401
    for path in ("/api/v1/schedules", "/api/v1/schedules/cleanup_eu"):
        assert http.get(path, headers=signal).status_code == 403
        assert http.get(path, headers=elsewhere).status_code == 403
        assert http.get(path).status_code == 401
    assert not t.paused("cleanup_eu")
    assert len(t.runs_of("cleanup_eu")) == before


def test_actions_take_json_only(timetable: Timetable) -> None:
    t = timetable
    http, head = t.client(), _bearer(t.token("operate"))
    form = http.post("/api/v1/schedules/cleanup_eu/pause", data={"x": "1"}, headers=head)
    assert form.status_code == 400 and "application/json" in form.json()["error"]["message"]
    assert not t.paused("cleanup_eu")


def test_the_openapi_document_has_the_schedule_calls(timetable: Timetable) -> None:
    document = timetable.client().get("/api/v1/openapi.json").json()
    paths = document["paths"]
    assert paths["/schedules"]["get"]["x-scope"] == "read"
    assert paths["/schedules/{name}"]["get"]["parameters"][0]["name"] == "name"
    for action in ("pause", "resume", "trigger"):
        op = paths[f"/schedules/{{name}}/{action}"]["post"]
        assert op["x-scope"] == "operate" and "404" in op["responses"]
        assert op["tags"] == ["schedules"]
    assert "201" in paths["/schedules/{name}/trigger"]["post"]["responses"]


# -- the page ----------------------------------------------------------------------


def _csrf(html: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', html)
    assert found, "no anti-forgery field on the page"
    return found.group(1)


def _logged_in(t: Timetable, scope: str) -> Any:
    http = t.client()
    token = t.token(scope)
    assert http.post("/login", data={"token": token}, follow_redirects=False).status_code == 303
    return http


def test_the_page_lists_the_schedules(timetable: Timetable) -> None:
    t = timetable
    http = _logged_in(t, "operate")
    page = http.get("/schedules")
    assert page.status_code == 200
    html = page.text
    assert '<a href="/schedules" class="current">Schedules</a>' in html
    assert html.index('data-schedule="cleanup_eu"') < html.index('data-schedule="morning_report"')
    assert "2030-01-01 02:15:00" in html and "in 15 min" in html
    # The next morning report at 06:00 Berlin time, three hours from now.
    assert "Tue 06:00 CET" in html and "in 3 h" in html
    [stored] = [s for s in t.app.schedules() if s.name == "cleanup_eu"]
    assert f'<a class="mono" href="/runs/{stored.last_run_id}">' in html
    assert html.count('action="/schedules/cleanup_eu/actions/pause"') == 1
    assert 'data-confirm="Pause schedule cleanup_eu on every worker?"' in html
    # A read token sees the schedules but no buttons.
    reader = _logged_in(t, "read")
    shown = reader.get("/schedules").text
    assert 'data-schedule="cleanup_eu"' in shown and "/actions/pause" not in shown
    assert "need an operate token" in shown


def test_the_page_pauses_resumes_and_triggers(timetable: Timetable) -> None:
    t = timetable
    http = _logged_in(t, "operate")
    csrf = _csrf(http.get("/schedules").text)
    done = http.post("/schedules/cleanup_eu/actions/pause", data={"csrf": csrf})
    assert done.status_code == 200 and 'data-answer="ok"' in done.text
    assert t.paused("cleanup_eu")
    assert 'action="/schedules/cleanup_eu/actions/resume"' in done.text
    assert "none while paused" in done.text
    started = http.post("/schedules/cleanup_eu/actions/trigger", data={"csrf": csrf})
    assert started.status_code == 200
    run_id = re.search(r'run <a class="mono" href="/runs/([0-9a-f]+)"', started.text)
    assert run_id and t.app.get(run_id.group(1)).workflow == "cleanup"
    resumed = http.post("/schedules/cleanup_eu/actions/resume", data={"csrf": csrf})
    assert resumed.status_code == 200 and not t.paused("cleanup_eu")


def test_the_page_refuses_forged_and_unknown_actions(timetable: Timetable) -> None:
    t = timetable
    http = _logged_in(t, "operate")
    csrf = _csrf(http.get("/schedules").text)
    forged = http.post("/schedules/cleanup_eu/actions/pause", data={"csrf": "0" * 64})
    assert forged.status_code == 403
    bare = http.post("/schedules/cleanup_eu/actions/pause", data={})
    assert bare.status_code == 403
    assert not t.paused("cleanup_eu")
    unknown = http.post("/schedules/nope/actions/pause", data={"csrf": csrf})
    assert unknown.status_code == 404 and "schedule_not_found" in unknown.text
    odd = http.post("/schedules/cleanup_eu/actions/delete", data={"csrf": csrf})
    assert odd.status_code == 400 and not t.paused("cleanup_eu")
    # A bearer header needs no anti-forgery field, but a read token may not act.
    refused = t.client().post(
        "/schedules/cleanup_eu/actions/pause", data={}, headers=_bearer(t.token("read"))
    )
    assert refused.status_code == 403 and "needs operate" in refused.text
    assert not t.paused("cleanup_eu")
    assert http.get("/schedules", follow_redirects=False).status_code == 200
    anonymous = t.client().get("/schedules", follow_redirects=False)
    assert anonymous.status_code == 303 and anonymous.headers["location"].startswith("/login")
