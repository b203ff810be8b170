"""Leases tell a slow step from a dead worker, and SIGTERM lets a step finish.

Real ``perdure worker`` processes serve ``liveness_app``; every step body
appends ``<step> <pid>`` to the effects log, so the test counts executions
from what the steps recorded, not from the engine's counters.

* A step that holds the GIL for seconds (a backtracking regex) starves every
  thread of its worker, the heartbeat thread included; the lease keeper
  process renews the lease anyway, so a second worker present the whole time
  never takes the run over.
* SIGTERM while a step runs: the worker keeps renewing until the step's
  outcome is recorded, then hands the run over; nothing runs twice. A second
  SIGTERM (or the end of ``--grace``) stops at once and says what it left.
* A worker killed with SIGKILL takes its keeper with it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import perdure

HERE = Path(__file__).resolve().parent
LIMIT = 60.0


def wait_for(check: Callable[[], Any], what: str, timeout: float = LIMIT) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


class Fleet:
    """Worker processes of ``liveness_app``, all stopped at teardown."""

    def __init__(self, env: dict[str, str], logs: Path) -> None:
        self.env = env
        self.logs = logs
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, *options: str, lease_ttl: float, heartbeat: float) -> int:
        command = [
            sys.executable,
            "-m",
            "perdure",
            "worker",
            "liveness_app:app",
            "--concurrency",
            "1",
            "--lease-ttl",
            str(lease_ttl),
            "--heartbeat",
            str(heartbeat),
            *options,
        ]
        with open(self.logs / f"{name}.log", "wb") as log:
            proc = subprocess.Popen(
                command, cwd=HERE, env=self.env, stdout=log, stderr=subprocess.STDOUT
            )
        self.procs[name] = proc
        wait_for(lambda: "serving app" in self.log(name), f"worker {name} to serve")
        return proc.pid

    def log(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text(errors="replace")

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
                proc.kill()
                proc.wait(timeout=10)


@pytest.fixture
def fleet(crash_env: dict[str, str], tmp_path: Path) -> Iterator[Fleet]:
    crash_env["LIVENESS_GATE"] = str(tmp_path / "gate")
    started = Fleet(crash_env, tmp_path)
    yield started
    Path(crash_env["LIVENESS_GATE"]).touch()
    started.close()


@pytest.fixture
def app(store_url: str) -> Iterator[perdure.App]:
    client_app = perdure.App(store_url, name="liveness")
    yield client_app
    client_app.close()


def executions(env: dict[str, str]) -> list[tuple[str, int]]:
    """The (step, pid) of every step body that started, in order."""
    path = Path(env["CRASH_EFFECTS_LOG"])
    lines = path.read_text().split("\n") if path.exists() else []
    return [(step, int(pid)) for step, pid in (line.split() for line in lines if line)]


def receipts(app: perdure.App, run_id: str) -> list[str]:
    return [receipt.kind for receipt in app.history(run_id)]


# -- a step that holds the GIL ---------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("effect_class", ["idempotent", "once"])
def test_a_step_holding_the_gil_keeps_its_lease(
    effect_class: str, fleet: Fleet, app: perdure.App, crash_env: dict[str, str]
) -> None:
    # The lease lapses in 1.5 s unless renewed; the step holds the GIL for 4 s.
    pids = {fleet.start(name, lease_ttl=1.5, heartbeat=0.5) for name in ("a", "b")}
    handle = app.client.start("hog", "1", [effect_class])
    assert handle.result(timeout=LIMIT) == [True, "after:x"]

    ran = executions(crash_env)
    hog = [pid for step, pid in ran if step == f"hog_{effect_class}"]
    assert len(hog) == 1, f"the GIL-bound step ran {len(hog)} times: {ran}"
    assert hog[0] in pids
    assert "recovered" not in receipts(app, handle.run_id)
    assert app.get(handle.run_id).attempt == 1


# -- SIGTERM ---------------------------------------------------------------------

LEASE_TTL = 1.0
HEARTBEAT = 0.3


def _step_started(env: dict[str, str], step: str) -> list[int]:
    return [pid for name, pid in executions(env) if name == step]


@pytest.mark.slow
@pytest.mark.parametrize("effect_class", ["idempotent", "once"])
def test_sigterm_lets_the_step_finish_before_handing_the_run_over(
    effect_class: str, fleet: Fleet, app: perdure.App, crash_env: dict[str, str]
) -> None:
    first = fleet.start("a", lease_ttl=LEASE_TTL, heartbeat=HEARTBEAT)
    handle = app.client.start("gated", "1", [effect_class])
    step = f"gated_{effect_class}"
    wait_for(lambda: _step_started(crash_env, step), f"{step} to start")
    second = fleet.start("b", lease_ttl=LEASE_TTL, heartbeat=HEARTBEAT)

    os.kill(first, signal.SIGTERM)
    # Real time is the point: three lease TTLs pass with the step still running.
    # A worker that stopped renewing would have lost the run to b by now.
    time.sleep(3 * LEASE_TTL)
    assert _step_started(crash_env, step) == [first]
    assert fleet.procs["a"].poll() is None, "the stopping worker left before its step ended"

    Path(crash_env["LIVENESS_GATE"]).touch()
    assert handle.result(timeout=LIMIT) == ["done:x", "after:x"]
    assert fleet.procs["a"].wait(timeout=LIMIT) == 0
    assert _step_started(crash_env, step) == [first]
    # The run was handed over after the step's outcome was recorded.
    assert _step_started(crash_env, "after") == [second]
    kinds = receipts(app, handle.run_id)
    assert "recovered" not in kinds
    assert "released" in kinds


@pytest.mark.slow
@pytest.mark.parametrize("how", ["second_signal", "grace"])
def test_stopping_at_once_leaves_a_once_step_for_an_operator(
    how: str, fleet: Fleet, app: perdure.App, crash_env: dict[str, str]
) -> None:
    grace = ["--grace", "0.5"] if how == "grace" else []
    first = fleet.start("a", *grace, lease_ttl=LEASE_TTL, heartbeat=HEARTBEAT)
    handle = app.client.start("gated", "1", ["once"])
    wait_for(lambda: _step_started(crash_env, "gated_once"), "gated_once to start")
    fleet.start("b", lease_ttl=LEASE_TTL, heartbeat=HEARTBEAT)

    os.kill(first, signal.SIGTERM)
    if how == "second_signal":
        wait_for(
            lambda: "signal again to stop at once" in fleet.log("a"), "the first signal's notice"
        )
        os.kill(first, signal.SIGTERM)
    assert fleet.procs["a"].wait(timeout=LIMIT) == 1
    assert "gated_once: its outcome is unknown" in fleet.log("a")

    def attention() -> perdure.RunInfo | None:
        info = app.get(handle.run_id)
        return info if info.state == "needs_attention" else None

    info = wait_for(attention, "the run to need attention")
    assert info.error is not None
    assert info.error["code"] == "effect_outcome_unknown"
    assert info.error["step"] == "gated_once"
    assert _step_started(crash_env, "gated_once") == [first]


@pytest.mark.slow
def test_a_killed_worker_takes_its_keeper_with_it(
    fleet: Fleet, app: perdure.App, crash_env: dict[str, str]
) -> None:
    first = fleet.start("a", lease_ttl=LEASE_TTL, heartbeat=HEARTBEAT)
    handle = app.client.start("gated", "1", ["idempotent"])
    wait_for(lambda: _step_started(crash_env, "gated_idempotent"), "the step to start")
    keepers = wait_for(lambda: _keepers_of(first), "the keeper process")
    fleet.start("b", lease_ttl=LEASE_TTL, heartbeat=HEARTBEAT)

    os.kill(first, signal.SIGKILL)
    fleet.procs["a"].wait(timeout=LIMIT)
    wait_for(lambda: not any(_exists(pid) for pid in keepers), "the keeper to exit", 10)
    # b recovers the run once the lease lapses, and runs the step again.
    wait_for(lambda: len(_step_started(crash_env, "gated_idempotent")) == 2, "the takeover")
    Path(crash_env["LIVENESS_GATE"]).touch()
    assert handle.result(timeout=LIMIT) == ["done:x", "after:x"]
    assert "recovered" in receipts(app, handle.run_id)


def _keepers_of(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if int(stat[1]) == pid and b"perdure.keeper" in cmdline:
            found.append(int(entry.name))
    return found


def _exists(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
