"""The read commands find the runs the user means, and never create a store.

Each test reproduces a friction of the command line as it was: ``perdure runs``
in a project directory said ``no runs in app default`` and left a stray
``perdure.db``; ``--store`` alone showed nothing until ``--app`` was added;
``worker --help`` named a store default it does not use and offered ``--json``;
``show`` called the number of claims an ``attempt``; a sleeping run was in no
listing; and the journal could not be printed.
"""

from __future__ import annotations

import json
import sys
import textwrap
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

import perdure
from perdure import cli

WORKER: dict[str, Any] = {
    "concurrency": 2,
    "lease_ttl": 2,
    "heartbeat": 0.5,
    "poll_interval": 0.05,
    "liveness": "thread",
}


def run(*args: str) -> Result:
    return CliRunner().invoke(cli.cli, list(args))


def doc(result: Result) -> Any:
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return json.loads(result.stdout)


def settle(app: perdure.App, run_id: str, state: str, limit: float = 15.0) -> None:
    deadline = time.monotonic() + limit
    while app.get(run_id).state != state:
        assert time.monotonic() < deadline, f"run {run_id} is {app.get(run_id).state}"
        time.sleep(0.02)


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty project directory with no store configured."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PERDURE_STORE", raising=False)
    monkeypatch.delenv("PERDURE_APP", raising=False)
    return tmp_path


def make_app(url: str, name: str) -> perdure.App:
    app = perdure.App(url, name=name)

    @app.workflow()
    def hello(ctx: perdure.Context, who: str) -> str:
        return f"hello {who}"

    @app.workflow()
    def nap(ctx: perdure.Context) -> None:
        ctx.sleep(timedelta(days=1))

    @app.workflow()
    def twice(ctx: perdure.Context) -> list[Any]:
        return [ctx.wait("first"), ctx.wait("second")]

    return app


# -- a read command never creates a store ---------------------------------------------


@pytest.mark.parametrize(
    "command",
    [
        ["runs"],
        ["waits"],
        ["show", "r-1"],
        ["show", "r-1", "--journal"],
        ["signal", "r-1", "go"],
        ["send", "r-1", "events", "k"],
        ["resume", "r-1"],
        ["cancel", "r-1"],
        ["resolve", "r-1", "charge", "--output", "1"],
        ["fork", "r-1"],
    ],
)
def test_a_missing_sqlite_store_is_an_error_and_is_not_created(
    project: Path, command: list[str]
) -> None:
    result = run(*command)
    assert result.exit_code == 2, (result.stdout, result.stderr)
    assert "store_unavailable" in result.stderr and "does not exist" in result.stderr
    assert "perdure.db" in result.stderr
    named = run(*command, "--store", f"sqlite:///{project / 'my.db'}")
    assert named.exit_code == 2 and "my.db" in named.stderr
    assert list(project.iterdir()) == []


def test_migrate_and_start_still_create_the_store(project: Path) -> None:
    assert run("migrate").exit_code == 0
    assert (project / "perdure.db").exists()
    assert doc(run("runs", "--json")) == []


def test_a_relative_store_url_is_named_by_its_absolute_file(project: Path) -> None:
    assert run("migrate").exit_code == 0
    listed = run("runs")
    assert listed.exit_code == 0
    # Run from another directory, the same URL would name another file: say which one.
    assert f"store: sqlite:///{project / 'perdure.db'}" in listed.stderr
    assert str(project) in listed.stderr
    absolute = run("runs", "--store", f"sqlite:///{project / 'perdure.db'}")
    assert "store:" not in absolute.stderr


# -- --app defaults to every app, to MODULE:APP's, or to $PERDURE_APP ------------------


