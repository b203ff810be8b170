"""Safe deploys: replay_check / perdure check, and ctx.patched for a changed workflow."""

from __future__ import annotations

import inspect
import json
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import perdure
from perdure import cli
from perdure.testing import Environment, faults, replay_check

WORKFLOW = textwrap.dedent(
    """
    import perdure

    app = perdure.App({url!r}, name="shop")
    calls = []


    @app.step()
    def reserve(order: str) -> str:
        calls.append("reserve")
        return "held"


    @app.step()
    def charge_old(order: str) -> str:
        calls.append("charge_old")
        return "old"


    @app.step()
    def charge_new(order: str) -> str:
        calls.append("charge_new")
        return "new"


    @app.workflow(version="1")
    def checkout(ctx: perdure.Context, order: str) -> dict:
        reserve(order)
        if {variant!r} == "old":
            how = charge_old(order)
        elif {variant!r} == "unpatched":
            how = charge_new(order)
        elif {variant!r} == "early":
            return {{"charge": "none"}}
        elif ctx.patched("new-charge"):
            how = charge_new(order)
        else:
            how = charge_old(order)
        ok = ctx.wait("approval")
        return {{"charge": how, "ok": ok}}


    @app.workflow(version={version!r})
    def late(ctx: perdure.Context) -> object:
        ok = ctx.wait("approval")
        if {variant!r} == "patched" and ctx.patched("new-charge"):
            return charge_new("late")
        return charge_old("late")
    """
)


class Code:
    """Versions of one app's code, as modules the command line can import too."""

    def __init__(self, folder: Path, url: str) -> None:
        self.folder = folder
        self.url = url
        self.loaded: list[str] = []

    def module(self, variant: str, version: str = "1") -> str:
        name = f"shop_{variant}_{uuid.uuid4().hex[:8]}"
        text = WORKFLOW.format(url=self.url, variant=variant, version=version)
        (self.folder / f"{name}.py").write_text(text, encoding="utf-8")
        self.loaded.append(name)
        return name

    def app(self, variant: str, version: str = "1") -> Any:
        return __import__(self.module(variant, version))


@pytest.fixture
def code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, store_url: str) -> Any:
    """Code on the test's store: each test runs on SQLite and on PostgreSQL."""
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    made = Code(tmp_path, store_url)
    yield made
    for name in made.loaded:
        sys.modules.pop(name, None)


def started(code: Code, variant: str, order: str, workflow: str = "checkout") -> str:
    """Start a run with this code and let it run until it waits; return its id."""
    mod = code.app(variant)
    with Environment(mod.app, store=code.url) as env:
        handle = env.start(workflow, order) if workflow == "checkout" else env.start(workflow)
        env.run_until_idle()
        assert handle.status() == "waiting"
    mod.app.close()
    return str(handle.run_id)


def test_patched_code_keeps_old_runs_on_the_old_path_and_new_runs_on_the_new(
    code: Code,
) -> None:
    old_run = started(code, "old", "o-1")
    patched = code.app("patched")
    with Environment(patched.app, store=code.url) as env:
        report = replay_check(patched.app)
        assert (report.checked, report.mismatches, report.skipped) == ([old_run], [], [])

        new_run = env.start("checkout", "o-2").run_id
        env.run_until_idle()
        kinds = [(e.kind, e.name) for e in env.store.journal(new_run)]
        assert kinds[:3] == [("step", "reserve"), ("patch", "new-charge"), ("step", "charge_new")]
        assert [(e.kind, e.name) for e in env.store.journal(old_run)][1] == ("step", "charge_old")

        for run_id in (old_run, new_run):
            env.app.signal(run_id, "approval", True)
        env.run_until_idle()
        assert env.app.handle(old_run).result(timeout=0) == {"charge": "old", "ok": True}
        assert env.app.handle(new_run).result(timeout=0) == {"charge": "new", "ok": True}
    # The old run replayed its charge: this code ran charge_new once, for the new run.
    assert patched.calls == ["reserve", "charge_new"]


def test_a_run_parked_before_the_patch_takes_the_new_path(code: Code) -> None:
    parked = started(code, "old", "o-1", workflow="late")
    patched = code.app("patched")
    with Environment(patched.app, store=code.url) as env:
        assert replay_check(patched.app).ok
        env.app.signal(parked, "approval", True)
        env.run_until_idle()
        assert env.app.handle(parked).result(timeout=0) == "new"


def test_replay_check_reports_an_unpatched_change_with_its_position(code: Code) -> None:
    old_run = started(code, "old", "o-1")
    unpatched = code.app("unpatched")
    with Environment(unpatched.app, store=code.url):
        report = replay_check(unpatched.app)
    assert report.checked == [old_run] and not report.ok
    [found] = report.mismatches
    assert (found.run_id, found.workflow, found.version, found.position) == (
        old_run,
        "checkout",
        "1",
        2,
    )
    assert found.recorded == "step 'charge_old'"
    assert found.attempted == "step 'charge_new'"
    assert "position 2: journal has step 'charge_old', code now calls step 'charge_new'" in (
        found.describe()
    )
    # Nothing ran: replay returned the recorded reserve, and stopped at the mismatch.
    assert unpatched.calls == []


