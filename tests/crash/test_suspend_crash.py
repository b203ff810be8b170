"""A worker killed while its run is asked to suspend mid-step: the run ends suspended.

Worker A runs ``zombie_flow`` into its ``once`` step ``blocker`` (a marker
file says it is inside) and the run is asked to suspend. A is killed with
SIGKILL before the step returns. Worker B recovers the lapsed run, finds the
suspend asked, and lets go of it without running any workflow code: the run
is ``suspended`` with the effect's start journaled. Resumed, the run stops in
``needs_attention`` on ``blocker`` (its outcome is unknown), never re-running it.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from perdure import Client
from perdure.store import port

LEASE_TTL = 1.5
HEARTBEAT = 0.5
LIMIT = 20.0


def wait_for(check: Callable[[], Any], what: str, timeout: float = LIMIT) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)
    return value


def effects(env: dict[str, str]) -> list[str]:
    path = Path(env["CRASH_EFFECTS_LOG"])
    return path.read_text().split() if path.exists() else []


@pytest.mark.slow
def test_a_run_asked_to_suspend_whose_worker_died_ends_suspended(
    workers: Any,
    crash_env: dict[str, str],
    store: port.Store,
    tmp_path: Path,
) -> None:
    entered, release = tmp_path / "entered", tmp_path / "release"
    markers = {"ZOMBIE_ENTERED": str(entered), "ZOMBIE_RELEASE": str(release)}
    client = Client(store, "crash")
    run_id = client.start("zombie_flow", "1", [3]).run_id

    a = workers.start("a", via_cli=False, lease_ttl=LEASE_TTL, heartbeat=HEARTBEAT, **markers)
    wait_for(entered.exists, "worker A inside the blocker step")
    assert client.suspend(run_id) is True
    info = client.get(run_id)
    assert (info.state, info.suspend_requested) == ("running", True)
    os.kill(a.pid, signal.SIGKILL)
    a.wait(timeout=10)
    entered.unlink()

    b = workers.start("b", via_cli=False, lease_ttl=LEASE_TTL, heartbeat=HEARTBEAT, **markers)
    wait_for(lambda: client.get(run_id).state == "suspended", "the run to end suspended")
    journal = store.journal(run_id)
    assert [(e.name, e.status) for e in journal] == [("s1", "ok"), ("blocker", "started")]
    kinds = [p.kind for p in client.history(run_id)]
    assert kinds[-3:] == ["suspend_requested", "recovered", "suspended"]
    assert not entered.exists()  # B ran no workflow code
    assert effects(crash_env) == ["s1"]

    assert client.resume(run_id) is True
    wait_for(lambda: client.get(run_id).state == "needs_attention", "the run to need attention")
    error = client.get(run_id).error or {}
    assert (error["code"], error["step"]) == ("effect_outcome_unknown", "blocker")
    assert not entered.exists()
    assert effects(crash_env) == ["s1"]
    assert workers.stop(b) == 0, workers.log("b")