def test_runs_lists_every_app_with_an_app_column(
    store_url: str, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    orders, billing = make_app(store_url, "orders"), make_app(store_url, "billing")
    try:
        first = orders.start("hello", "a").run_id
        second = billing.start("hello", "b").run_id
        third = orders.start("hello", "c").run_id
        listed = doc(run("runs", "--store", store_url, "--json"))
        assert [(d["run_id"], d["app"]) for d in listed] == [
            (third, "orders"),
            (second, "billing"),
            (first, "orders"),
        ]
        human = run("runs", "--store", store_url)
        assert human.exit_code == 0
        header, *lines = human.stdout.splitlines()
        assert header.split()[:3] == ["RUN", "APP", "WORKFLOW"]
        assert "CLAIMS" in header.split() and "ATTEMPT" not in header.split()
        assert [line.split()[1] for line in lines] == ["orders", "billing", "orders"]
        # The newest ``limit`` across every app.
        limited = doc(run("runs", "--store", store_url, "--limit", "2", "--json"))
        assert [d["run_id"] for d in limited] == [third, second]

        only = doc(run("runs", "--store", store_url, "--app", "billing", "--json"))
        assert [d["run_id"] for d in only] == [second]
        monkeypatch.setenv("PERDURE_APP", "orders")
        from_env = doc(run("runs", "--store", store_url, "--json"))
        assert [d["run_id"] for d in from_env] == [third, first]
        # An explicit --app wins over $PERDURE_APP.
        explicit = doc(run("runs", "--store", store_url, "--app", "billing", "--json"))
        assert [d["run_id"] for d in explicit] == [second]
        missing = run("runs", "--store", store_url, "--app", "shipping")
        assert missing.exit_code == 0
        assert "no runs in app shipping" in missing.stdout
        assert "billing, orders" in missing.stdout
    finally:
        orders.close()
        billing.close()


def test_runs_of_module_app_uses_its_name_and_its_store(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{project / 'shop.db'}"
    module = f"findshop_{uuid.uuid4().hex[:8]}"
    (project / f"{module}.py").write_text(
        textwrap.dedent(
            f"""
            import perdure

            app = perdure.App({url!r}, name="shop")


            @app.workflow()
            def hello(ctx: perdure.Context) -> str:
                return "hi"
            """
        ),
        encoding="utf-8",
    )
    monkeypatch.setattr(sys, "path", list(sys.path))
    other = make_app(url, "elsewhere")
    try:
        assert run("start", f"{module}:app", "hello").exit_code == 0
        other.start("hello", "x")
        # No --store and no --app: MODULE:APP names both, even over $PERDURE_APP.
        monkeypatch.setenv("PERDURE_APP", "elsewhere")
        listed = doc(run("runs", f"{module}:app", "--json"))
        assert [(d["app"], d["workflow"]) for d in listed] == [("shop", "hello")]
        waits = run("waits", f"{module}:app")
        assert waits.exit_code == 0 and "no open waits" in waits.stdout
        assert not (project / "perdure.db").exists()
    finally:
        other.close()
        sys.modules.pop(module, None)


# -- the worker's help and options -------------------------------------------------------


def test_worker_help_names_the_store_default_it_uses_and_offers_no_json() -> None:
    shown = run("worker", "--help")
    assert shown.exit_code == 0
    text = " ".join(shown.stdout.split())
    assert "the app's own store" in text and "perdure.App(...)" in text
    assert "--json" not in shown.stdout
    refused = run("worker", "x:app", "--json")
    assert refused.exit_code == 2 and "--json" in refused.stderr
    start_help = " ".join(run("start", "--help").stdout.split())
    assert "the app's own store" in start_help


# -- show: claims, not "attempt" ----------------------------------------------------------


def test_show_counts_claims_and_failures_by_their_names(project: Path, sqlite_url: str) -> None:
    app = make_app(sqlite_url, "orders")
    try:
        with app.worker(**WORKER):
            run_id = app.start("twice").run_id
            settle(app, run_id, "waiting")
            app.signal(run_id, "first", 1)
            deadline = time.monotonic() + 15
            while not app.waits(run_id) or app.waits(run_id)[0].name != "second":
                assert time.monotonic() < deadline
                time.sleep(0.02)
            app.signal(run_id, "second", 2)
            assert app.handle(run_id).result(timeout=15) == [1, 2]
        shown = run("show", run_id, "--store", sqlite_url)
        assert shown.exit_code == 0, shown.stderr
        fields = {line.split()[0]: line.split()[1] for line in shown.stdout.splitlines()}
        # Claimed three times (start, then after each signal), and it never failed.
        assert (fields["claims"], fields["failures"]) == ("3", "0")
        assert "attempt" not in fields
        as_json = doc(run("show", run_id, "--store", sqlite_url, "--json"))
        assert (as_json["claims"], as_json["failures"]) == (3, 0)
    finally:
        app.close()


# -- waits: sleeps and timers too ---------------------------------------------------------


def test_waits_lists_a_sleeping_run_and_a_held_back_run(store_url: str, project: Path) -> None:
    app = make_app(store_url, "orders")
    try:
        with app.worker(**WORKER):
            sleeper = app.start("nap").run_id
            signaled = app.start("twice").run_id
            settle(app, sleeper, "waiting")
            settle(app, signaled, "waiting")
        # A queued run held back by a retry's backoff.
        held = app.start("hello", "later").run_id
        [claimed] = app.store.claim("orders", "w-test", [("hello", "1")], lease_ttl=5)
        app.store.release(claimed.claim, delay=600, failed=True)
        assert claimed.run.run_id == held

        everything = doc(run("waits", "--store", store_url, "--json"))
        kinds = {(w["run_id"], w["kind"], w["name"]) for w in everything}
        assert kinds == {
            (sleeper, "sleep", "sleep"),
            (signaled, "signal", "first"),
            (held, "timer", "retry"),
        }
        due = next(w["deadline"] for w in everything if w["kind"] == "sleep")
        assert due is not None
        only_sleeps = doc(run("waits", "--store", store_url, "--kind", "sleep", "--json"))
        assert [w["run_id"] for w in only_sleeps] == [sleeper]
        only_signals = doc(run("waits", "--store", store_url, "--kind", "signal", "--json"))
        assert [w["run_id"] for w in only_signals] == [signaled]
        of_run = doc(run("waits", "--store", store_url, "--run", sleeper, "--json"))
        assert [w["wait_id"] for w in of_run] == [f"{sleeper}/sleep"]
        human = run("waits", "--store", store_url)
        assert human.exit_code == 0
        assert f"{sleeper}/sleep" in human.stdout and "APP" in human.stdout.splitlines()[0]
        none = run("waits", "--store", store_url, "--kind", "channel")
        assert "no open waits of kind channel" in none.stdout
    finally:
        app.close()


# -- show --journal -------------------------------------------------------------------------

JOURNALED = textwrap.dedent(
    """
    import perdure

    app = perdure.App(name="journaled")
    calls = {"flaky": 0}


    @app.step(retry=perdure.Retry(max_attempts=3, initial_delay=0.05, jitter=False))
    def flaky() -> str:
        calls["flaky"] += 1
        if calls["flaky"] < 3:
            raise ConnectionError("try again")
        return "ok after retries"


    @app.step()
    def big() -> str:
        return "x" * 500


    @app.step(retry=perdure.Retry(max_attempts=1))
    def broken() -> None:
        raise ValueError("the card was declined")


    @app.workflow()
    def flow(ctx: perdure.Context) -> str:
        flaky()
        big()
        try:
            broken()
        except perdure.StepFailed:
            pass
        ctx.sleep(0)
        return "done"
    """
)


def test_show_journal_prints_attempts_duration_output_and_error(
    project: Path, sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = f"journaled_{uuid.uuid4().hex[:8]}"
    (project / f"{module}.py").write_text(JOURNALED, encoding="utf-8")
    monkeypatch.setattr(sys, "path", [str(project), *sys.path])
    loaded = __import__(module)
    app: perdure.App = loaded.app
    app.use_store(sqlite_url)
    try:
        with app.worker(**WORKER):
            run_id = app.start("flow").run_id
            assert app.handle(run_id).result(timeout=15) == "done"
        shown = run("show", run_id, "--journal", "--store", sqlite_url)
        assert shown.exit_code == 0, shown.stderr
        lines = shown.stdout.splitlines()
        header = next(i for i, line in enumerate(lines) if line.startswith("POS"))
        assert lines[header].split() == [
            "POS",
            "KIND",
            "NAME",
            "STATUS",
            "ATTEMPTS",
            "DURATION",
            "OUTPUT",
            "ERROR",
        ]
        rows = {line.split()[2]: line for line in lines[header + 1 :]}
        assert rows["flaky"].split()[3:5] == ["ok", "3"]
        assert rows["flaky"].split()[5].endswith(("ms", "s"))
        assert '"x' in rows["big"] and "..." in rows["big"] and "x" * 100 not in rows["big"]
        assert "ValueError: the card was declined" in rows["broken"]
        assert rows["broken"].split()[3] == "error"
        assert "sleep" in rows

        journal = doc(run("show", run_id, "--journal", "--store", sqlite_url, "--json"))["journal"]
        by_name = {e["name"]: e for e in journal}
        assert [e["position"] for e in journal] == list(range(1, len(journal) + 1))
        assert by_name["flaky"]["attempts"] == 3 and by_name["flaky"]["output"] == (
            "ok after retries"
        )
        # Two failed attempts paused 0.05 and 0.1 seconds before the third.
        assert by_name["flaky"]["duration"] >= 0.15
        assert by_name["big"]["output"] == "x" * 500
        assert by_name["broken"]["error"]["message"] == "the card was declined"
        assert by_name["sleep"]["duration"] is None
    finally:
        app.close()
        sys.modules.pop(module, None)
