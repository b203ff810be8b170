"""examples/encryption: a worker killed inside a step; another finishes; no plaintext stored.

The client (this process) and the workers (``perdure worker encrypted:app``
processes) load the example with the same keys. The first worker is killed
with SIGKILL inside ``compose``; the second takes the run once the lease
lapses, runs the step again and finishes it.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from cryptography.fernet import Fernet

import dbrows

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "encryption"
LIMIT = 60.0
NAME, CODE, CONFIRMER = "Ada-Lovelace-9", "4077-sesame", "grace-hopper-7"


def wait_for(check: Callable[[], Any], what: str) -> Any:
    deadline = time.monotonic() + LIMIT
    while not (found := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {LIMIT}s")
        time.sleep(0.05)
    return found


@pytest.fixture
def env(store_url: str, tmp_path: Path) -> dict[str, str]:
    pause = tmp_path / "pause"
    pause.mkdir()
    return {
        **os.environ,
        "PERDURE_STORE": store_url,
        "ENCRYPTION_KEYS": Fernet.generate_key().decode(),
        "ENCRYPTION_PAUSE_DIR": str(pause),
    }


@pytest.fixture
def example(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    for name in ("PERDURE_STORE", "ENCRYPTION_KEYS"):
        monkeypatch.setenv(name, env[name])
    spec = importlib.util.spec_from_file_location("encryption_example", EXAMPLE / "encrypted.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    try:
        yield module
    finally:
        module.app.close()


@pytest.fixture
def workers(
    env: dict[str, str], tmp_path: Path
) -> Iterator[Callable[[str], subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []

    def start(name: str) -> subprocess.Popen[bytes]:
        command = [sys.executable, "-m", "perdure", "worker", "encrypted:app"]
        command += ["--concurrency", "1", "--lease-ttl", "1", "--heartbeat", "0.3"]
        with open(tmp_path / f"{name}.log", "wb") as log:
            proc = subprocess.Popen(command, cwd=EXAMPLE, env=env, stdout=log, stderr=log)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


def test_a_worker_killed_mid_run_leaves_only_ciphertext_and_the_run_finishes(
    example: ModuleType,
    workers: Callable[[str], subprocess.Popen[bytes]],
    env: dict[str, str],
    store_url: str,
) -> None:
    app = example.app
    handle = app.start(example.encrypted_greeting, NAME, CODE)
    app.signal(handle.run_id, "confirm", {"by": CONFIRMER})  # kept for the wait
    first = workers("first")
    pause = Path(env["ENCRYPTION_PAUSE_DIR"])
    wait_for(lambda: (pause / "reached").exists(), "the first worker reaching compose")
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    assert app.get(handle.run_id).state == "running"  # its lease has not lapsed yet

    (pause / "release").touch()
    workers("second")
    result = handle.result(timeout=LIMIT)
    assert result == {
        "message": f"Hello, {NAME}! Your code is {CODE}.",
        "confirmed_by": CONFIRMER,
    }
    journal = app.store.journal(handle.run_id)
    assert [e.name for e in journal if e.kind == "step"] == ["greet", "compose"]
    stored = dbrows.dump(store_url)
    for plaintext in (NAME, CODE, CONFIRMER, "Hello", "Your code"):
        assert plaintext not in stored, plaintext
    assert "$codec" in stored and "fernet" in stored
