"""A worker process dies between ``next_update`` and ``respond``: the caller gets one answer.

The caller (a thread of this process, with no workflow code) sends the update
and blocks; a real worker process reads it and dies by ``os._exit``; a second
worker recovers the run once the lease lapses and answers. Both stores.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import skip_unless_adapter
from perdure import Client
from perdure.store import liveport, open_store, port

HERE = Path(__file__).resolve().parent
LIMIT = 30.0


@pytest.fixture
def env(store_url: str, tmp_path: Path) -> dict[str, str]:
    skip_unless_adapter(store_url)
    found = {k: v for k, v in os.environ.items() if not k.startswith("LIVE_CRASH")}
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
            [sys.executable, "-c", "import live_app; live_app.serve()"],
            cwd=HERE,
            env={**env, **extra},
            stdout=log,
            stderr=subprocess.STDOUT,
        )


@pytest.mark.slow
@pytest.mark.parametrize("point", ["after_next_update", "after_step"])
def test_a_worker_dying_between_next_update_and_respond_answers_once(
    point: str, env: dict[str, str], store: port.Store, tmp_path: Path
) -> None:
    client = Client(store, "livecrash")
    run_id = client.start("answer_once", "1").run_id
    answers: list[Any] = []
    failures: list[BaseException] = []

    def ask() -> None:
        try:
            answers.append(client.update(run_id, "ask", 21, update_id="q-1", timeout=LIMIT))
        except BaseException as exc:
            failures.append(exc)

    crashing = worker(env, tmp_path, "crashing", LIVE_CRASH_AT=point)
    caller = threading.Thread(target=ask)
    caller.start()
    try:
        assert crashing.wait(LIMIT) == 137, (tmp_path / "crashing.log").read_text()
        at_crash = store.get_run(run_id)
        assert at_crash is not None and at_crash.state == "running"
        stored = liveport.require(store).get_update(run_id, "q-1")
        assert stored is not None and stored.state == "pending"
        # Dying right after reading, nothing was written; after the step, the
        # update's consumption was written with the step's outcome.
        durable = {"after_next_update": [], "after_step": ["update", "step"]}[point]
        assert [e.kind for e in store.journal(run_id)] == durable
        assert not answers and not failures
        recovering = worker(env, tmp_path, "recovering")
        try:
            caller.join(LIMIT)
            assert not caller.is_alive(), (tmp_path / "recovering.log").read_text()
        finally:
            recovering.terminate()
            assert recovering.wait(LIMIT) == 0, (tmp_path / "recovering.log").read_text()
    finally:
        if crashing.poll() is None:
            crashing.kill()
    assert not failures, failures
    assert answers == [{"answer": 42, "noted": "noted 21"}]
    run = store.get_run(run_id)
    assert run is not None and run.state == "succeeded"
    journal = store.journal(run_id)
    assert [e.kind for e in journal] == ["update", "step", "respond"]
    assert "recovered" in [r.kind for r in store.history(run_id)]
    # Before the crash the step either never ran or was recorded: it ran once.
    assert (tmp_path / "effects.log").read_text().splitlines() == ["note 21"]
    # The caller's retry, from the store alone, gets the same single answer.
    assert client.update(run_id, "ask", 21, update_id="q-1") == answers[0]
