"""PostgreSQL failover under load: nothing acknowledged is lost, nothing runs twice.

A pg_auto_failover formation (monitor, primary, synchronous standby; see
conftest.py) serves two perdure worker processes and this test's client, all
connected through one multi-host URL with ``target_session_attrs=read-write``.
Runs of ``failover_app.order`` (idempotent steps, a ``once`` step, a signal,
an idempotent step) are started and signaled while the client keeps reading
their journals. Mid-load the primary's pg_autoctl and postmaster are
SIGKILLed at once; the monitor promotes the standby. Then:

* every journal entry the client saw recorded is still there, unchanged;
* every signal receipt the client got is the one the store answers again;
* no step recorded before the crash ran again; no ``once`` step ran twice;
* every run finishes (a ``once`` step caught in flight stops its run in
  ``needs_attention``, as designed; it is resolved from the effects log, as an
  operator would, and the run then finishes).

The time without service (crash to the client's first successful write) and
the counts are printed and, with ``PERDURE_FAILOVER_REPORT=path``, written as
JSON. See docs/howto/failover.md.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pgaf import Formation

import perdure
from perdure.store import port

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import failover_app  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.timeout(900)]

RUNS_BEFORE = 24
RUNS_AFTER = 8
WORKERS = 2
SETTLE_TIMEOUT = 240.0
ENDED = ("succeeded", "failed", "canceled", "needs_attention")


class Driver:
    """The client side: starts runs, signals them, and notes what the store acknowledged."""

    def __init__(self, app: perdure.App, store: port.Store) -> None:
        self.app = app
        self.store = store
        self.runs: dict[int, str] = {}
        self.started_at: dict[int, float] = {}
        self.receipts: dict[str, perdure.Receipt] = {}
        # (run_id, position) -> (name, output), as the client read it recorded.
        self.seen: dict[tuple[str, int], tuple[str, str | None]] = {}
        self.seen_before_crash: set[tuple[str, int]] = set()
        self.states: dict[str, str] = {}
        self.writes: list[float] = []
        self.failures: Counter[str] = Counter()

    def _try(self, call: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return call(*args, **kwargs)
        except perdure.StoreError as exc:
            self.failures[type(exc).__name__] += 1
            return None

    def start(self, n: int) -> None:
        handle = self._try(self.app.start, failover_app.order, n, key=f"order-{n}")
        if handle is not None:
            self.runs[n] = handle.run_id
            self.started_at[n] = time.monotonic()
            self.writes.append(time.monotonic())

    def signal_some(self) -> None:
        now = time.monotonic()
        for n, run_id in self.runs.items():
            if run_id in self.receipts or now - self.started_at[n] < 0.3:
                continue
            try:
                receipt = self._try(self.app.signal, run_id, "go", f"go-{n}", signal_id=f"go-{n}")
            except perdure.RunFinished:
                # Stopped in needs_attention before its wait: signaled once resolved.
                continue
            if receipt is not None:
                self.receipts[run_id] = receipt
                self.writes.append(time.monotonic())

    def read(self) -> None:
        for run_id in self.runs.values():
            if self.states.get(run_id) in ENDED:
                continue
            entries = self._try(self.store.journal, run_id)
            run = self._try(self.store.get_run, run_id)
            if entries is None or run is None:
                continue
            for e in entries:
                if e.status == "ok":
                    self.seen.setdefault((run_id, e.position), (e.name, e.output))
            self.states[run_id] = run.state

    def step(self) -> None:
        self.signal_some()
        self.read()
        time.sleep(0.05)

    def all_ended(self) -> bool:
        return all(self.states.get(r) in ENDED for r in self.runs.values())


def _effects(path: Path) -> Counter[tuple[str, int, int]]:
    lines = path.read_text().split("\n") if path.exists() else []
    return Counter(
        (name, int(n), int(i)) for name, n, i in (line.split() for line in lines if line)
    )


def _start_workers(
    formation: Formation, effects: Path, logs: Path
) -> list[subprocess.Popen[bytes]]:
    path = [str(HERE), *(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)]
    env = {
        **os.environ,
        "PERDURE_STORE": formation.url,
        "FAILOVER_EFFECTS_LOG": str(effects),
        "PYTHONPATH": os.pathsep.join(path),
        "PYTHONUNBUFFERED": "1",
    }
    procs = []
    for k in range(WORKERS):
        with open(logs / f"worker{k}.log", "wb") as log:
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-c", "import failover_app; failover_app.serve()"],
                    cwd=HERE,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
    return procs


def test_no_acknowledged_write_is_lost_and_nothing_runs_twice(
    formation: Formation, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    effects = tmp_path / "effects.log"
    monkeypatch.setenv("PERDURE_STORE", formation.url)
    monkeypatch.setenv("FAILOVER_EFFECTS_LOG", str(effects))
    app = failover_app.app
    store = app.store  # migrates the formation's database
    workers = _start_workers(formation, effects, tmp_path)
    driver = Driver(app, store)
    try:
        # Keep starting runs until the workers are well into them, so that
        # the crash finds steps, charges and signals in flight.
        n, deadline = 0, time.monotonic() + 120
        while n < RUNS_BEFORE or len(driver.seen) < 60 or len(driver.receipts) < 8:
            assert time.monotonic() < deadline, f"the load never got going: {driver.failures}"
            driver.start(n)
            n = len(driver.runs)
            driver.step()
        runs_before = len(driver.runs)
        driver.seen_before_crash = set(driver.seen)

        crashed, crashed_wall = time.monotonic(), time.time()
        formation.crash("node1")
        deadline = crashed + 120
        while len(driver.runs) < runs_before + RUNS_AFTER:
            assert time.monotonic() < deadline, f"no write succeeded: {driver.failures}"
            before = len(driver.runs)
            driver.start(n)
            if len(driver.runs) > before:
                n += 1
            driver.step()
        back = min(t for t in driver.writes if t > crashed)
        states = formation.states()
        assert states["node2"][0] in ("wait_primary", "primary"), states
        promoted = formation.promoted_at("node2")

        deadline = time.monotonic() + SETTLE_TIMEOUT
        while not driver.all_ended():
            assert time.monotonic() < deadline, Counter(driver.states.values())
            driver.step()

        # An operator's answer to a once step caught by the crash: the effects log says.
        ran = _effects(effects)
        resolved: dict[str, str] = {}
        for n, run_id in driver.runs.items():
            if driver.states[run_id] == "needs_attention":
                if ran[("charge", n, 0)]:
                    app.resolve(run_id, "charge", output=f"charge:{n}")
                    resolved[run_id] = "output"
                else:
                    app.resolve(run_id, "charge", error="not charged: the store failed over")
                    resolved[run_id] = "error"
                driver.states[run_id] = "queued"
        deadline = time.monotonic() + SETTLE_TIMEOUT
        while not driver.all_ended():
            assert time.monotonic() < deadline, Counter(driver.states.values())
            driver.step()
        driver.signal_some()
    finally:
        for proc in workers:
            proc.terminate()
        for proc in workers:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        app.close()

    ran = _effects(effects)
    checker = perdure.App(formation.url, name="failover")
    store = checker.store
    try:
        lost = []
        for (run_id, position), (name, output) in driver.seen.items():
            now = {e.position: e for e in store.journal(run_id)}.get(position)
            if now is None or now.status != "ok" or (now.name, now.output) != (name, output):
                lost.append((run_id, position, name))
        receipts_lost = []
        for run_id, receipt in driver.receipts.items():
            n = next(k for k, r in driver.runs.items() if r == run_id)
            again = checker.client.signal(run_id, "go", f"go-{n}", signal_id=f"go-{n}")
            if (again.wait_id, again.outcome, again.at) != (
                receipt.wait_id,
                receipt.outcome,
                receipt.at,
            ):
                receipts_lost.append(run_id)
        final = {r: getattr(store.get_run(r), "state", "missing") for r in driver.runs.values()}
    finally:
        checker.close()

    by_run = {run_id: n for n, run_id in driver.runs.items()}
    ran_again_after_recorded = []
    for run_id, position in driver.seen_before_crash:
        name, _ = driver.seen[(run_id, position)]
        n = by_run[run_id]
        key = ("charge", n, 0) if name == "charge" else None
        if name.startswith("tick"):
            i = int(json.loads(driver.seen[(run_id, position)][1] or '""').rsplit(":", 1)[1])
            key = ("tick", n, i)
        elif name == "confirm":
            key = ("confirm", n, 0)
        if key is not None and ran[key] != 1:
            ran_again_after_recorded.append((run_id, name, ran[key]))
    once_twice = [n for n in driver.runs if ran[("charge", n, 0)] > 1]
    repeated_idempotent = sum(c - 1 for k, c in ran.items() if k[0] != "charge" and c > 1)

    report = {
        "runs": len(driver.runs),
        "final_states": dict(Counter(final.values())),
        "no_service_s": round(back - crashed, 2),
        "promoted_s": None if promoted is None else round(promoted - crashed_wall, 2),
        "entries_seen": len(driver.seen),
        "entries_seen_before_crash": len(driver.seen_before_crash),
        "receipts": len(driver.receipts),
        "client_failures": dict(driver.failures),
        "resolved": dict(Counter(resolved.values())),
        "idempotent_reexecutions": repeated_idempotent,
        "violations": {
            "entries_lost": len(lost),
            "receipts_lost": len(receipts_lost),
            "recorded_step_ran_again": len(ran_again_after_recorded),
            "once_ran_twice": len(once_twice),
        },
    }
    print("failover:", json.dumps(report))
    if os.environ.get("PERDURE_FAILOVER_REPORT"):
        Path(os.environ["PERDURE_FAILOVER_REPORT"]).write_text(json.dumps(report, indent=2))
    assert lost == [] and receipts_lost == [], report
    assert ran_again_after_recorded == [] and once_twice == [], report
    assert set(final.values()) <= {"succeeded", "failed"}, report
    assert all(s == "succeeded" for r, s in final.items() if resolved.get(r) != "error"), report