def test_new_runs_do_not_replay_on_the_code_before_the_patch(code: Code) -> None:
    patched_run = started(code, "patched", "o-1")
    old = code.app("old")
    with Environment(old.app, store=code.url):
        [found] = replay_check(old.app).mismatches
    assert (found.run_id, found.position) == (patched_run, 2)
    assert found.recorded == "patch 'new-charge'" and found.attempted == "step 'charge_old'"


def test_code_that_ends_before_the_journal_does_is_a_mismatch(code: Code) -> None:
    old_run = started(code, "old", "o-1")
    early = code.app("early")
    with Environment(early.app, store=code.url):
        [found] = replay_check(early.app).mismatches
    assert (found.run_id, found.position) == (old_run, 2)
    assert (found.recorded, found.attempted) == (
        "step 'charge_old'",
        "the end of the workflow (returns)",
    )
    assert "code now reaches the end of the workflow (returns)" in found.describe()


def test_replay_check_skips_versions_it_does_not_have_and_writes_nothing(code: Code) -> None:
    old_run = started(code, "old", "o-1")
    v2 = code.app("unpatched", version="2")
    other = started(code, "old", "o-2", workflow="late")
    store = faults.FaultyStore(perdure.store.open_store(code.url))
    try:
        before = {r: (store.journal(r), store.history(r)) for r in (old_run, other)}
        store.calls.clear()
        app = perdure.App(store, name="shop")
        for name in ("checkout", "late"):
            wf = v2.app.workflow_def(name)
            app.workflow(name, version=wf.version)(wf.fn)
        report = replay_check(app)
        assert [m.run_id for m in report.mismatches] == [old_run]
        assert [(s.run_id, s.reason) for s in report.skipped] == [
            (other, "this code has late version 2")
        ]
        assert set(store.calls) <= {"list_runs", "journal"}, store.calls
        assert {r: (store.journal(r), store.history(r)) for r in (old_run, other)} == before
    finally:
        store.close()


def test_perdure_check_exits_1_on_a_mismatch_and_0_without(code: Code) -> None:
    old_run = started(code, "old", "o-1")
    runner = CliRunner()
    bad = runner.invoke(cli.cli, ["check", f"{code.module('unpatched')}:app"])
    assert bad.exit_code == 1, (bad.stdout, bad.stderr)
    assert (
        f"run {old_run} (checkout v1) position 2: journal has step 'charge_old', "
        "code now calls step 'charge_new'" in bad.stdout
    )
    assert "[non_determinism]" in bad.stderr and "ctx.patched" in bad.stderr
    as_json = runner.invoke(cli.cli, ["check", f"{code.module('unpatched')}:app", "--json"])
    assert as_json.exit_code == 1
    doc = json.loads(as_json.stdout)
    assert doc["refused"]["code"] == "non_determinism" and doc["checked"] == 1
    assert doc["mismatches"] == [
        {
            "run_id": old_run,
            "workflow": "checkout",
            "version": "1",
            "position": 2,
            "recorded": "step 'charge_old'",
            "attempted": "step 'charge_new'",
        }
    ]
    good = runner.invoke(cli.cli, ["check", f"{code.module('patched')}:app", "--json"])
    assert good.exit_code == 0, (good.stdout, good.stderr)
    assert json.loads(good.stdout) | {"store": None} == {
        "app": "shop",
        "store": None,
        "ok": True,
        "checked": 1,
        "mismatches": [],
        "skipped": [],
    }
    missing = runner.invoke(
        cli.cli, ["check", f"{code.module('patched')}:app", "--store", "sqlite:///none.db"]
    )
    assert missing.exit_code == 2 and not (code.folder / "none.db").exists()
    assert "does not exist" in missing.stderr


def test_patched_refuses_an_empty_change_id(code: Code) -> None:
    app = perdure.App(name="ids")

    @app.workflow()
    def bad(ctx: perdure.Context) -> bool:
        return ctx.patched("")

    with Environment(app) as env:
        handle = env.start(bad)
        env.run_until_idle()
        assert handle.info().state == "failed"
        assert "change id" in str(handle.info().error)


def test_async_workflows_replay_without_running_their_steps(store_url: str) -> None:
    def build(step_name: str) -> tuple[perdure.App, list[str]]:
        app = perdure.App(store_url, name="asyncshop")
        ran: list[str] = []

        async def body() -> str:
            ran.append(step_name)
            return step_name

        body.__name__ = step_name
        step = app.step()(body)

        @app.workflow()
        async def flow(ctx: perdure.Context) -> Any:
            await step()
            waited = ctx.wait("go")
            # Works whether the async form of wait returns the payload or an awaitable.
            return await waited if inspect.isawaitable(waited) else waited

        return app, ran

    old, old_ran = build("first")
    try:
        with Environment(old, store=store_url) as env:
            env.start("flow")
            env.run_until_idle()
    finally:
        old.close()
    assert old_ran == ["first"]
    same, same_ran = build("first")
    changed, _ = build("second")
    try:
        with Environment(same, store=store_url):
            assert replay_check(same).ok and same_ran == []
        with Environment(changed, store=store_url):
            [found] = replay_check(changed).mismatches
            assert (found.position, found.recorded) == (1, "step 'first'")
    finally:
        same.close()
        changed.close()
