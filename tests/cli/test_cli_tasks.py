"""``perdure tasks`` and a plan run's tasks in ``perdure show``, on SQLite."""

from __future__ import annotations

import dataclasses
import json
import sys
import textwrap
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

import perdure
from perdure import cli

NIGHTLY = textwrap.dedent(
    """
    import perdure

    app = perdure.App(name="clinightly")
    nightly = app.plan("nightly", version="1")


    @nightly.task()
    def extract(day: str) -> list[str]:
        return [day, "b"]


    @nightly.task(after=[extract], retry=perdure.Retry(max_attempts=2, initial_delay=0.01))
    def transform(extract: list[str]) -> int:
        raise RuntimeError("the warehouse is  unreachable")


    @nightly.task(after=[extract], effect="pure")
    def audit(extract: list[str]) -> bool:
        return True


    @nightly.task(after=[transform])
    def load(transform: int) -> int:
        return transform


    @nightly.task(after=[load, audit], effect="once", retry=perdure.Retry(max_attempts=1))
    def publish(load: int, audit: bool) -> str:
        return "published"


    @app.workflow(version="1")
    def hello(ctx: perdure.Context, name: str) -> str:
        return f"hello {name}"
    """
)


@dataclass
class Nightly:
    """A directory holding the plan's module, and the store the CLI uses there."""

    module: str
    url: str

    @property
    def target(self) -> str:
        return f"{self.module}:app"

    @property
    def app(self) -> perdure.App:
        found = sys.modules[self.module].app
        assert isinstance(found, perdure.App)
        return found


@pytest.fixture
def nightly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Nightly]:
    # A fresh module name per test: the CLI imports it in this process.
    module = f"cli_nightly_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(NIGHTLY, encoding="utf-8")
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PERDURE_STORE", url)
    monkeypatch.setattr(sys, "path", list(sys.path))
    found = Nightly(module, url)
    yield found
    if module in sys.modules:
        found.app.close()
        sys.modules.pop(module, None)


def run(*args: str) -> Result:
    return CliRunner().invoke(cli.cli, list(args))


def start(nightly: Nightly, workflow: str, *args: str) -> str:
    result = run("start", nightly.target, workflow, "--args", json.dumps(list(args)), "--json")
    assert result.exit_code == 0, result.output
    run_id = json.loads(result.stdout)["run_id"]
    assert isinstance(run_id, str)
    return run_id


def served(nightly: Nightly, run_id: str) -> None:
    """Serve the app until the run ends."""
    app = nightly.app
    app.use_store(nightly.url)
    with app.worker(concurrency=4), pytest.raises(perdure.RunFailed):
        app.handle(run_id).result(timeout=30)


@pytest.fixture
def failed(nightly: Nightly) -> str:
    """A plan run whose ``transform`` failed: ``load`` and ``publish`` blocked, ``audit`` ran."""
    run_id = start(nightly, "nightly", "2026-11-30")
    served(nightly, run_id)
    return run_id


def _rows(stdout: str) -> dict[str, list[str]]:
    lines = stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("TASK "))
    assert lines[at].split() == [
        "TASK",
        "STATE",
        "ATTEMPT",
        "EFFECT",
        "WORKER",
        "STARTED",
        "ENDED",
        "BLOCKED_BY",
        "ERROR",
    ]
    return {
        line.split()[0]: line.split()
        for line in lines[at + 1 :]
        if line and not line.startswith(" ")
    }


def test_tasks_prints_the_table_of_a_failed_plan_run(nightly: Nightly, failed: str) -> None:
    result = run("tasks", failed)
    assert result.exit_code == 0, result.output
    rows = _rows(result.stdout)
    assert list(rows) == ["extract", "transform", "audit", "load", "publish"]
    # The instants are "YYYY-MM-DD HH:MM:SSZ", two words each.
    state, attempt, effect = rows["transform"][1:4]
    assert (state, attempt, effect, rows["transform"][-1]) == (
        "failed",
        "2",
        "idempotent",
        "task_error",
    )
    assert rows["audit"][1:4] == ["succeeded", "1", "pure"]
    assert rows["load"][1:3] == ["blocked", "0"] and rows["load"][-2:] == ["transform", "-"]
    assert rows["publish"][1:4] == ["blocked", "0", "once"]
    worker = nightly.app.tasks(failed)[0].worker
    assert worker and rows["extract"][4] == worker
    # The failed task's message, whitespace folded, under its row.
    assert (
        "    task_error (RuntimeError): the warehouse is unreachable" in result.stdout.splitlines()
    )


