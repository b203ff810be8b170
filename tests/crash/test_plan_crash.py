"""A worker process dies (SIGKILL) in the middle of a plan's task; another one takes over.

The task's own record (``PLAN_LOG`` of ``plan_app``) says how many times its
body ran and in which process; the task rows and the ledger must agree. An
idempotent task is recovered and run again; a ``once`` task whose effect had
started is never run again (``effect_outcome_unknown``); a task that kills
every worker that runs it stops after ``max_recoveries`` (``poison_task``).
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import plan_app
import pytest

import perdure

LEASE_TTL = 1.5
HEARTBEAT = 0.3
LIMIT = 10.0  # seconds: a bound on any wait (a lease lapse and a worker's boot fit well)


def until(check: Callable[[], Any], what: str, timeout: float = LIMIT) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)
    return value


def recorded(path: Path) -> list[tuple[str, int]]:
    """The task bodies that ran, in order, as ``(task, pid)``."""
    if not path.exists():
        return []
    return [
        (task, int(pid))
        for task, pid in (line.split() for line in path.read_text().split("\n") if line)
    ]


@pytest.fixture
def app(store_url: str) -> Iterator[perdure.App]:
    """The test's own App on the workers' store, with the same plans."""
    made = perdure.App(store_url, name="plans")
    plan_app.declare(made)
    yield made
    made.close()


def start_worker(plan_workers: Any, name: str) -> Any:
    return plan_workers.start(name, lease_ttl=LEASE_TTL, heartbeat=HEARTBEAT)


def ended(app: perdure.App, run_id: str) -> perdure.RunInfo:
    info: perdure.RunInfo = until(
        lambda: (i := app.get(run_id)).state not in ("queued", "running") and i,
        f"run {run_id} to end",
    )
    return info


def kill_mid_task(plan_workers: Any, app: perdure.App, run_id: str, task: str) -> int:
    """Wait until the first worker is inside ``task`` (its marker), SIGKILL it; return its pid."""
    entered = Path(plan_workers.env["PLAN_ENTERED"])
    until(entered.exists, f"task {task} to start")
    proc = plan_workers.procs[0]
    assert int(entered.read_text()) == proc.pid
    found = next(t for t in app.tasks(run_id) if t.name == task)
    assert (found.state, found.generation, found.recoveries) == ("running", 1, 0)
    assert found.worker is not None and f"-{proc.pid}-" in found.worker
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=LIMIT) == -signal.SIGKILL
    return int(proc.pid)


def test_a_task_whose_worker_was_killed_is_recovered_by_another_worker(
    app: perdure.App, plan_workers: Any, tmp_path: Path
) -> None:
    start_worker(plan_workers, "doomed")
    handle = app.start("recover", 5)
    killed = kill_mid_task(plan_workers, app, handle.run_id, "hang")
    at_kill = time.monotonic()

    survivor = start_worker(plan_workers, "survivor")
    try:
        info = ended(app, handle.run_id)
        took = time.monotonic() - at_kill
    finally:
        assert plan_workers.stop(survivor) == 0, plan_workers.log("survivor")

    assert info.state == "succeeded", (info.error, plan_workers.log("survivor"))
    assert info.result == {"hang": 10, "then": 11}
    # Not before the dead worker's lease lapsed: it was not renewed after the kill.
    assert took >= LEASE_TTL / 2, took
    assert recorded(tmp_path / "plan.log") == [
        ("hang", killed),
        ("hang", survivor.pid),
        ("then", survivor.pid),
    ]
    hang = next(t for t in app.tasks(handle.run_id) if t.name == "hang")
    assert (hang.state, hang.recoveries, hang.generation, hang.attempt) == ("succeeded", 1, 2, 2)
    assert hang.worker is not None and f"-{survivor.pid}-" in hang.worker
    ledger = [(r.kind, r.step) for r in app.history(handle.run_id)]
    assert ledger.count(("task_recovered", "hang")) == 1
    assert ledger.count(("task_claimed", "hang")) == 2
    recovered_at = ledger.index(("task_recovered", "hang"))
    assert ledger.index(("task_claimed", "hang")) < recovered_at
    assert recovered_at < ledger.index(("task_completed", "hang"))


def test_a_once_task_killed_after_its_effect_started_needs_attention(
    app: perdure.App, plan_workers: Any, tmp_path: Path
) -> None:
    start_worker(plan_workers, "doomed")
    handle = app.start("charge", 7)
    killed = kill_mid_task(plan_workers, app, handle.run_id, "charge")

    survivor = start_worker(plan_workers, "survivor")
    try:
        info = ended(app, handle.run_id)
        assert info.state == "needs_attention", (info.error, plan_workers.log("survivor"))
        assert info.error is not None
        assert (info.error["code"], info.error["task"]) == ("effect_outcome_unknown", "charge")
        tasks = {t.name: t for t in app.tasks(handle.run_id)}
        assert tasks["charge"].state == "needs_attention"
        assert tasks["charge"].error is not None
        assert tasks["charge"].error["code"] == "effect_outcome_unknown"
        assert (tasks["receipt"].state, tasks["receipt"].blocked_by) == ("blocked", "charge")
        # The body ran exactly once, in the killed worker: it is never run again.
        assert recorded(tmp_path / "plan.log") == [("charge", killed)]
        ledger = [(r.kind, r.step) for r in app.history(handle.run_id)]
        assert ledger.count(("effect_started", "charge")) == 1
        assert ("task_recovered", "charge") not in ledger

        # An operator who knows the outcome settles it; the run goes on from there.
        app.resolve(handle.run_id, "charge", output="charged by hand")
        assert handle.result(timeout=LIMIT) == {
            "charge": "charged by hand",
            "receipt": "charged by hand",
        }
    finally:
        assert plan_workers.stop(survivor) == 0, plan_workers.log("survivor")
    assert recorded(tmp_path / "plan.log") == [("charge", killed), ("receipt", survivor.pid)]


def test_a_cancel_while_an_idempotent_tasks_worker_is_gone_needs_attention(
    app: perdure.App, plan_workers: Any, tmp_path: Path
) -> None:
    start_worker(plan_workers, "doomed")
    handle = app.start("recover", 3)
    killed = kill_mid_task(plan_workers, app, handle.run_id, "hang")
    assert app.cancel(handle.run_id)
    # Nothing settles the task while its lease may still be held.
    assert app.get(handle.run_id).state == "running"

    survivor = start_worker(plan_workers, "survivor")
    try:
        info = ended(app, handle.run_id)
    finally:
        assert plan_workers.stop(survivor) == 0, plan_workers.log("survivor")

    # Whether the lost task's effect happened is unknown: never a clean cancel.
    assert info.state == "needs_attention", info.error
    assert info.error is not None
    assert (info.error["code"], info.error["task"]) == ("effect_outcome_unknown", "hang")
    tasks = {t.name: t for t in app.tasks(handle.run_id)}
    assert tasks["hang"].state == "needs_attention"
    assert tasks["then"].state == "canceled"
    assert recorded(tmp_path / "plan.log") == [("hang", killed)]


def test_a_task_that_kills_every_worker_stops_after_max_recoveries(
    app: perdure.App, plan_workers: Any, tmp_path: Path
) -> None:
    handle = app.start("poison")
    killed = []
    # max_recoveries=1: the first claim and one recovery run the body; each kills its worker.
    for name in ("first", "second"):
        proc = start_worker(plan_workers, name)
        assert proc.wait(timeout=LIMIT) == -signal.SIGKILL, plan_workers.log(name)
        killed.append(proc.pid)
        assert app.get(handle.run_id).state == "running"

    last = start_worker(plan_workers, "last")
    try:
        info = ended(app, handle.run_id)
    finally:
        assert plan_workers.stop(last) == 0, plan_workers.log("last")

    assert info.state == "needs_attention", info.error
    assert info.error is not None
    assert (info.error["code"], info.error["task"]) == ("poison_task", "poison")
    (task,) = app.tasks(handle.run_id)
    assert (task.state, task.recoveries, task.generation) == ("needs_attention", 1, 2)
    assert task.error is not None
    assert task.error["code"] == "poison_task"
    assert recorded(tmp_path / "plan.log") == [("poison", pid) for pid in killed]
    ledger = Counter((r.kind, r.step) for r in app.history(handle.run_id))
    assert ledger[("task_claimed", "poison")] == 2
    assert ledger[("task_recovered", "poison")] == 1
