"""The console and the API show queues: runs by queue, the queues, a run's place in one."""

from __future__ import annotations

from shop import World


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_runs_filter_by_queue_and_queues_are_listed(world: World) -> None:
    world.app.queue("vip", concurrency=1, per_key=1)
    queued = world.app.start("approval", "o-vip", queue="vip", queue_key="c-1", priority=3)
    http, head = world.client(), _bearer(world.token("read"))
    found = http.get("/api/v1/runs?queue=vip", headers=head).json()
    assert [r["run_id"] for r in found["runs"]] == [queued.run_id]
    run = found["runs"][0]
    assert (run["queue"], run["queue_key"], run["priority"]) == ("vip", "c-1", 3)
    assert http.get("/api/v1/runs?queue=none", headers=head).json()["runs"] == []
    listed = http.get("/api/v1/queues", headers=head)
    assert listed.status_code == 200
    [vip] = listed.json()
    assert (vip["name"], vip["concurrency"], vip["per_key"], vip["rate"]) == ("vip", 1, 1, None)
    assert vip["running"] + vip["waiting"] <= 1


def test_run_page_shows_the_queue_and_the_runs_page_filters_by_it(world: World) -> None:
    world.app.queue("vip")
    queued = world.app.start("approval", "o-vip", queue="vip", queue_key="c-9", priority=2)
    http, head = world.client(), _bearer(world.token("read"))
    page = http.get(f"/runs/{queued.run_id}", headers=head)
    assert page.status_code == 200
    assert "/runs?queue=vip" in page.text and "c-9" in page.text and "priority 2" in page.text
    listing = http.get("/runs?queue=vip", headers=head)
    assert listing.status_code == 200 and queued.run_id in listing.text
    assert world.waiting not in listing.text


def test_queues_page_lists_limits_and_links_to_runs(world: World) -> None:
    world.app.queue("vip", concurrency=4, per_key=2)
    world.app.start("approval", "o-vip", queue="vip")
    http, head = world.client(), _bearer(world.token("read"))
    page = http.get("/queues", headers=head)
    assert page.status_code == 200
    assert "/runs?queue=vip" in page.text and ">4<" in page.text and ">2<" in page.text
    refused = http.get("/queues", follow_redirects=False)  # a login is needed
    assert refused.status_code == 303 and refused.headers["location"].startswith("/login")
