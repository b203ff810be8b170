"""perdure suspend, resume of a suspended run, runs --state suspended, start --deadline."""

from __future__ import annotations

import json
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from perdure import cli

MODULE = textwrap.dedent(
    """
    import perdure

    app = perdure.App(name="clisuspend")


    @app.workflow(version="1")
    def approval(ctx: perdure.Context, order_id: str) -> object:
        return ctx.wait("approve")
    """
)


@pytest.fixture
def target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    module = f"cli_suspend_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(MODULE, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PERDURE_STORE", f"sqlite:///{tmp_path / 'cli.db'}")
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield f"{module}:app"
    sys.modules.pop(module, None)


def run(*args: str) -> Result:
    return CliRunner().invoke(cli.cli, list(args))


def doc(result: Result) -> Any:
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return json.loads(result.stdout)


def test_suspend_resume_and_list_suspended_runs(target: str) -> None:
    run_id = doc(run("start", target, "approval", "--args", '["o-1"]', "--json"))["run_id"]
    first = run("suspend", run_id)
    assert first.exit_code == 0 and first.stdout.strip() == f"run {run_id} suspended"
    again = doc(run("suspend", run_id, "--json"))
    assert again == {
        "run_id": run_id,
        "suspended": False,
        "state": "suspended",
        "suspend_requested": False,
    }
    listed = doc(run("runs", "--state", "suspended", "--json"))
    assert [r["run_id"] for r in listed] == [run_id]
    resumed = run("resume", run_id)
    assert resumed.exit_code == 0 and resumed.stdout.strip() == f"run {run_id} resumed (now queued)"
    assert run("cancel", run_id).exit_code == 0
    refused = run("suspend", run_id)
    assert refused.exit_code == 1 and "run_finished" in refused.stderr


def test_start_with_a_deadline(target: str) -> None:
    started = doc(
        run("start", target, "approval", "--args", '["o-1"]', "--deadline", "60", "--json")
    )
    assert started["deadline"] is not None
    assert run("start", target, "approval", "--args", '["o-2"]', "--deadline", "0").exit_code == 2
