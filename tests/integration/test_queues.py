"""Queues: limits across worker processes, rates, priorities, and the API's refusals.

The fleet tests start three ``queue_app.py`` worker processes on one store;
the steps record their start and end times to side files, and the limits are
checked from those records.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import perdure
from perdure import cli, errors

HERE = Path(__file__).resolve().parent
WORKERS = 3


def _until(check: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _records(side: Path) -> list[tuple[str, str, float, float]]:
    found = []
    for path in side.glob("*.log"):
        for line in path.read_text(encoding="utf-8").splitlines():
            name, key, start, end = line.split(" ")
            found.append((name, key, float(start), float(end)))
    return sorted(found, key=lambda r: r[2])


def _most_at_once(intervals: list[tuple[float, float]]) -> int:
    """The most intervals open at one instant (an end before a start at the same instant)."""
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    level = most = 0
    for _, change in events:
        level += change
        most = max(most, level)
    return most


@pytest.fixture
def fleet(store_url: str, tmp_path: Path) -> Iterator[tuple[perdure.App, Path]]:
    """Three worker processes serving queue_app on this test's store; the app and side dir."""
    side = tmp_path / "side"
    side.mkdir()
    env = {
        **os.environ,
        "PERDURE_STORE": store_url,
        "QUEUE_SIDE": str(side),
        "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
    }
    # The same app as the workers', without their code: starts go by name.
    app = perdure.App(store_url, name="queued")
    app.queue("pair", concurrency=2, per_key=1)
    app.queue("paced", rate=perdure.Rate(10, per=timedelta(seconds=1)))

    @app.workflow("job")
    def job(ctx: perdure.Context, name: str, key: str, seconds: float) -> None:
        raise AssertionError("the workers run this")

    procs = [
        subprocess.Popen(
            [sys.executable, str(HERE / "queue_app.py")],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=(tmp_path / f"worker-{i}.log").open("wb"),
        )
        for i in range(WORKERS)
    ]
    try:
        yield app, side
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
        app.close()


def _wait_all(app: perdure.App, handles: list[Any]) -> None:
    for handle in handles:
        handle.result(timeout=60)


def test_three_workers_never_exceed_concurrency_or_per_key(
    fleet: tuple[perdure.App, Path],
) -> None:
    app, side = fleet
    keys = [f"customer-{i}" for i in range(5)]
    handles = [
        app.start("job", f"r{i}", key, 0.03, queue="pair", queue_key=key)
        for i, key in zip(range(60), itertools.cycle(keys), strict=False)
    ]
    _wait_all(app, handles)
    records = _records(side)
    assert len(records) == 60
    assert _most_at_once([(s, e) for _, _, s, e in records]) <= 2
    for key in keys:
        assert _most_at_once([(s, e) for _, k, s, e in records if k == key]) <= 1
    # The limit was reached, not just respected by a lone worker.
    assert _most_at_once([(s, e) for _, _, s, e in records]) == 2


def test_three_workers_keep_a_rate_of_ten_per_second(fleet: tuple[perdure.App, Path]) -> None:
    app, side = fleet
    handles = [app.start("job", f"r{i}", "k", 0.0, queue="paced") for i in range(30)]
    _wait_all(app, handles)
    starts = [s for _, _, s, _ in _records(side)]
    assert len(starts) == 30
    # A step starts after its run's claim by up to LAG seconds, so any LAG-shorter
    # window of step starts holds starts claimed within one second: 10 at most.
    lag = 0.5
    for index, first in enumerate(starts):
        within = [s for s in starts[index:] if s < first + (1.0 - lag)]
        assert len(within) <= 10, (first, within)
    # 30 starts at 10 per second take two windows past the first.
    assert starts[-1] - starts[0] >= 2.0 - lag


def test_one_worker_takes_lower_priority_numbers_first(
    make_app: Callable[..., perdure.App],
) -> None:
    app = make_app()
    app.queue("ranked", concurrency=1)
    order: list[str] = []

    @app.workflow()
    def ranked(ctx: perdure.Context, name: str) -> None:
        order.append(name)

    plan = [("late", 9), ("first-a", 1), ("middle", 5), ("first-b", 1), ("default", None)]
    handles = []
    for name, priority in plan:
        extra = {} if priority is None else {"priority": priority}
        handles.append(app.start(ranked, name, queue="ranked", **extra))
        time.sleep(0.002)  # first come, first served within a priority needs distinct instants
    with app.worker(concurrency=4, poll_interval=0.05, liveness="thread"):
        for handle in handles:
            handle.result(timeout=30)
    assert order == ["default", "first-a", "first-b", "middle", "late"]