def test_tasks_json_is_a_list_of_task_infos(nightly: Nightly, failed: str) -> None:
    result = run("tasks", failed, "--json")
    assert result.exit_code == 0, result.output
    found = json.loads(result.stdout)
    fields = [f.name for f in dataclasses.fields(perdure.TaskInfo)]
    assert [list(t) for t in found] == [fields] * 5
    by_name = {t["name"]: t for t in found}
    assert by_name["extract"]["output"] == ["2026-11-30", "b"]
    assert by_name["transform"]["error"]["code"] == "task_error"
    assert by_name["publish"]["parents"] == ["load", "audit"]
    assert by_name["load"]["blocked_by"] == "transform"
    assert isinstance(datetime.fromisoformat(by_name["audit"]["started_at"]), datetime)
    assert by_name["load"]["started_at"] is None
    # The same tasks as the client's, field for field.
    client = [
        json.loads(json.dumps(dataclasses.asdict(t), default=datetime.isoformat))
        for t in nightly.app.tasks(failed)
    ]
    assert found == client


def test_show_prints_a_plan_runs_tasks_after_its_fields(nightly: Nightly, failed: str) -> None:
    result = run("show", failed)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["run", failed]
    fields = {line.split()[0]: line for line in lines[: lines.index("")]}
    assert "5 (2 succeeded, 1 failed, 2 blocked)" in fields["tasks"]
    assert "task_failed" in fields["error"]
    assert _rows(result.stdout)["load"][-2:] == ["transform", "-"]
    assert run("tasks", failed).stdout.strip() in result.stdout

    doc = json.loads(run("show", failed, "--json").stdout)
    assert doc["state"] == "failed" and doc["error"]["task"] == "transform"
    assert doc["tasks"] == json.loads(run("tasks", failed, "--json").stdout)


def test_a_plan_run_not_yet_served_has_pending_tasks(nightly: Nightly) -> None:
    run_id = start(nightly, "nightly", "2026-12-01")
    rows = _rows(run("tasks", run_id).stdout)
    assert {r[1] for r in rows.values()} == {"pending"}
    assert all(r[2] == "0" and r[4:7] == ["-", "-", "-"] for r in rows.values())
    doc = json.loads(run("show", run_id, "--json").stdout)
    assert doc["state"] == "running" and [t["state"] for t in doc["tasks"]] == ["pending"] * 5


def test_a_workflow_run_has_no_tasks(nightly: Nightly) -> None:
    run_id = start(nightly, "hello", "ada")
    result = run("tasks", run_id)
    assert result.exit_code == 0 and "not of a plan: no tasks" in result.stdout
    assert json.loads(run("tasks", run_id, "--json").stdout) == []
    shown = run("show", run_id)
    assert "TASK" not in shown.stdout and "tasks" not in shown.stdout.split()
    assert "tasks" not in json.loads(run("show", run_id, "--json").stdout)


@pytest.mark.parametrize("as_json", [False, True])
def test_tasks_of_an_unknown_run_exits_2(nightly: Nightly, as_json: bool) -> None:
    start(nightly, "nightly", "2026-12-01")  # the store exists, with another run
    result = run("tasks", "no-such-run", *(["--json"] if as_json else []))
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert result.stderr.strip().splitlines() == [
        "perdure: error: [run_not_found] no run with id 'no-such-run'"
    ]
    if as_json:
        assert json.loads(result.stdout)["error"]["code"] == "run_not_found"
    else:
        assert result.stdout == ""


def test_tasks_on_a_missing_store_exits_2(tmp_path: Path) -> None:
    result = run("tasks", "r", "--store", f"sqlite:///{tmp_path / 'none.db'}")
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("perdure: error: [")


@pytest.mark.parametrize(
    "extra",
    [["--deadline", "5"], ["--queue", "q"], ["--priority", "1"], ["--dry-run"]],
)
def test_start_of_a_plan_refuses_what_plan_runs_do_not_take(
    nightly: Nightly, extra: list[str]
) -> None:
    result = run("start", nightly.target, "nightly", "--args", '["d"]', *extra)
    assert result.exit_code == 2, result.output
    line = result.stderr.strip()
    assert line.startswith("perdure: error: [invalid_input] plan 'nightly': a plan run takes no")
    assert nightly.app.runs() == []


def test_help_lists_tasks() -> None:
    result = run("--help")
    listed = [line.split()[0] for line in result.stdout.splitlines() if line.startswith("  ")]
    assert listed.index("tasks") == listed.index("show") + 1
    assert "List the tasks of a plan run" in run("tasks", "--help").stdout
