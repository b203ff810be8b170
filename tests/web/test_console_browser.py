"""The console in a real headless Chromium (Debian's ``chromium``, driven by Playwright).

Skipped when Playwright or /usr/bin/chromium is missing, unless ``CI=true``:
then these tests must run. The browser is the system one; nothing is downloaded.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from shop import World, start_family, start_nightly
from timetable import Timetable

import perdure
from perdure.web import app as web_app

CHROMIUM = Path("/usr/bin/chromium")
DOCS = Path(__file__).resolve().parents[2] / "docs"

try:
    from playwright.sync_api import Browser, Page, sync_playwright
except ImportError:  # pragma: no cover - depends on the environment
    sync_playwright = None

if sync_playwright is None or not CHROMIUM.exists():
    if os.environ.get("CI") == "true":
        raise RuntimeError("CI needs playwright and /usr/bin/chromium for the browser tests")
    pytest.skip("playwright or /usr/bin/chromium is missing", allow_module_level=True)

import uvicorn  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Served:
    """A uvicorn server on a free loopback port, in a thread of this process."""

    def __init__(self, app: perdure.App) -> None:
        self.port = _free_port()
        asgi = web_app.create_app(app.client, app=app)
        config = uvicorn.Config(asgi, host="127.0.0.1", port=self.port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> Served:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert time.monotonic() < deadline, "the console did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    assert sync_playwright is not None
    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        yield launched
        launched.close()


@pytest.fixture
def console(world: World, browser: Browser) -> Iterator[tuple[Served, Page]]:
    with Served(world.app) as served:
        context = browser.new_context(viewport={"width": 1360, "height": 900})
        page = context.new_page()
        page.on("dialog", lambda dialog: dialog.accept())
        page.goto(served.url + "/")
        assert page.url.startswith(served.url + "/login")
        page.fill("input[name=token]", world.token("operate"))
        page.click("button[type=submit]")
        page.wait_for_url(served.url + "/runs")
        yield served, page
        context.close()


def test_find_a_failed_run_and_read_its_error(world: World, console: tuple[Served, Page]) -> None:
    served, page = console
    page.select_option("select[name=state]", "failed")
    page.click("form.filters button[type=submit]")
    page.wait_for_url("**/runs?state=failed*")
    rows = page.locator("table.runs tbody tr")
    assert rows.count() == 1
    rows.first.locator("a").click()
    page.wait_for_url(f"{served.url}/runs/{world.failed}")
    failing = page.locator("tr.entry.error")
    assert failing.locator("td").nth(2).inner_text() == "charge_card"
    assert "card declined for o-1: insufficient funds" in failing.inner_text()
    assert "step_failed" in page.locator(".run-error").inner_text()


def test_resolve_a_run_that_needs_attention(world: World, console: tuple[Served, Page]) -> None:
    served, page = console
    page.goto(f"{served.url}/runs/{world.attention}")
    form = page.locator("form[action$='/actions/resolve']")
    assert form.locator("input[name=step]").input_value() == "ship"
    # The wrong step first: the page shows the engine's refusal and its code.
    form.locator("input[name=step]").fill("reserve")
    form.locator("button[type=submit]").click()
    page.wait_for_selector("[data-answer=refusal]")
    assert "not_resolvable" in page.locator("[data-answer=refusal]").inner_text()
    assert world.app.get(world.attention).state == "needs_attention"
    form = page.locator("form[action$='/actions/resolve']")
    form.locator("input[name=step]").fill("ship")
    form.locator("textarea[name=output]").fill('"parcel-7"')
    form.locator("button[type=submit]").click()
    page.wait_for_selector("[data-answer=ok]")
    assert "resolve" in page.locator("[data-answer=ok]").inner_text()
    deadline = time.monotonic() + 20
    while world.app.get(world.attention).state != "succeeded":
        assert time.monotonic() < deadline, world.app.get(world.attention).state
        time.sleep(0.05)
    assert world.app.get(world.attention).result == "parcel-7"
    assert [p.kind for p in world.app.history(world.attention)].count("resolved") == 1


def test_signal_a_waiting_run(world: World, console: tuple[Served, Page]) -> None:
    served, page = console
    page.fill("input[name=q]", "order-2")
    page.click("form.filters button[type=submit]")
    page.wait_for_url(f"{served.url}/runs/{world.waiting}")
    assert "approve" in page.locator("section.grid").inner_text()
    form = page.locator("form[action$='/actions/signal']")
    assert form.locator("input[name=name]").input_value() == "approve"
    form.locator("textarea[name=payload]").fill('{"by": "<b>ops</b>"}')
    form.locator("input[name=signal_id]").fill("console-1")
    form.locator("button[type=submit]").click()
    page.wait_for_selector("[data-answer=ok]")
    assert '"signal_id": "console-1"' in page.locator("[data-answer=ok]").inner_text()
    deadline = time.monotonic() + 20
    while world.app.get(world.waiting).state != "succeeded":
        assert time.monotonic() < deadline, world.app.get(world.waiting).state
        time.sleep(0.05)
    assert world.app.get(world.waiting).result == {"approved": {"by": "<b>ops</b>"}}


def test_a_run_with_children_and_an_event(
    world: World, family: str, console: tuple[Served, Page]
) -> None:
    served, page = console
    page.goto(f"{served.url}/runs/{family}")
    tree = page.locator("#children ul.tree").first
    top = tree.locator(":scope > li")
    assert top.count() == 4
    assert [top.nth(i).locator(".wf").first.inner_text() for i in range(4)] == [
        "parcel",
        "parcel",
        "parcel",
        "batch",
    ]
    batch = top.nth(3)
    assert batch.locator("ul.tree > li").count() == 10
    assert batch.locator("a.more").inner_text().startswith("and 2 more")
    status = page.locator("[data-event=status]")
    # The event's value is shown as text, not run as a script.
    assert "<script>open</script>" in status.inner_text()
    assert page.evaluate("typeof window.open === 'function'")
    assert page.locator("[data-stream=progress] tr").count() == 3
    batch_id = batch.get_attribute("data-run")
    batch.locator("a.more").click()
    page.wait_for_url(f"{served.url}/runs/{batch_id}#children")
    assert page.locator("#children ul.tree > li").count() == 12


def test_screenshots_of_the_console(
    world: World, console: tuple[Served, Page], tmp_path: Path
) -> None:
    """Take the README's screenshots (into docs/ with PERDURE_SCREENSHOTS=1)."""
    served, page = console
    folder = DOCS if os.environ.get("PERDURE_SCREENSHOTS") == "1" else tmp_path
    for i in range(3):
        world.app.start("checkout", f"o-{10 + i}", key=f"order-{10 + i}")
    deadline = time.monotonic() + 20
    while any(r.state in ("queued", "running") for r in world.app.runs()):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    page.goto(served.url + "/runs")
    page.screenshot(path=str(folder / "console-runs.png"), full_page=True)
    family = start_family(world.app)
    world.app.update(family, "add_item", {"sku": "A-7", "qty": 1}, update_id="u-1", timeout=20)
    page.goto(f"{served.url}/runs/{family}")
    page.screenshot(path=str(folder / "console-run.png"), full_page=True)
    assert (folder / "console-runs.png").stat().st_size > 10_000


