"""A worker process dies right after ``ctx.first`` chose: recovery takes the same branch.

The run parks on a signal and a message; the message arrives and wins; the
worker dies (``os._exit``) before the next journal write: either at once or
inside the step that follows, its effect done and its outcome unrecorded.
Then the signal arrives, which comes first in argument order, so a fresh
evaluation would take it. A second worker recovers the run once the lease
lapses: it takes the recorded branch, the signal is left for the later wait,
and nothing is applied twice. Both stores.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import skip_unless_adapter
from perdure import Client, journal
from perdure.store import open_store, port

HERE = Path(__file__).resolve().parent
LIMIT = 30.0


@pytest.fixture
def env(store_url: str, tmp_path: Path) -> dict[str, str]:
    skip_unless_adapter(store_url)
    found = {k: v for k, v in os.environ.items() if not k.startswith("FIRST_CRASH")}
    found.update(
        {
            "PERDURE_STORE": store_url,
            "CRASH_EFFECTS_LOG": str(tmp_path / "effects.log"),
            "PYTHONPATH": str(HERE),
        }
    )
    return found


@pytest.fixture
def store(store_url: str) -> Iterator[port.Store]:
    skip_unless_adapter(store_url)
    opened = open_store(store_url)
    yield opened
    opened.close()


def worker(env: dict[str, str], tmp_path: Path, name: str, **extra: str) -> subprocess.Popen[bytes]:
    with open(tmp_path / f"{name}.log", "wb") as log:
        return subprocess.Popen(
            [sys.executable, "-c", "import first_app; first_app.serve()"],
            cwd=HERE,
            env={**env, **extra},
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def state_becomes(store: port.Store, run_id: str, state: str) -> None:
    """Return once the run is in ``state`` (the worker decides when; this only observes)."""
    deadline = time.monotonic() + LIMIT
    while time.monotonic() < deadline:
        run = store.get_run(run_id)
        if run is not None and run.state == state:
            return
        time.sleep(0.02)
    raise AssertionError(f"run {run_id} never became {state}")


@pytest.mark.slow
@pytest.mark.parametrize("point", ["after_first", "in_step"])
def test_a_worker_dying_after_first_chose_recovers_the_same_branch(
    point: str, env: dict[str, str], store: port.Store, tmp_path: Path
) -> None:
    client = Client(store, "firstcrash")
    run_id = client.start("chooser", "1").run_id
    effects = tmp_path / "effects.log"
    crashing = worker(env, tmp_path, "crashing", FIRST_CRASH_AT=point)
    try:
        state_becomes(store, run_id, "waiting")
        assert client.send(run_id, "greetings", "m-1", "hello")
        assert crashing.wait(LIMIT) == 137, (tmp_path / "crashing.log").read_text()
    finally:
        if crashing.poll() is None:
            crashing.kill()
    at_crash = store.get_run(run_id)
    assert at_crash is not None and at_crash.state == "running"
    # The winner was written before the code went on; nothing after it was.
    [entry] = store.journal(run_id)
    assert (entry.kind, entry.status) == ("first", "ok")
    fired = journal.FirstFired.decode(entry.output)
    assert (fired.index, fired.kind, fired.name) == (1, "message", "greetings")
    ran = {"after_first": [], "in_step": ["note greetings"]}[point]
    assert (effects.read_text().splitlines() if effects.exists() else []) == ran
    # A signal earlier in argument order arrives while no worker runs.
    receipt = client.signal(run_id, "exit", "bye", signal_id="sig-1")
    assert receipt.name == "exit"
    recovering = worker(env, tmp_path, "recovering")
    try:
        assert client.handle(run_id).result(timeout=LIMIT) == ["greetings", "greetings", "bye"]
    finally:
        recovering.terminate()
        assert recovering.wait(LIMIT) == 0, (tmp_path / "recovering.log").read_text()
    assert [(e.kind, e.name, e.status) for e in store.journal(run_id)] == [
        ("first", "signal:exit|message:greetings", "ok"),
        ("step", "note", "ok"),
        ("wait", "exit", "ok"),
    ]
    # The branch never changed: the step only ever noted the message's branch.
    assert set(effects.read_text().splitlines()) == {"note greetings"}
    history = store.history(run_id)
    assert "recovered" in [r.kind for r in history]
    applied = [r.step for r in history if r.kind == "outcome_applied"]
    assert applied == ["greetings", "exit"]  # each source applied once
    assert client.signal(run_id, "exit", "bye", signal_id="sig-1") == receipt
