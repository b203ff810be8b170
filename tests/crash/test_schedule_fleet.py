"""Three worker processes serve an every-second schedule; one is SIGKILLed at a tick.

Every tick gets exactly one run, judged from what the runs recorded (the
side file of ``schedule_app``), not from the engine's counters.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import defaultdict
from datetime import datetime, timedelta
from pathlib import Path

from perdure import schedules
from perdure.store import port

HERE = Path(__file__).resolve().parent


def _lines(path: Path) -> list[tuple[datetime, str, int]]:
    if not path.exists():
        return []
    found = []
    for line in path.read_text().splitlines():
        tick, run_id, pid = line.split()
        found.append((datetime.fromisoformat(tick), run_id, int(pid)))
    return found


def _until(what: str, check: object, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def test_one_run_per_tick_across_a_fleet_and_a_crash(
    crash_env: dict[str, str], store: port.Store, tmp_path: Path
) -> None:
    side = tmp_path / "ticks.log"
    marker = tmp_path / "crashed"
    env = {**crash_env, "SCHEDULE_LOG": str(side)}
    procs: list[subprocess.Popen[bytes]] = []

    def start(name: str, **extra: str) -> subprocess.Popen[bytes]:
        with open(tmp_path / f"{name}.log", "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-c", "import schedule_app; schedule_app.serve()"],
                cwd=HERE,
                env={**env, **extra},
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        procs.append(proc)
        return proc

    try:
        # The first worker to serve a tick after the others have started dies holding it.
        plain = [start("w1"), start("w2")]
        _until("ticks from the first workers", lambda: len(_lines(side)) >= 3)
        doomed = start("w3", SCHEDULE_CRASH=str(marker))
        _until("the crash", lambda: doomed.poll() is not None, timeout=90)
        assert doomed.returncode == -9
        crashed_at = len(_lines(side))
        # Ticks go on after the crash, and the crashed tick's run is recovered.
        _until("ticks after the crash", lambda: len(_lines(side)) >= crashed_at + 5)
        schedules.pause(store, "fleet", "every_second", True)
        for proc in plain:
            proc.terminate()
        for proc in plain:
            assert proc.wait(timeout=60) == 0
        # Drain: a worker finishes the ticks' runs already started; paused, it starts none.
        drain = start("drain")
        _until("the draining worker", lambda: b"serving" in (tmp_path / "drain.log").read_bytes())

        def drained() -> bool:
            live = [r for r in store.list_runs("fleet", limit=10_000) if r.state != "succeeded"]
            return not live

        _until("every tick's run to end", drained)
        drain.terminate()
        drain.wait(timeout=60)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)

    recorded = _lines(side)
    runs_of: dict[datetime, set[str]] = defaultdict(set)
    for tick, run_id, _ in recorded:
        runs_of[tick].add(run_id)
    # Exactly one run per tick...
    assert {t: ids for t, ids in runs_of.items() if len(ids) != 1} == {}
    # ...and no tick missing between the first and the last (catch_up="all").
    ticks = sorted(runs_of)
    assert len(ticks) >= 8
    expected = [ticks[0] + timedelta(seconds=s) for s in range(len(ticks))]
    assert ticks == expected
    # The crashed worker's tick ran again elsewhere: its run executed twice, one run still.
    crashed_pid = doomed.pid
    [(crash_tick, crash_run)] = [(t, r) for t, r, p in recorded if p == crashed_pid][-1:]
    assert [r for t, r, _ in recorded if t == crash_tick] == [crash_run, crash_run]
    # Every run the store holds is one of these ticks' runs.
    stored = store.list_runs("fleet", limit=10_000)
    assert sorted(r.run_id for r in stored) == sorted(next(iter(ids)) for ids in runs_of.values())
    assert os.path.exists(marker)
