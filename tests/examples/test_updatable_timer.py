"""examples/updatable_timer: move the alarm while it waits, kill the worker, it rings once.

The example's module is loaded afresh with ``$PERDURE_STORE`` naming the
test's store (for the client side); real ``perdure worker`` processes serve
it. The first worker is killed (SIGKILL) right after it answered a move,
while the run may still hold its claim; a second worker rings the alarm at
the moved deadline, never at the first one.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import ModuleType

import pytest

import perdure

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "updatable_timer"
LIMIT = 30.0


@pytest.fixture
def example(store_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    monkeypatch.setenv("PERDURE_STORE", store_url)
    spec = importlib.util.spec_from_file_location("updatable_timer_example", EXAMPLE / "alarm.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    try:
        yield module
    finally:
        module.app.close()


def worker(store_url: str, tmp_path: Path, name: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PERDURE_STORE": store_url, "PYTHONPATH": str(EXAMPLE)}
    command = [
        sys.executable, "-m", "perdure", "worker", "alarm:app",
        "--lease-ttl", "2", "--heartbeat", "0.5",
    ]  # fmt: skip
    with open(tmp_path / f"{name}.log", "wb") as log:
        return subprocess.Popen(command, cwd=EXAMPLE, env=env, stdout=log, stderr=log)


def state_becomes(app: perdure.App, run_id: str, state: str) -> None:
    deadline = time.monotonic() + LIMIT
    while app.get(run_id).state != state:
        assert time.monotonic() < deadline, f"run {run_id} never became {state}"
        time.sleep(0.02)


@pytest.mark.slow
def test_a_moved_alarm_rings_once_at_the_new_deadline_across_a_killed_worker(
    example: ModuleType, store_url: str, tmp_path: Path
) -> None:
    app: perdure.App = example.app
    first = datetime.now(UTC) + timedelta(hours=1)
    run_id = app.start("alarm", first.isoformat()).run_id
    with pytest.raises(perdure.UpdateRejected):
        app.update(run_id, "move", "tomorrow-ish", timeout=0)
    killed = worker(store_url, tmp_path, "killed")
    try:
        state_becomes(app, run_id, "waiting")
        moved = datetime.now(UTC) + timedelta(seconds=3)
        answer = app.update(run_id, "move", moved.isoformat(), update_id="m-1", timeout=LIMIT)
        assert answer == {"deadline": moved.isoformat(), "moves": 1}
        killed.send_signal(signal.SIGKILL)
        assert killed.wait(LIMIT) == -signal.SIGKILL
    finally:
        if killed.poll() is None:
            killed.kill()
    recovering = worker(store_url, tmp_path, "recovering")
    try:
        result = app.handle(run_id).result(timeout=LIMIT)
    finally:
        recovering.terminate()
        assert recovering.wait(LIMIT) == 0, (tmp_path / "recovering.log").read_text()
    assert result["rang"] is True
    assert (result["deadline"], result["moves"]) == (moved.isoformat(), 1)
    assert moved <= datetime.fromisoformat(result["at"]) < first
    # The move was applied once: its sender's retry gets the same answer.
    assert app.update(run_id, "move", moved.isoformat(), update_id="m-1") == answer
    kinds = [(e.kind, e.status) for e in app.store.journal(run_id)]
    assert kinds == [
        ("now", "ok"),
        ("first", "ok"),
        ("respond", "ok"),
        ("now", "ok"),
        ("first", "ok"),
        ("now", "ok"),
    ]
