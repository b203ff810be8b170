"""``perdure worker --log-format``: every line about a run names it, its app, workflow and step."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest
from test_runs import wait_state

import perdure
from perdure import logs

MODULE = textwrap.dedent(
    """
    import perdure

    app = perdure.App(name="logshop")
    calls = {"n": 0}


    @app.step(retry=perdure.Retry(max_attempts=3, initial_delay=0))
    def reserve(order_id: str) -> str:
        calls["n"] += 1
        if calls["n"] == 1:
            raise ConnectionError("inventory unreachable")
        return "held " + order_id


    @app.workflow(version="2")
    def checkout(ctx: perdure.Context, order_id: str) -> str:
        return reserve(order_id)
    """
)


def test_the_json_formatter_writes_one_object_with_the_run_fields() -> None:
    record = logging.LogRecord("perdure.worker", logging.WARNING, "f.py", 1, "a %s", ("b",), None)
    record.run_id, record.app, record.workflow, record.step, record.attempt = (
        "r1",
        "shop",
        "checkout",
        "reserve",
        2,
    )
    doc = json.loads(logs.JsonFormatter().format(record))
    assert doc["level"] == "WARNING" and doc["logger"] == "perdure.worker"
    assert doc["message"] == "a b"
    assert (doc["run_id"], doc["app"], doc["workflow"], doc["step"], doc["attempt"]) == (
        "r1",
        "shop",
        "checkout",
        "reserve",
        2,
    )
    assert doc["ts"].endswith("+00:00")
    plain = logging.LogRecord("perdure.worker", logging.INFO, "f.py", 1, "serving", (), None)
    assert set(json.loads(logs.JsonFormatter().format(plain))) == {
        "ts",
        "level",
        "logger",
        "message",
    }


def _serve_once(tmp_path: Path, store_url: str, log_format: str) -> tuple[str, list[str]]:
    """Run one checkout through a worker process; return its run id and the worker's stderr."""
    module = f"log_shop_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(MODULE, encoding="utf-8")
    app = perdure.App(store_url, name="logshop")
    try:

        @app.workflow(version="2")
        def checkout(ctx: perdure.Context, order_id: str) -> str:
            raise AssertionError("runs in the worker process")

        handle = app.start(checkout, "o-7")
        env = {**os.environ, "PERDURE_STORE": store_url, "PYTHONPATH": str(tmp_path)}
        proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "perdure", "worker", f"{module}:app"),
                *("--lease-ttl", "3", "--heartbeat", "1", "--log-format", log_format),
            ],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            info = wait_state(app, handle.run_id, "succeeded", "failed", "needs_attention")
            assert info.state == "succeeded", info.error
        finally:
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=30)
        return handle.run_id, err.splitlines()
    finally:
        app.close()


@pytest.mark.slow
def test_json_logs_carry_the_run_fields(tmp_path: Path, store_url: str) -> None:
    run_id, lines = _serve_once(tmp_path, store_url, "json")
    docs: list[dict[str, Any]] = [json.loads(line) for line in lines]  # every line is JSON
    about_run = [d for d in docs if d.get("run_id") == run_id]
    assert about_run, lines
    for doc in about_run:
        assert {"ts", "level", "logger", "message"} <= set(doc)
        assert (doc["app"], doc["workflow"], doc["version"]) == ("logshop", "checkout", "2")
    [failed] = [d for d in about_run if d.get("step") == "reserve"]
    assert (failed["level"], failed["attempt"]) == ("WARNING", 1)
    assert "ConnectionError: inventory unreachable" in failed["message"]
    assert any(d["message"].endswith(": succeeded") for d in about_run)


@pytest.mark.slow
def test_text_logs_name_the_run_app_workflow_and_step(tmp_path: Path, store_url: str) -> None:
    run_id, lines = _serve_once(tmp_path, store_url, "text")
    about_run = [line for line in lines if run_id in line]
    assert len(about_run) >= 3, lines
    assert all(f"run {run_id} (app logshop, workflow checkout v2" in line for line in about_run)
    assert any(
        "step reserve, attempt 1): failed; retrying (ConnectionError" in line for line in about_run
    )
