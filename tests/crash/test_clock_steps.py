"""The host's clock steps under live worker processes: no healthy run is taken over.

Every worker's store reads the system clock plus an offset from one file
(``clock_app``), so rewriting the file steps the store's clock in every
process at once, as an NTP step does to the processes of a host (on
PostgreSQL the injected clock stands for the server's).

* Forward an hour: every lease looks lapsed, yet the owners are alive and
  renew within a heartbeat. Idle workers must not take the runs over: each
  step runs once, every run succeeds, no ``recovered`` receipt appears.
* Back an hour after the owner of a run was SIGKILLed: its lease now looks
  an hour away, yet another worker must recover the run within about one
  lease TTL plus the sweep interval.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from perdure import Client
from perdure.store import port
from perdure.testing.clock import OffsetClock

HERE = Path(__file__).resolve().parent
LEASE_TTL = 1.5
HEARTBEAT = 0.5
POLL = 0.05
SWEEP = 0.5
LIMIT = 30.0
HOUR = 3600.0


def wait_for(check: Callable[[], Any], what: str, timeout: float = LIMIT) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


class Fleet:
    """Worker processes of ``clock_app`` sharing one offset file; all killed at teardown."""

    def __init__(self, store_url: str, folder: Path) -> None:
        self.folder = folder
        (folder / "started").mkdir()
        self.clock = OffsetClock(folder / "offset")
        self.clock.write(0)
        path = [str(HERE), *(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)]
        self.env = {
            **os.environ,
            "PERDURE_STORE": store_url,
            "CLOCK_OFFSET_FILE": self.clock.path,
            "CLOCK_DIR": str(folder),
            "CLOCK_LEASE_TTL": str(LEASE_TTL),
            "CLOCK_HEARTBEAT": str(HEARTBEAT),
            "CLOCK_POLL": str(POLL),
            "CLOCK_SWEEP": str(SWEEP),
            "PYTHONPATH": os.pathsep.join(path),
            "PYTHONUNBUFFERED": "1",
        }
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, count: int) -> None:
        for _ in range(count):
            log = open(self.folder / f"worker-{len(self.procs)}.log", "wb")  # noqa: SIM115
            self.procs.append(
                subprocess.Popen(
                    [sys.executable, "-c", "import clock_app; clock_app.serve()"],
                    cwd=HERE,
                    env=self.env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
            log.close()
        wait_for(
            lambda: all("serving" in self.log(i) for i in range(len(self.procs))),
            "every worker to serve",
        )
        # A fresh worker recovers nothing until it has watched the clock for
        # one lease TTL; let that pass so the steps below meet trusting workers.
        time.sleep(LEASE_TTL + 0.3)

    def log(self, index: int) -> str:
        return (self.folder / f"worker-{index}.log").read_text(errors="replace")

    def logs(self) -> str:
        return "\n".join(f"--- worker {i}\n{self.log(i)}" for i in range(len(self.procs)))

    def started(self) -> list[tuple[str, int]]:
        """Return ``(run id, pid)`` of every step execution that has begun."""
        found = []
        for marker in (self.folder / "started").iterdir():
            run_id, pid = marker.name.rsplit(".", 1)
            found.append((run_id, int(pid)))
        return found

    def executions(self) -> Counter[str]:
        """Return how many times each run's step began (from the effects log)."""
        path = self.folder / "effects.log"
        lines = path.read_text().splitlines() if path.exists() else []
        return Counter(line.split()[0] for line in lines)

    def release(self) -> None:
        (self.folder / "release").touch()

    def close(self) -> None:
        self.release()
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)


@pytest.fixture
def fleet(store_url: str, tmp_path: Path) -> Iterator[Fleet]:
    workers = Fleet(store_url, tmp_path)
    yield workers
    workers.close()


def ended(store: port.Store, run_ids: list[str]) -> list[port.Run]:
    def check() -> list[port.Run] | None:
        runs = [store.get_run(run_id) for run_id in run_ids]
        if all(r is not None and r.state in port.TERMINAL_STATES for r in runs):
            return [r for r in runs if r is not None]
        return None

    found: list[port.Run] = wait_for(check, "every run to end")
    return found


@pytest.mark.slow
def test_a_forward_step_of_the_clock_takes_no_live_run_over(
    store: port.Store, fleet: Fleet
) -> None:
    client = Client(store, "clock")
    fleet.start(6)  # four runs, one slot each: two workers stay idle and claim
    run_ids = [
        client.start(flow, "1", [n]).run_id
        for n, flow in enumerate(["idempotent_flow", "once_flow"] * 2)
    ]
    wait_for(lambda: len(fleet.started()) == 4, "every run to be inside its step")

    fleet.clock.write(HOUR)
    jumped = time.monotonic()
    # Every owner renews on the new clock within a heartbeat.
    jump_instant = fleet.clock.now() - timedelta(seconds=time.monotonic() - jumped)

    def renewed() -> bool:
        runs = [store.get_run(run_id) for run_id in run_ids]
        # (A run that is no longer running fails the assertions below.)
        return all(
            r is not None
            and (r.state != "running" or (r.lease_expires_at or jump_instant) > jump_instant)
            for r in runs
        )

    wait_for(renewed, "every live lease to be renewed on the new clock")
    # The watchers trust the clock again one TTL after the step: give them a
    # few claim rounds of trust in which a lapsed lease would be recovered.
    time.sleep(max(0.0, jumped + LEASE_TTL + 10 * POLL - time.monotonic()))
    fleet.release()

    runs = ended(store, run_ids)
    assert [r.state for r in runs] == ["succeeded"] * 4, (
        [(r.state, r.error) for r in runs],
        fleet.logs(),
    )
    assert fleet.executions() == dict.fromkeys(run_ids, 1), fleet.logs()
    for run_id in run_ids:
        kinds = [r.kind for r in store.history(run_id)]
        assert "recovered" not in kinds, (run_id, kinds)
        assert kinds.count("claimed") == 1
    assert [r.generation for r in runs] == [1] * 4
    assert "store's clock jumped" in fleet.logs()


@pytest.mark.slow
def test_a_backward_step_does_not_hold_a_dead_workers_run(store: port.Store, fleet: Fleet) -> None:
    client = Client(store, "clock")
    fleet.start(2)
    run_id = client.start("idempotent_flow", "1", [1]).run_id
    [(_, owner_pid)] = wait_for(fleet.started, "the run to be inside its step")
    [owner] = [p for p in fleet.procs if p.pid == owner_pid]

    owner.kill()
    assert owner.wait(timeout=10) == -signal.SIGKILL
    fleet.clock.write(-HOUR)
    stepped = time.monotonic()

    # The dead owner's lease now lies an hour and up to a TTL ahead. A sweep
    # pulls it back to one TTL ahead; it lapses; the other worker claims it.
    bound = SWEEP + LEASE_TTL + POLL + 1.0
    rescued = wait_for(
        lambda: [pid for rid, pid in fleet.started() if rid == run_id and pid != owner_pid],
        "another worker to recover the run",
        timeout=bound + 5,
    )
    elapsed = time.monotonic() - stepped
    assert elapsed <= bound, f"recovered {elapsed:.2f}s after the step; bound {bound:.2f}s"

    fleet.release()
    [run] = ended(store, [run_id])
    assert run.state == "succeeded", (run.error, fleet.logs())
    assert run.worker is None and run.generation == 2
    kinds = [r.kind for r in store.history(run_id)]
    assert kinds.count("recovered") == 1, kinds
    # The killed owner had begun the idempotent step; the rescuer ran it again.
    assert fleet.executions() == {run_id: 2}
    assert len(rescued) == 1
