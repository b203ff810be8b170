"""The store-lease posture with real processes: failover to a standby, and the zombie fence."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

APP_MODULE = """
import os
import time
from pathlib import Path

import perdure

app = perdure.App(name="leaseapp")
HERE = Path(__file__).parent


def note(line: str) -> None:
    with (HERE / "effects.log").open("a") as f:
        f.write(f"{line} {os.getpid()} {time.time()}\\n")
        f.flush()
        os.fsync(f.fileno())


@app.step()
def first(order: str) -> str:
    note(f"first {order}")
    return order


@app.step()
def second(order: str) -> str:
    note(f"second-start {order}")
    while not (HERE / "go").exists():
        time.sleep(0.02)
    note(f"second-done {order}")
    return order


@app.workflow()
def ship(ctx: perdure.Context, order: str) -> str:
    return second(first(order))
"""

PERDURE = [sys.executable, "-m", "perdure"]
TTL = 3.0
TIMING = ["--lease-ttl", str(TTL), "--heartbeat", "1"]


def _wait_for(what: Callable[[], bool], why: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {why}")
        time.sleep(0.02)


class Setup:
    def __init__(self, tmp_path: Path, store_url: str) -> None:
        (tmp_path / "leaseapp.py").write_text(textwrap.dedent(APP_MODULE))
        self.dir = tmp_path
        self.env = {**os.environ, "PYTHONPATH": str(tmp_path), "PERDURE_STORE": store_url}
        self.procs: list[subprocess.Popen[str]] = []

    def cli(self, *args: str) -> dict[str, object]:
        done = subprocess.run(
            [*PERDURE, *args, "--json"], env=self.env, capture_output=True, text=True, check=True
        )
        found: dict[str, object] = json.loads(done.stdout)
        return found

    def worker(self, *extra: str) -> tuple[subprocess.Popen[str], str]:
        proc = subprocess.Popen(
            [*PERDURE, "worker", "leaseapp:app", "--ownership", "store-lease", *TIMING, *extra],
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.procs.append(proc)
        assert proc.stdout is not None
        return proc, proc.stdout.readline()

    def effects(self) -> list[tuple[str, int, float]]:
        path = self.dir / "effects.log"
        if not path.exists():
            return []
        rows = [line.split() for line in path.read_text().splitlines()]
        return [(r[0], int(r[2]), float(r[3])) for r in rows]

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.communicate(timeout=30)


def test_a_standby_takes_over_within_the_ttl_of_a_kill_and_reruns_no_recorded_step(
    store_url: str, tmp_path: Path
) -> None:
    s = Setup(tmp_path, store_url)
    try:
        active, said = s.worker()
        assert "serving app" in said and "standing by" not in said
        standby, said = s.worker()
        assert "standing by" in said
        run_id = str(s.cli("start", "leaseapp:app", "ship", "--args", '["o-1"]')["run_id"])
        _wait_for(lambda: [e[0] for e in s.effects()] == ["first", "second-start"], "step two")
        active.send_signal(signal.SIGKILL)
        killed_at = time.time()
        active.communicate(timeout=30)
        _wait_for(lambda: len(s.effects()) == 3, "the standby to resume", timeout=TTL + 30)
        resumed = s.effects()[2]
        assert resumed[:2] == ("second-start", standby.pid)
        assert resumed[2] - killed_at <= TTL + 1.0, resumed[2] - killed_at
        (tmp_path / "go").touch()
        _wait_for(lambda: s.cli("show", run_id)["state"] == "succeeded", "the run to end")
        assert [(e[0], e[1]) for e in s.effects()] == [
            ("first", active.pid),
            ("second-start", active.pid),
            ("second-start", standby.pid),
            ("second-done", standby.pid),
        ]
    finally:
        s.close()


def test_a_frozen_active_worker_is_fenced_off_writes_nothing_after_the_takeover_and_stops(
    store_url: str, tmp_path: Path
) -> None:
    s = Setup(tmp_path, store_url)
    try:
        active, said = s.worker()
        active_id = said.split()[1]
        standby, said = s.worker()
        assert "standing by" in said
        run_id = str(s.cli("start", "leaseapp:app", "ship", "--args", '["o-1"]')["run_id"])
        _wait_for(lambda: [e[0] for e in s.effects()] == ["first", "second-start"], "step two")
        active.send_signal(signal.SIGSTOP)
        _wait_for(lambda: len(s.effects()) == 3, "the takeover", timeout=TTL + 30)
        assert s.effects()[2][:2] == ("second-start", standby.pid)
        active.send_signal(signal.SIGCONT)
        # It learns at its next heartbeat that the app is another's, and stops.
        _out, err = active.communicate(timeout=30)
        assert active.returncode == 1, err
        assert "lost app leaseapp" in err
        (tmp_path / "go").touch()
        _wait_for(lambda: s.cli("show", run_id)["state"] == "succeeded", "the run to end")
        history = s.cli("show", run_id, "--history")["history"]
        assert isinstance(history, list)
        workers = [r["worker"] for r in history if r["worker"] is not None]
        # Nothing the frozen worker held was written after the standby's first receipt.
        first_new = workers.index(next(w for w in workers if w != active_id))
        assert active_id not in workers[first_new:], workers
        assert [(e[0], e[1]) for e in s.effects()] == [
            ("first", active.pid),
            ("second-start", active.pid),
            ("second-start", standby.pid),
            ("second-done", standby.pid),
        ]
    finally:
        s.close()


def test_no_standby_exits_1_at_once_naming_the_holder(store_url: str, tmp_path: Path) -> None:
    s = Setup(tmp_path, store_url)
    try:
        _active, said = s.worker()
        active_id = said.split()[1]
        refused, said = s.worker("--no-standby")
        _out, err = refused.communicate(timeout=60)
        assert refused.returncode == 1
        assert "ownership_conflict" in err and f"worker {active_id} serves" in err
    finally:
        s.close()
