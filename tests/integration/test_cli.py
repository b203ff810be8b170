"""The command line: exit codes, one-line errors, JSON output, and a worker process end to end."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from perdure import cli

SHOP = textwrap.dedent(
    """
    import perdure

    app = perdure.App(name="clishop")


    @app.step()
    def reserve(order_id: str) -> dict:
        return {"order_id": order_id, "cents": 1200}


    @app.step(effect="once", retry=perdure.Retry(max_attempts=1))
    def charge(order_id: str, cents: int) -> str:
        if order_id.startswith("fail"):
            raise RuntimeError("the gateway timed out")
        return f"ch_{order_id}_{cents}"


    @app.workflow(version="1")
    def checkout(ctx: perdure.Context, order_id: str) -> dict:
        hold = reserve(order_id)
        return {"charge": charge(order_id, hold["cents"])}


    @app.workflow(version="1")
    def approval(ctx: perdure.Context, order_id: str) -> object:
        return ctx.wait("approve", timeout=600)
    """
)


@dataclass
class Shop:
    """A directory holding a user module, and the store the CLI uses there."""

    path: Path
    module: str
    url: str

    @property
    def target(self) -> str:
        return f"{self.module}:app"

    def env(self) -> dict[str, str]:
        return {**os.environ, "PERDURE_STORE": self.url}


@pytest.fixture
def shop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Shop]:
    # A fresh module name per test: the CLI imports it in this process.
    module = f"cli_shop_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(SHOP, encoding="utf-8")
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PERDURE_STORE", url)
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield Shop(tmp_path, module, url)
    sys.modules.pop(module, None)


def run(*args: str) -> Result:
    return CliRunner().invoke(cli.cli, list(args))


def one_error_line(result: Result, code: int) -> str:
    """Assert the exit code and that stderr holds exactly one line and no traceback."""
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    prefix = "perdure: error: " if code == 2 else "perdure: refused: "
    assert lines[0].startswith(prefix), lines[0]
    return lines[0]


def as_json(result: Result) -> Any:
    return json.loads(result.stdout)


def start(shop: Shop, *args: str) -> str:
    result = run("start", shop.target, *args, "--json")
    assert result.exit_code == 0, result.output
    run_id = as_json(result)["run_id"]
    assert isinstance(run_id, str)
    return run_id


# -- help and usage ------------------------------------------------------------


def test_python_m_perdure_help_lists_the_commands() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "perdure", "--help"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    for command in (
        "worker",
        "start",
        "runs",
        "show",
        "signal",
        "send",
        "waits",
        "resume",
        "cancel",
        "resolve",
        "migrate",
        "demo",
    ):
        assert command in done.stdout


def test_unknown_command_and_option_are_bad_input(shop: Shop) -> None:
    one_error_line(run("nonsense"), 2)
    one_error_line(run("runs", "--no-such-option"), 2)
    one_error_line(run("runs", "--state", "sleepy"), 2)
    one_error_line(run("runs", "--limit", "0"), 2)


# -- bad input: exit 2, one line ----------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["--args", "[1,"],
        ["--args", '{"not": "a list"}'],
        ["--kwargs", "[1]"],
        ["--kwargs", "{oops}"],
    ],
)
def test_malformed_json_arguments_exit_2(shop: Shop, args: list[str]) -> None:
    line = one_error_line(run("start", shop.target, "checkout", *args), 2)
    assert "--args" in line or "--kwargs" in line


def test_malformed_payload_exits_2(shop: Shop) -> None:
    run_id = start(shop, "approval", "--args", '["o-1"]')
    one_error_line(run("signal", run_id, "approve", "--payload", "{nope"), 2)
    one_error_line(run("send", run_id, "events", "k1", "--payload", "'x'"), 2)
    one_error_line(run("resolve", run_id, "charge", "--output", "nope"), 2)


@pytest.mark.parametrize(
    "args",
    [
        ["show", "no-such-run"],
        ["show", "no-such-run", "--history", "--json"],
        ["signal", "no-such-run", "approve", "--payload", "1"],
        ["send", "no-such-run", "events", "k1"],
        ["waits", "--run", "no-such-run"],
        ["resume", "no-such-run"],
        ["cancel", "no-such-run"],
        ["resolve", "no-such-run", "charge", "--output", "1"],
    ],
)
def test_unknown_run_exits_2(shop: Shop, args: list[str]) -> None:
    assert run("migrate").exit_code == 0  # the store exists; the run does not
    line = one_error_line(run(*args), 2)
    assert "run_not_found" in line


def test_unknown_workflow_exits_2(shop: Shop) -> None:
    line = one_error_line(run("start", shop.target, "no_such_workflow"), 2)
    assert "workflow_not_found" in line and "checkout" in line


@pytest.mark.parametrize(
    "url", ["mysql://x", "sqlite:///nonexistent-dir/x.db", "sqlite://:memory:", "no-scheme"]
)
@pytest.mark.parametrize("command", [["runs"], ["migrate"], ["show", "abc"], ["waits"]])
def test_unusable_store_url_exits_2(shop: Shop, url: str, command: list[str]) -> None:
    one_error_line(run(*command, "--store", url), 2)


def test_unusable_store_url_for_start_exits_2(shop: Shop) -> None:
    one_error_line(run("start", shop.target, "checkout", "--store", "mysql://x"), 2)


def test_module_that_does_not_import_exits_2(shop: Shop) -> None:
    (shop.path / "broken_mod.py").write_text("import perdure\nraise RuntimeError('boom')\n")
    (shop.path / "syntax_mod.py").write_text("def nope(:\n")
    try:
        assert "RuntimeError" in one_error_line(run("start", "broken_mod:app", "checkout"), 2)
        one_error_line(run("start", "syntax_mod:app", "checkout"), 2)
        one_error_line(run("worker", "broken_mod:app"), 2)
        one_error_line(run("start", "no_such_module_here:app", "checkout"), 2)
        one_error_line(run("start", f"{shop.module}:no_such_attr", "checkout"), 2)
        one_error_line(run("start", f"{shop.module}:textwrap", "checkout"), 2)
        one_error_line(run("start", shop.module, "checkout"), 2)
    finally:
        sys.modules.pop("broken_mod", None)
        sys.modules.pop("syntax_mod", None)


def test_worker_with_a_heartbeat_too_close_to_the_lease_exits_2(shop: Shop) -> None:
    line = one_error_line(run("worker", shop.target, "--lease-ttl", "6", "--heartbeat", "5"), 2)
    assert "lease_timing_invalid" in line


def test_resolve_needs_exactly_one_of_output_and_error(shop: Shop) -> None:
    run_id = start(shop, "checkout", "--args", '["o-1"]')
    one_error_line(run("resolve", run_id, "charge"), 2)
    one_error_line(run("resolve", run_id, "charge", "--output", "1", "--error", "x"), 2)


def test_timeout_without_wait_is_bad_input(shop: Shop) -> None:
    one_error_line(run("start", shop.target, "checkout", "--timeout", "3"), 2)


def test_errors_in_json_mode_also_print_a_document(shop: Shop) -> None:
    assert run("migrate").exit_code == 0
    result = run("show", "no-such-run", "--json")
    one_error_line(result, 2)
    assert as_json(result)["error"]["code"] == "run_not_found"


# -- commands that work ---------------------------------------------------------


def test_start_then_runs_and_show(shop: Shop) -> None:
    run_id = start(shop, "checkout", "--args", '["o-1"]')

    listed = run("runs", "--app", "clishop", "--json")
    assert listed.exit_code == 0, listed.output
    docs = as_json(listed)
    assert [d["run_id"] for d in docs] == [run_id]
    assert docs[0]["state"] == "queued" and docs[0]["workflow"] == "checkout"

    shown = run("show", run_id, "--json")
    assert shown.exit_code == 0, shown.output
    doc = as_json(shown)
    assert doc["run_id"] == run_id and doc["app"] == "clishop"
    assert doc["version"] == "1" and doc["state"] == "queued" and doc["error"] is None
    assert doc["created_at"].endswith("+00:00")

    history = as_json(run("show", run_id, "--history", "--json"))["history"]
    assert [h["kind"] for h in history] == ["initialized"] and history[0]["sequence"] == 1

    human = run("runs", "--app", "clishop")
    assert human.exit_code == 0 and run_id in human.stdout and "queued" in human.stdout
    assert run("show", run_id, "--history").exit_code == 0
    assert "no runs in app default" in run("runs", "--app", "default").stdout
    assert as_json(run("runs", "--app", "clishop", "--state", "succeeded", "--json")) == []


def test_start_with_a_key_returns_the_same_run(shop: Shop) -> None:
    first = start(shop, "checkout", "--args", '["o-1"]', "--key", "order-1")
    again = start(shop, "checkout", "--args", '["o-1"]', "--key", "order-1")
    assert first == again


def test_kwargs_are_passed(shop: Shop) -> None:
    run_id = start(shop, "checkout", "--kwargs", '{"order_id": "o-9"}')
    assert as_json(run("show", run_id, "--json"))["state"] == "queued"


def test_cancel_a_queued_run_then_again(shop: Shop) -> None:
    run_id = start(shop, "checkout", "--args", '["o-1"]')
    first = run("cancel", run_id)
    assert first.exit_code == 0, first.output
    assert "canceled" in first.stdout
    assert as_json(run("show", run_id, "--json"))["state"] == "canceled"

    again = run("cancel", run_id)
    one_error_line(again, 1)
    again_json = run("cancel", run_id, "--json")
    one_error_line(again_json, 1)
    doc = as_json(again_json)
    assert doc["canceled"] is False and doc["refused"]["code"] == "not_canceled"


def test_resolve_on_a_run_not_in_needs_attention_is_refused(shop: Shop) -> None:
    run_id = start(shop, "checkout", "--args", '["o-1"]')
    line = one_error_line(run("resolve", run_id, "charge", "--output", '"ch_1"'), 1)
    assert "not_resolvable" in line
    result = run("resolve", run_id, "charge", "--error", "declined", "--json")
    one_error_line(result, 1)
    assert as_json(result)["refused"]["code"] == "not_resolvable"


def test_signal_send_waits_resume_on_finished_and_queued_runs(shop: Shop) -> None:
    run_id = start(shop, "approval", "--args", '["o-1"]')
    assert as_json(run("waits", "--run", run_id, "--json")) == []
    assert as_json(run("waits", "--app", "clishop", "--json")) == []
    assert "no open waits" in run("waits").stdout

    resumed = run("resume", run_id, "--json")
    assert resumed.exit_code == 0, resumed.output
    assert as_json(resumed) == {"run_id": run_id, "requeued": False, "state": "queued"}

    sent = run("send", run_id, "events", "k1", "--payload", '{"n": 1}', "--json")
    assert sent.exit_code == 0 and as_json(sent)["stored"] is True
    dup = run("send", run_id, "events", "k1", "--payload", '{"n": 2}', "--json")
    assert dup.exit_code == 0 and as_json(dup)["stored"] is False

    assert run("cancel", run_id).exit_code == 0
    one_error_line(run("signal", run_id, "approve", "--payload", "true"), 1)
    one_error_line(run("send", run_id, "events", "k2"), 1)
    one_error_line(run("resume", run_id), 1)


def test_commands_work_on_each_store(store_url: str, shop: Shop) -> None:
    if (
        store_url.startswith("postgres")
        and importlib.util.find_spec("perdure.store.postgres") is None
    ):
        pytest.skip("perdure.store.postgres does not exist yet")
    assert run("migrate", "--store", store_url).exit_code == 0
    run_id = start(shop, "checkout", "--args", '["o-1"]', "--store", store_url)
    listed = as_json(run("runs", "--app", "clishop", "--store", store_url, "--json"))
    assert [d["run_id"] for d in listed] == [run_id]
    assert as_json(run("show", run_id, "--store", store_url, "--json"))["state"] == "queued"
    # The run is not in the default store: commands look in the one they are given.
    one_error_line(run("show", run_id), 2)
    assert run("cancel", run_id, "--store", store_url).exit_code == 0
    one_error_line(run("cancel", run_id, "--store", store_url), 1)


def test_migrate(shop: Shop) -> None:
    result = run("migrate", "--json")
    assert result.exit_code == 0, result.output
    assert as_json(result) == {"store": shop.url, "migrated": True}
    assert run("migrate").exit_code == 0


def test_password_is_not_echoed(shop: Shop) -> None:
    result = run("runs", "--store", "postgresql://u:s3cret@127.0.0.1:1/none")
    assert result.exit_code == 2
    assert "s3cret" not in result.output


# -- a worker process, end to end -----------------------------------------------------


@pytest.fixture
def worker(shop: Shop) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "perdure",
            "worker",
            shop.target,
            "--lease-ttl",
            "3",
            "--heartbeat",
            "1",
        ],
        cwd=shop.path,
        env=shop.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        about = proc.stdout.readline()
        assert "serving app clishop" in about and f"pid {proc.pid}" in about
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.mark.slow
def test_worker_runs_what_start_starts(shop: Shop, worker: subprocess.Popen[str]) -> None:
    done = run(
        "start", shop.target, "checkout", "--args", '["o-1"]', "--wait", "--timeout", "30", "--json"
    )
    assert done.exit_code == 0, done.output
    doc = as_json(done)
    assert doc["state"] == "succeeded" and doc["result"] == {"charge": "ch_o-1_1200"}

    # A once step that raises stops the run in needs_attention; the operator resolves it.
    failed = run(
        "start",
        shop.target,
        "checkout",
        "--args",
        '["fail-1"]',
        "--wait",
        "--timeout",
        "30",
        "--json",
    )
    one_error_line(failed, 1)
    stuck = as_json(failed)["run"]
    assert stuck["state"] == "needs_attention"
    assert stuck["error"]["code"] == "effect_outcome_unknown"

    listed = run("runs", "--app", "clishop", "--state", "needs_attention")
    assert listed.exit_code == 0
    assert "effect_outcome_unknown at step charge" in listed.stdout

    one_error_line(run("resolve", stuck["run_id"], "reserve", "--output", "1"), 1)
    resolved = run(
        "resolve",
        stuck["run_id"],
        "charge",
        "--output",
        '"ch_by_hand"',
        "--note",
        "checked the gateway",
    )
    assert resolved.exit_code == 0, resolved.output
    waited = CliRunner().invoke(cli.cli, ["show", stuck["run_id"], "--history", "--json"])
    assert waited.exit_code == 0
    kinds = [h["kind"] for h in as_json(waited)["history"]]
    assert "resolved" in kinds

    # A signal settles a wait once; a second, different signal is refused with the receipt.
    run_id = start(shop, "approval", "--args", '["o-2"]')
    _wait_for_state(run_id, "waiting")
    waits = as_json(run("waits", "--run", run_id, "--json"))
    assert [w["wait_id"] for w in waits] == [f"{run_id}/approve"]
    first = run(
        "signal", run_id, "approve", "--payload", '{"ok": true}', "--signal-id", "s1", "--json"
    )
    assert first.exit_code == 0, first.output
    receipt = as_json(first)
    assert receipt["outcome"] == "signaled" and receipt["signal_id"] == "s1"
    repeat = run(
        "signal", run_id, "approve", "--payload", '{"ok": true}', "--signal-id", "s1", "--json"
    )
    assert repeat.exit_code == 0 and as_json(repeat) == receipt
    # Named exactly ("approve#1": the first wait on the name), a settled wait
    # refuses, whether the run has applied it yet or ended; the bare name
    # would keep the signal for a second wait.
    other = run("signal", run_id, "approve#1", "--payload", "false", "--signal-id", "s2")
    one_error_line(other, 1)
    assert "s1" in other.stdout  # the stored receipt is printed
    other_json = run("signal", run_id, "approve#1", "--signal-id", "s2", "--json")
    one_error_line(other_json, 1)
    assert as_json(other_json)["receipt"] == receipt
    assert _wait_for_state(run_id, "succeeded")["result"] == {"ok": True}

    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=15) == 0


def _wait_for_state(run_id: str, state: str, timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        doc: dict[str, Any] = as_json(run("show", run_id, "--json"))
        if doc["state"] == state or time.monotonic() > deadline:
            assert doc["state"] == state, doc
            return doc
        time.sleep(0.1)


@pytest.mark.slow
def test_demo_runs_and_exits_0(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "perdure", "demo"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "killed with SIGKILL" in done.stdout
    assert "every step ran exactly once" in done.stdout
    assert "Traceback" not in done.stdout + done.stderr
    assert list(tmp_path.iterdir()) == []  # nothing left behind in the working directory


@pytest.mark.slow
def test_demo_json_report(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "perdure", "demo", "--json"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["ok"] is True
    assert report["counts"] == {"reserve_stock": 1, "charge_card": 1, "ship": 1, "notify": 1}
