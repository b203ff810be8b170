"""Ownership postures on both stores: run-lease (the default) and none, with real workers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import perdure
from perdure import errors


def build(store_url: str) -> perdure.App:
    app = perdure.App(store_url, name=f"own_{uuid.uuid4().hex[:8]}")

    @app.step()
    def double(n: int) -> int:
        return n * 2

    @app.workflow()
    def twice(ctx: perdure.Context, n: int) -> int:
        return double(double(n))

    return app


def test_the_default_posture_is_run_lease_and_several_workers_share_the_app(
    store_url: str,
) -> None:
    app = build(store_url)
    handles = [app.start("twice", n) for n in range(6)]
    with app.worker(liveness="thread") as one, app.worker(liveness="thread") as two:
        assert one.ownership == two.ownership == "run-lease"
        assert [h.result(timeout=30) for h in handles] == [n * 4 for n in range(6)]
    app.close()


@pytest.mark.parametrize(
    ("first", "second"),
    [("run-lease", "none"), ("none", "run-lease"), ("none", "none")],
)
def test_a_worker_is_refused_while_another_posture_or_none_worker_serves_the_app(
    store_url: str, first: str, second: str
) -> None:
    app = build(store_url)
    with app.worker(liveness="thread", ownership=first, worker_id="first-worker"):
        refused = app.worker(liveness="thread", ownership=second, worker_id="second-worker")
        with pytest.raises(errors.OwnershipConflict) as caught:
            refused.start()
        assert caught.value.code == "ownership_conflict"
        message = str(caught.value)
        assert "first-worker" in message and "second-worker" in message
        assert f"ownership {first}" in message and f"ownership {second}" in message
    app.close()


def test_a_none_worker_runs_with_no_keeper_and_no_lease_renewal_and_frees_the_app_at_stop(
    store_url: str,
) -> None:
    app = build(store_url)
    worker = app.worker(ownership="none", lease_ttl=3, heartbeat=1)
    assert (worker.liveness, worker._keeper) == ("thread", None)
    renewals: list[Any] = []
    real_renew = app.store.renew

    def counting(*args: Any, **kwargs: Any) -> Any:
        renewals.append(args)
        return real_renew(*args, **kwargs)

    app.store.renew = counting  # type: ignore[method-assign]
    handles = [app.start("twice", n) for n in range(5)]
    with worker:
        assert [h.result(timeout=30) for h in handles] == [n * 4 for n in range(5)]
    assert renewals == []
    # Stopped cleanly: another posture may serve the app at once.
    with app.worker(liveness="thread"):
        assert app.start("twice", 5).result(timeout=30) == 20
    app.close()


def test_a_bad_posture_is_refused(tmp_path: Path) -> None:
    app = build(f"sqlite:///{tmp_path / 'db'}")
    with pytest.raises(errors.InvalidInput, match="ownership must be one of"):
        app.worker(ownership="shared")
    app.close()


APP_MODULE = """
import os
import time
from pathlib import Path

import perdure

app = perdure.App(name="ownapp")
HERE = Path(__file__).parent


def note(line: str) -> None:
    with (HERE / "effects.log").open("a") as f:
        f.write(line + "\\n")
        f.flush()
        os.fsync(f.fileno())


@app.step()
def first(order: str) -> str:
    note(f"first {order} {os.getpid()}")
    return order


@app.step()
def second(order: str) -> str:
    note(f"second-start {order} {os.getpid()}")
    while not (HERE / "go").exists():
        time.sleep(0.02)
    note(f"second-done {order} {os.getpid()}")
    return order


@app.workflow()
def ship(ctx: perdure.Context, order: str) -> str:
    return second(first(order))
"""


PERDURE = [sys.executable, "-m", "perdure"]
TIMING = ["--lease-ttl", "3", "--heartbeat", "1"]


def _wait_for(what: Callable[[], bool], why: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {why}")
        time.sleep(0.02)


def test_a_crashed_none_worker_blocks_others_until_its_record_expires_then_one_recovers(
    store_url: str, tmp_path: Path
) -> None:
    (tmp_path / "ownapp.py").write_text(textwrap.dedent(APP_MODULE))
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "PERDURE_STORE": store_url}
    effects = tmp_path / "effects.log"

    def state(run_id: str) -> str:
        shown = subprocess.run(
            [*PERDURE, "show", run_id, "--json"], env=env, capture_output=True, text=True
        )
        return str(json.loads(shown.stdout)["state"])

    def lines() -> list[str]:
        return effects.read_text().splitlines() if effects.exists() else []

    def worker() -> subprocess.Popen[str]:
        return subprocess.Popen(
            [*PERDURE, "worker", "ownapp:app", "--ownership", "none", *TIMING],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    started = subprocess.run(
        [*PERDURE, "start", "ownapp:app", "ship", "--args", '["o-1"]', "--json"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    run_id = json.loads(started.stdout)["run_id"]
    first = worker()
    assert first.stdout is not None
    first_id = first.stdout.readline().split()[1]
    try:
        _wait_for(lambda: any(x.startswith("second-start") for x in lines()), "step two")
    finally:
        first.send_signal(signal.SIGKILL)
        first.communicate(timeout=30)
    # Its record is still live: a second worker of any posture is refused, by name.
    refused = worker()
    out, err = refused.communicate(timeout=60)
    assert refused.returncode == 1, (out, err)
    assert "ownership_conflict" in err + out and f"worker {first_id} serves" in err + out
    # Once it expires (3 s after the last renewal), the next one takes over:
    # until then each new worker is refused and prints no serving line.
    deadline = time.monotonic() + 15
    while True:
        third = worker()
        assert third.stdout is not None
        if third.stdout.readline().startswith("worker "):
            break
        third.communicate(timeout=30)
        assert third.returncode == 1 and time.monotonic() < deadline
    try:
        _wait_for(lambda: len([x for x in lines() if x.startswith("second-start")]) == 2, "rerun")
        (tmp_path / "go").touch()
        _wait_for(lambda: state(run_id) == "succeeded", "the run to succeed")
    finally:
        third.terminate()
        third.communicate(timeout=30)
    # The recorded first step never ran again; the step in flight at the kill did.
    assert [x.split()[0] for x in lines()] == [
        "first",
        "second-start",
        "second-start",
        "second-done",
    ]