def test_a_plan_run_page_draws_its_tasks(
    world: World, console: tuple[Served, Page], tmp_path: Path
) -> None:
    """The graph of a failed plan run (into docs/console-plan.png with PERDURE_SCREENSHOTS=1)."""
    served, page = console
    folder = DOCS if os.environ.get("PERDURE_SCREENSHOTS") == "1" else tmp_path
    run_id = start_nightly(world.app)
    page.goto(f"{served.url}/runs/{run_id}")
    nodes = page.locator(".plan-graph g.task-node")
    assert nodes.count() == 6
    assert page.locator(".plan-graph g.task-node.blocked").count() == 2
    assert page.locator(".plan-graph path.edge").count() == 6
    # The boxes are laid out left to right by depth, each drawn at its full size.
    boxes = {
        name: page.locator(f"g.task-node[data-task={name}] rect").bounding_box()
        for name in ("extract", "transform", "load", "publish")
    }
    assert all(b is not None and b["width"] > 100 for b in boxes.values())
    xs = [b["x"] for b in boxes.values() if b is not None]
    assert xs == sorted(xs) and len(set(xs)) == 4
    assert page.locator("g.task-node[data-task=publish] text.note").text_content() == (
        "blocked by transform"
    )
    plan = page.locator("#plan").bounding_box()
    assert plan is not None
    page.screenshot(
        path=str(folder / "console-plan.png"),
        full_page=True,
        clip={"x": 0, "y": 0, "width": 1360, "height": plan["y"] + plan["height"] + 16},
    )
    assert (folder / "console-plan.png").stat().st_size > 10_000
    # A box leads to its task's row.
    page.locator("g.task-node[data-task=transform]").click()
    page.wait_for_url(f"**/runs/{run_id}#task-transform")
    assert "the warehouse is unreachable" in page.locator("tr#task-transform").inner_text()


def test_pause_a_schedule_from_its_page(
    timetable: Timetable, browser: Browser, tmp_path: Path
) -> None:
    folder = DOCS if os.environ.get("PERDURE_SCREENSHOTS") == "1" else tmp_path
    asked: list[str] = []

    def confirm(dialog: Any) -> None:
        asked.append(dialog.message)
        dialog.accept()

    with Served(timetable.app) as served:
        context = browser.new_context(viewport={"width": 1360, "height": 560})
        try:
            page = context.new_page()
            page.on("dialog", confirm)
            page.goto(served.url + "/login")
            page.fill("input[name=token]", timetable.token("operate"))
            page.click("button[type=submit]")
            page.wait_for_url(served.url + "/runs")
            page.click("header.top nav >> text=Schedules")
            page.wait_for_url(served.url + "/schedules")
            rows = page.locator("tr.schedule")
            assert rows.count() == 2
            cleanup = page.locator("tr[data-schedule=cleanup_eu]")
            assert "in 15 min" in cleanup.locator("td.next").inner_text()
            assert "active" in cleanup.inner_text()
            cleanup.locator("button[value=pause]").click()
            page.wait_for_selector("[data-answer=ok]")
            assert asked == ["Pause schedule cleanup_eu on every worker?"]
            # The store holds it paused; the page offers to resume it.
            assert timetable.paused("cleanup_eu")
            cleanup = page.locator("tr[data-schedule=cleanup_eu]")
            assert "paused" in cleanup.inner_text()
            assert cleanup.locator("button[value=resume]").count() == 1
            assert not timetable.paused("morning_report")
            page.goto(served.url + "/schedules")
            page.screenshot(path=str(folder / "console-schedules.png"), full_page=True)
        finally:
            context.close()
    assert (folder / "console-schedules.png").stat().st_size > 10_000
