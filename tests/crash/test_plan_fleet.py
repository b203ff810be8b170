"""Three worker processes share the independent tasks of one plan run, in parallel.

Judged from what the tasks recorded (``<task> <pid> <start> <end>`` in the
side file of ``plan_app``), not from the engine's counters; then the task
rows must agree: each names the worker (host and pid) that ran it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import plan_app

import perdure

WORKERS = 3
LIMIT = 15.0  # seconds: a bound on any wait, never a pause


def until(check: Callable[[], Any], what: str, timeout: float = LIMIT) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)
    return value


def intervals(path: Path) -> dict[str, tuple[int, float, float]]:
    """Each task's recorded ``(pid, start, end)``; a task recorded twice fails the test."""
    found: dict[str, tuple[int, float, float]] = {}
    for line in path.read_text().splitlines():
        task, pid, start, end = line.split()
        assert task not in found, f"task {task} ran twice"
        found[task] = (int(pid), float(start), float(end))
    return found


def test_a_plans_independent_tasks_run_in_parallel_across_worker_processes(
    store_url: str, plan_workers: Any, tmp_path: Path
) -> None:
    names = [f"w{i}" for i in range(1, WORKERS + 1)]
    procs = {
        n: plan_workers.start(
            n, lease_ttl=1.5, heartbeat=0.3, PLAN_CONCURRENCY="4", FLEET_SLEEP="0.5"
        )
        for n in names
    }
    # Every worker polls before the run exists, so none takes it all alone.
    until(lambda: all(plan_workers.serving(n) for n in names), "the workers to serve")
    app = perdure.App(store_url, name="plans")
    try:
        plans = plan_app.declare(app)
        handle = app.start(plans["fleet"])
        result = handle.result(timeout=LIMIT)
        assert result == {name: name for name in plan_app.FLEET}
        tasks = app.tasks(handle.run_id)
    finally:
        app.close()
        for name, proc in procs.items():
            assert plan_workers.stop(proc) == 0, plan_workers.log(name)

    ran = intervals(tmp_path / "plan.log")
    assert sorted(ran) == list(plan_app.FLEET)
    pids = {pid for pid, _, _ in ran.values()}
    assert len(pids) >= 2, ran
    assert pids <= {p.pid for p in procs.values()}
    overlapping = [
        (a, b)
        for a, (pa, sa, ea) in ran.items()
        for b, (pb, sb, eb) in ran.items()
        if a < b and pa != pb and sa < eb and sb < ea
    ]
    assert overlapping, ran

    # The task rows agree with the record: the worker id names the pid that ran each task.
    assert [t.name for t in tasks] == list(plan_app.FLEET)
    assert all((t.state, t.attempt, t.recoveries) == ("succeeded", 1, 0) for t in tasks)
    workers = {t.name: t.worker for t in tasks}
    assert len(set(workers.values())) >= 2, workers
    for name, worker in workers.items():
        assert worker is not None
        assert f"-{ran[name][0]}-" in worker, (name, worker, ran[name])


def test_a_task_longer_than_its_lease_is_renewed_not_taken_by_another_worker(
    store_url: str, plan_workers: Any, tmp_path: Path
) -> None:
    lease_ttl = 1.0
    names = ["w1", "w2"]
    procs = {
        n: plan_workers.start(
            n, lease_ttl=lease_ttl, heartbeat=0.3, PLAN_CONCURRENCY="12", FLEET_SLEEP="3.5"
        )
        for n in names
    }
    until(lambda: all(plan_workers.serving(n) for n in names), "the workers to serve")
    app = perdure.App(store_url, name="plans")
    try:
        handle = app.start(plan_app.declare(app)["fleet"])
        assert handle.result(timeout=LIMIT)
        tasks = app.tasks(handle.run_id)
    finally:
        app.close()
        for name, proc in procs.items():
            assert plan_workers.stop(proc) == 0, plan_workers.log(name)

    ran = intervals(tmp_path / "plan.log")  # refuses a task recorded twice
    assert sorted(ran) == list(plan_app.FLEET)
    assert all(end - start >= 3 * lease_ttl for _, start, end in ran.values())
    assert all((t.generation, t.recoveries, t.attempt) == (1, 0, 1) for t in tasks), tasks