def test_start_refuses_bad_placement(make_app: Callable[..., perdure.App]) -> None:
    app = make_app()
    app.queue("emails", concurrency=10, per_key=1, rate=perdure.Rate(100, per=timedelta(minutes=1)))

    @app.workflow()
    def send(ctx: perdure.Context, to: str) -> str:
        return to

    with pytest.raises(errors.UnknownQueue) as unknown:
        app.start(send, "u-7", queue="sms")
    assert unknown.value.code == "unknown_queue"
    cases: list[dict[str, Any]] = [
        {"queue_key": "customer-7"},
        {"priority": 1},
        {"queue": "emails", "priority": "1"},
        {"queue": "emails", "priority": 1.5},
        {"queue": "emails", "priority": True},
        {"queue": "emails", "priority": 2**40},
        {"queue": "emails", "queue_key": 7},
    ]
    for case in cases:
        with pytest.raises(errors.InvalidQueue) as bad:
            app.start(send, "u-7", **case)
        assert bad.value.code == "invalid_queue", case
    for limits in ({"concurrency": -1}, {"per_key": 0}, {"concurrency": 1.5}, {"rate": 5}):
        with pytest.raises(errors.InvalidQueue):
            app.queue("other", **limits)
    with pytest.raises(errors.InvalidQueue):
        perdure.Rate(0, per=timedelta(seconds=1))
    with pytest.raises(errors.InvalidQueue):
        perdure.Rate(1, per=timedelta(0))
    assert app.runs() == []


def test_start_places_the_run_and_queues_lists_it(make_app: Callable[..., perdure.App]) -> None:
    app = make_app()
    emails = app.queue(
        "emails", concurrency=10, per_key=1, rate=perdure.Rate(100, per=timedelta(minutes=1))
    )

    @app.workflow()
    def send_email(ctx: perdure.Context, to: str) -> str:
        return to

    handle = app.start(send_email, "u-7", queue=emails, queue_key="customer-7", priority=1)
    info = app.get(handle.run_id)
    assert (info.queue, info.queue_key, info.priority) == ("emails", "customer-7", 1)
    [listed] = app.queues()
    assert listed == perdure.QueueInfo(
        app.name, "emails", 10, 1, perdure.Rate(100, per=timedelta(minutes=1)), 0, 1
    )
    # Declaring it again with other limits updates the stored ones.
    app.queue("emails", concurrency=3)
    [again] = app.queues()
    assert (again.concurrency, again.per_key, again.rate) == (3, None, None)
    plain = app.get(app.start(send_email, "u-8").run_id)
    assert (plain.queue, plain.queue_key, plain.priority) == (None, None, 0)


def test_cli_start_in_a_queue_and_list_queues(
    store_url: str, tmp_path: Path, monkeypatch: Any
) -> None:
    name = f"cli_queue_app_{uuid.uuid4().hex[:8]}"
    module = tmp_path / f"{name}.py"
    module.write_text(
        "import perdure\n"
        f"app = perdure.App({store_url!r}, name='cli_queued')\n"
        "app.queue('emails', concurrency=2, per_key=1)\n"
        "@app.workflow()\n"
        "def send(ctx: perdure.Context, to: str) -> str:\n"
        "    return to\n",
        encoding="utf-8",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    runner = CliRunner()
    started = runner.invoke(
        cli.cli,
        [
            "start",
            f"{name}:app",
            "send",
            "--args",
            '["u-1"]',
            "--queue",
            "emails",
            "--queue-key",
            "c-1",
            "--priority",
            "2",
            "--json",
        ],
    )
    assert started.exit_code == 0, started.output
    doc = json.loads(started.output)
    assert (doc["queue"], doc["queue_key"], doc["priority"]) == ("emails", "c-1", 2)
    refused = runner.invoke(
        cli.cli, ["start", f"{name}:app", "send", "--args", '["u-1"]', "--queue", "sms"]
    )
    assert refused.exit_code != 0 and "unknown_queue" in refused.output
    listed = runner.invoke(cli.cli, ["queues", "--store", store_url, "--json"])
    assert listed.exit_code == 0, listed.output
    assert json.loads(listed.output) == [
        {
            "app": "cli_queued",
            "name": "emails",
            "concurrency": 2,
            "per_key": 1,
            "rate": None,
            "running": 0,
            "waiting": 1,
        }
    ]
    table = runner.invoke(cli.cli, ["queues", "--store", store_url])
    assert "emails" in table.output and "WAITING" in table.output


def test_astart_places_the_run_too(make_app: Callable[..., perdure.App]) -> None:
    app = make_app()
    app.queue("q", concurrency=1)

    @app.workflow()
    def echo(ctx: perdure.Context, x: int) -> int:
        return x

    handle = asyncio.run(app.astart(echo, 1, queue="q", queue_key="k", priority=-3))
    info = app.get(handle.run_id)
    assert (info.queue, info.queue_key, info.priority) == ("q", "k", -3)
    with pytest.raises(errors.UnknownQueue):
        asyncio.run(app.astart(echo, 1, queue="nope"))
