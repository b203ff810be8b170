"""examples/continue_as_new: a looping workflow survives a worker killed mid-loop."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from perdure import Client
from perdure.store import open_store

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "continue_as_new"
LIMIT = 8


def _worker(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    out = open(log, "ab")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "perdure",
            "worker",
            "cursor_loop:app",
            "--lease-ttl",
            "1",
            "--heartbeat",
            "0.3",
        ],
        cwd=EXAMPLE,
        env=env,
        stdout=out,
        stderr=subprocess.STDOUT,
    )
    out.close()
    return proc


def test_the_loop_survives_a_worker_killed_mid_run(store_url: str, tmp_path: Path) -> None:
    effects = tmp_path / "loop.log"
    path = [str(EXAMPLE), *(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)]
    env = {
        **os.environ,
        "PERDURE_STORE": store_url,
        "LOOP_LOG": str(effects),
        "LOOP_PAUSE": "0.1",
        "PYTHONPATH": os.pathsep.join(path),
    }
    store = open_store(store_url)
    try:
        client = Client(store, "loop")
        first = client.start("looping", "1", [0, LIMIT]).run_id
        doomed = _worker(env, tmp_path / "first.log")
        try:
            deadline = time.monotonic() + 60
            # Mid-loop: a few iterations have run as runs of their own.
            while len(client.get(first).chain) < 3:
                assert time.monotonic() < deadline, (tmp_path / "first.log").read_text()
                time.sleep(0.02)
        finally:
            os.kill(doomed.pid, signal.SIGKILL)
            doomed.wait(timeout=20)
        assert client.get(first).state != "succeeded"
        survivor = _worker(env, tmp_path / "second.log")
        try:
            assert client.handle(first).result(timeout=60) == f"looped {LIMIT} times"
        finally:
            survivor.terminate()
            survivor.wait(timeout=20)
        info = client.get(first)
        assert len(info.chain) == LIMIT + 1 and info.chain[0] == first
        # Every iteration ran; one cut off by the kill may have run its step twice.
        ran = [int(line) for line in effects.read_text().split()]
        assert sorted(set(ran)) == list(range(LIMIT + 1)) and len(ran) <= LIMIT + 2
    finally:
        store.close()
