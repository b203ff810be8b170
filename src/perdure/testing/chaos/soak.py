"""Soaks on PostgreSQL: real worker processes killed with SIGKILL, or cut off by a proxy.

Both kinds run the :mod:`~perdure.testing.chaos.workload` app in N worker
processes (a real ``Worker`` with its lease keeper, short leases) on a fresh
database, while a driver in this process starts runs, signals the ones that
wait, and injects faults on a seeded schedule:

* ``kill``: every few hundred ms a random worker gets SIGKILL and a fresh one
  takes its slot;
* ``network``: the workers reach PostgreSQL through a
  :class:`~perdure.testing.chaos.proxy.Proxy` that adds latency to, blackholes,
  resets, or cuts right after a COMMIT (an ambiguous commit), one of their
  connections at a time.

Then the faults stop, every run must end or park within ``settle`` seconds,
and the invariants of :mod:`~perdure.testing.chaos.checks` are read from the
side records the workers wrote (never from engine counters). See
docs/testing.md, "Soaks".
"""

from __future__ import annotations

import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from perdure import errors, records
from perdure.store import open_store, port
from perdure.testing.chaos import checks, trial, workload
from perdure.testing.chaos import scenario as scenario_api
from perdure.testing.chaos.proxy import Proxy

KINDS = ("kill", "network")
LEASE_TTL = 1.0
HEARTBEAT = 0.3
SERVED = 2.0
"""Seconds a worker serves (from its first claim) before it may be killed."""
BOUND = 30.0
"""Seconds no store call of a worker may take (a longer one is a violation)."""


@dataclass(frozen=True)
class Form:
    """How big a soak is."""

    workers: int
    seconds: float
    runs: int


SHORT = Form(workers=3, seconds=20.0, runs=36)
LONG = Form(workers=8, seconds=180.0, runs=400)


@dataclass
class SoakReport:
    """What a soak found; ``ok`` when nothing broke an invariant."""

    kind: str
    form: str
    seed: int
    workers: int
    runs: int
    seconds: float
    kills: int = 0
    faults: dict[str, int] = field(default_factory=dict)
    ambiguous_commits: int = 0
    worker_exits: int = 0
    slowest: float = 0.0
    """The longest store call of a worker, or client call of the driver, in seconds."""
    recoveries: list[float] = field(default_factory=list)
    """Seconds from a kill to the claim that resumed each run the killed worker held."""
    next_steps: list[float] = field(default_factory=list)
    """Seconds from a kill to the next step of each run the killed worker held."""
    ends: dict[str, int] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    store: str = "PostgreSQL"

    @property
    def ok(self) -> bool:
        return not self.violations

    def percentile(self, q: float, of: list[float] | None = None) -> float | None:
        """Return the ``q`` quantile (0..1) of the recovery times, or None without any."""
        times = self.recoveries if of is None else of
        if not times:
            return None
        if len(times) == 1:
            return times[0]
        cuts = statistics.quantiles(times, n=100, method="inclusive")
        return cuts[max(0, min(98, round(q * 100) - 1))]

    def to_json(self) -> dict[str, Any]:
        """Return the report as JSON values."""
        return {
            **asdict(self),
            "ok": self.ok,
            "recovery_p50": self.percentile(0.5),
            "recovery_p99": self.percentile(0.99),
            "next_step_p50": self.percentile(0.5, self.next_steps),
            "next_step_p99": self.percentile(0.99, self.next_steps),
        }

    def table(self) -> str:
        """Return the report as a Markdown table, with every violation below it."""

        def seconds(value: float | None) -> str:
            return "-" if value is None else f"{value:.2f}s"

        faults = ", ".join(f"{k} {n}" for k, n in sorted(self.faults.items())) or "-"
        ended = ", ".join(f"{k} {n}" for k, n in sorted(self.ends.items()))
        lines = [
            "| soak | workers | runs | kills | faults | ambiguous commits | worker exits "
            "| resumed runs | resumed p50 / p99 | next step p50 / p99 | slowest call | violations "
            "| runs ended | time |",
            "| --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
            "| --- | ---: |",
            f"| {self.kind} | {self.workers} | {self.runs} | {self.kills} | {faults} | "
            f"{self.ambiguous_commits} | {self.worker_exits} | {len(self.recoveries)} | "
            f"{seconds(self.percentile(0.5))} / {seconds(self.percentile(0.99))} | "
            f"{seconds(self.percentile(0.5, self.next_steps))} / "
            f"{seconds(self.percentile(0.99, self.next_steps))} | "
            f"{self.slowest:.2f}s | "
            f"{len(self.violations)} | {ended} | {self.seconds:.1f}s |",
            f"\n{self.form} {self.kind} soak on {self.store}, seed {self.seed}: "
            f"{len(self.violations)} violations",
        ]
        lines.extend(f"- {v}" for v in self.violations)
        return "\n".join(lines)


class _Workers:
    """The worker processes, one per slot; a killed or dead one is replaced."""

    def __init__(self, url: str, folder: Path, count: int) -> None:
        self.url = url
        self.folder = folder
        self.names = [""] * count
        self.procs: list[subprocess.Popen[bytes] | None] = [None] * count
        self.started = 0
        self._read = 0
        self._claimed: dict[str, float] = {}
        self._lock = threading.Lock()

    def spawn(self, slot: int) -> None:
        self.started += 1
        name = f"w{slot}.{self.started}"
        env = {
            **os.environ,
            "PERDURE_STORE": self.url,
            scenario_api.EVENTS_ENV: str(self.folder / "events.jsonl"),
            scenario_api.PHASE_ENV: name,
            workload.TIMELINE_ENV: str(self.folder / "timeline.jsonl"),
            "PERDURE_SOAK_LEASE": str(LEASE_TTL),
            "PERDURE_SOAK_HEARTBEAT": str(HEARTBEAT),
            "PERDURE_SOAK_SLOW": "1",
            "PYTHONUNBUFFERED": "1",
        }
        with open(self.folder / "workers.log", "ab") as log:
            self.procs[slot] = subprocess.Popen(
                [sys.executable, "-m", "perdure.testing.chaos.workload"],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.names[slot] = name

    def serving(self, age: float) -> list[int]:
        """Return the slots whose worker made its first claim ``age`` seconds ago or more."""
        with open(self.folder / "timeline.jsonl", "a+", encoding="utf-8") as handle:
            handle.seek(self._read)
            chunk = handle.read()
        whole = chunk[: chunk.rfind("\n") + 1]
        self._read += len(whole.encode())
        for line in whole.splitlines():
            entry = json.loads(line)
            if entry["kind"] == "claim":
                self._claimed.setdefault(entry["who"], entry["t"])
        dead, now = self.dead(), time.time()
        return [
            s
            for s, name in enumerate(self.names)
            if now - self._claimed.get(name, now) >= age and s not in dead
        ]

    def replace(self, slot: int) -> tuple[float, str]:
        """SIGKILL the slot's worker and start a fresh one; return the kill's time and name."""
        with self._lock:
            proc, name = self.procs[slot], self.names[slot]
            assert proc is not None
            proc.send_signal(signal.SIGKILL)
            killed_at = time.time()
            proc.wait()
            self.spawn(slot)
            return killed_at, name

    def revive(self) -> int:
        """Replace the workers that ended on their own; return how many did."""
        with self._lock:
            dead = self.dead()
            for slot in dead:
                self.spawn(slot)
            return len(dead)

    def dead(self) -> list[int]:
        return [s for s, p in enumerate(self.procs) if p is None or p.poll() is not None]

    def stop(self, timeout: float) -> list[str]:
        """Stop every worker with SIGTERM; return the names of those that did not stop in time."""
        for proc in self.procs:
            if proc is not None and proc.poll() is None:
                proc.terminate()
        hung = []
        deadline = time.monotonic() + timeout
        for slot, proc in enumerate(self.procs):
            if proc is None:
                continue
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                hung.append(self.names[slot])
                proc.kill()
                proc.wait()
        return hung


def soak(
    url: str,
    kind: str = "kill",
    *,
    long: bool = False,
    workers: int | None = None,
    seconds: float | None = None,
    runs: int | None = None,
    seed: int = 0,
    settle: float = 60.0,
    broken: bool = False,
    keep: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> SoakReport:
    """Run one soak of ``kind`` (``kill`` or ``network``) on the PostgreSQL server of ``url``.

    Raises:
        errors.InvalidInput: an unknown kind, or a size below 1.
        errors.InvalidStoreURL: ``url`` is not a PostgreSQL URL.
    """
    if kind not in KINDS:
        raise errors.InvalidInput(f"a soak is one of {', '.join(KINDS)}, got {kind!r}")
    if not url.startswith(("postgresql://", "postgres://")):
        raise errors.InvalidStoreURL(
            f"a soak runs on PostgreSQL: --store postgresql://..., got {url!r}"
        )
    form = LONG if long else SHORT
    size = Form(
        form.workers if workers is None else workers,
        form.seconds if seconds is None else seconds,
        form.runs if runs is None else runs,
    )
    if size.workers < 1 or size.runs < 1 or size.seconds <= 0:
        raise errors.InvalidInput(f"workers, runs and seconds must be positive, got {size}")
    say = progress or (lambda line: None)
    began = time.monotonic()
    report = SoakReport(kind, "long" if long else "short", seed, size.workers, size.runs, 0.0)
    with tempfile.TemporaryDirectory(prefix="perdure-soak-") as scratch:
        folder = Path(keep) if keep else Path(scratch)
        folder.mkdir(parents=True, exist_ok=True)
        stores = trial.Stores(url, folder)
        try:
            db = stores.fresh()
            try:
                _soak(db, kind, size, seed, settle, broken, folder, report, say)
            finally:
                stores.discard(db)
        finally:
            stores.close()
    report.seconds = time.monotonic() - began
    return report


def _soak(
    db: str,
    kind: str,
    size: Form,
    seed: int,
    settle: float,
    broken: bool,
    folder: Path,
    report: SoakReport,
    say: Callable[[str], None],
) -> None:
    proxy = Proxy.to(db).start() if kind == "network" else None
    pool = _Workers(proxy.url(db) if proxy else db, folder, size.workers)
    # The driver watches on a connection of its own; its client calls (start,
    # signal) go through the proxy like the workers' and are retried as a client would.
    store = open_store(db, migrate=False)
    client = open_store(proxy.url(db), migrate=False) if proxy else store
    injector = _Injector(pool, proxy, random.Random(f"{seed}:{kind}"))
    signaled: set[int] = set()
    try:
        for slot in range(size.workers):
            pool.spawn(slot)
        with workload.app.using(client):
            started = 0
            t0 = time.monotonic()
            injector.start()
            while time.monotonic() - t0 < size.seconds:
                # Arrivals spread over the first two thirds; the rest is recovery under fire.
                elapsed = time.monotonic() - t0
                due = min(size.runs, 1 + int(elapsed / (size.seconds * 2 / 3) * size.runs))
                for n in range(started, due):
                    _client(
                        report,
                        f"start soak-{n}",
                        lambda n=n: workload.app.start(  # type: ignore[misc]
                            workload.job, n, key=f"soak-{n}", broken=broken
                        ),
                    )
                started = max(started, due)
                _signal(store, folder, signaled, report)
                report.worker_exits += pool.revive()
                time.sleep(0.1)
            injector.stop()
            say(f"{kind}: {started} runs started, faults stop; settling")
            deadline = time.monotonic() + settle
            while time.monotonic() < deadline:
                _signal(store, folder, signaled, report)
                report.worker_exits += pool.revive()
                runs = store.list_runs(workload.app.name, limit=10_000)
                if all(r.state in port.TERMINAL_STATES for r in runs):
                    break
                time.sleep(0.2)
        hung = pool.stop(timeout=15.0)
        report.violations.extend(
            f"worker {name} did not stop within 15s of SIGTERM" for name in hung
        )
        report.kills = len(injector.kills)
        report.faults = dict(injector.faults)
        report.ambiguous_commits = proxy.cuts if proxy else 0
        _check(store, folder, injector.kills, report)
    finally:
        injector.stop()
        pool.stop(timeout=5.0)
        if proxy is not None:
            proxy.close()
            client.close()
        store.close()


class _Injector:
    """Injects one fault every 0.2 to 0.6 s (seeded) from a thread of its own."""

    def __init__(self, pool: _Workers, proxy: Proxy | None, rng: random.Random) -> None:
        self.pool = pool
        self.proxy = proxy
        self.rng = rng
        self.kills: list[tuple[float, str]] = []
        self.faults: Counter[str] = Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="soak-faults", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        if self.proxy is not None:
            self.proxy.latency = 0.0

    def _loop(self) -> None:
        while not self._stop.wait(self.rng.uniform(0.2, 0.6)):
            if self.proxy is not None:
                self.faults[_fault(self.proxy, self.rng)] += 1
                continue
            # A worker killed while it boots holds nothing, and one killed in its
            # first lease_ttl has not recovered anything yet (clockwatch): kill one
            # that has served a while, and never the last one serving, so that the
            # time to recover is another worker noticing, not a process booting.
            serving = self.pool.serving(SERVED)
            if len(serving) > 1 or (len(self.pool.names) == 1 and serving):
                slot = self.rng.choice(serving)
                self.kills.append(self.pool.replace(slot))


def _fault(proxy: Proxy, rng: random.Random) -> str:
    """Inject one fault on a random live link; return its name."""
    action = rng.choice(("latency", "reset", "blackhole", "cut_after_commit"))
    links = proxy.live()
    if action == "latency":
        proxy.latency = rng.choice((0.0, 0.005, 0.02, 0.05))
    elif action == "cut_after_commit":
        proxy.cut_after_commit()
    elif not links:
        return "none"
    elif action == "reset":
        rng.choice(links).reset()
    else:
        rng.choice(links).blackhole(rng.uniform(0.5, 3.0))
    return action


T = TypeVar("T")


def _client(report: SoakReport, what: str, call: Callable[[], T]) -> T | None:
    """Make a client call, retried (it is safe to repeat) while the store is unreachable.

    A call that has not succeeded within the bound is a violation.
    """
    began = time.monotonic()
    while True:
        try:
            result = call()
        except errors.StoreUnavailable:
            if time.monotonic() - began < BOUND:
                time.sleep(0.1)
                continue
            result = None
        took = time.monotonic() - began
        report.slowest = max(report.slowest, took)
        if took > BOUND:
            report.violations.append(f"client call {what} took {took:.1f}s (bound {BOUND:g}s)")
        return result


def _signal(store: port.Store, folder: Path, signaled: set[int], report: SoakReport) -> None:
    """Signal every even run that waits (its first wait is the signal's)."""
    for run in store.list_runs(workload.app.name, state="waiting", limit=10_000):
        if run.parent_id is not None or not run.key:
            continue
        n = int(run.key.split("-")[1])
        if n % 2 or n in signaled:
            continue
        signal_id = f"go-{n}"

        def send(
            run_id: str = run.run_id, n: int = n, sid: str = signal_id
        ) -> records.Receipt | None:
            try:
                return workload.app.signal(run_id, workload.WAIT_NAME, f"v{n}", signal_id=sid)
            except errors.WaitSettled as exc:
                settled: records.Receipt = exc.receipt
                return settled
            except errors.RunFinished:
                return None

        receipt = _client(report, f"signal {signal_id}", send)
        signaled.add(n)
        if receipt and receipt.signal_id == signal_id and receipt.outcome == "signaled":
            scenario_api.append(
                str(folder / "events.jsonl"),
                scenario_api.Event("driver", "signal", signal_id, label=run.run_id),
            )


def _check(
    store: port.Store, folder: Path, kills: list[tuple[float, str]], report: SoakReport
) -> None:
    runs = store.list_runs(workload.app.name, limit=10_000)
    view = scenario_api.TrialView(
        scenario=f"soak-{report.kind}",
        site="",
        runs=runs,
        journals={r.run_id: store.journal(r.run_id) for r in runs},
        at_crash={},
        events=scenario_api.read_events(str(folder / "events.jsonl")),
    )
    report.violations.extend(checks.invariants(view))
    roots = view.roots()
    if len(roots) != report.runs:
        report.violations.append(f"{len(roots)} runs exist, not the {report.runs} started")
    report.ends = dict(Counter(r.state for r in roots))
    # Every wait of the workload is satisfied (a timer or a signal sent): a run
    # still waiting after the settle lost its wake-up.
    report.violations.extend(
        f"run {r.run_id} ({r.workflow}) is still {r.state} after the faults stopped"
        for r in runs
        if r.state not in port.TERMINAL_STATES and r.state in checks.RESTING
    )
    timeline = _timeline(folder / "timeline.jsonl")
    slow = [e for e in timeline if e["kind"] == "slow"]
    report.slowest = max([report.slowest, *(float(e["seconds"]) for e in slow)])
    report.violations.extend(
        f"{e['who']}: store call {e['call']} took {e['seconds']}s (bound {BOUND:g}s)"
        for e in slow
        if float(e["seconds"]) > BOUND
    )
    report.recoveries = recoveries(timeline, kills)
    report.next_steps = recoveries(timeline, kills, "step")


def _timeline(path: Path) -> list[dict[str, Any]]:
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in lines if line.strip()]


def recoveries(
    timeline: list[dict[str, Any]], kills: list[tuple[float, str]], kind: str = "claim"
) -> list[float]:
    """Return, for each run a killed worker held, the seconds until another worker went on.

    A run is held by worker W at a kill when W's last record of it before the
    kill is a claim or a step (not a let-go). It went on at the first record
    of ``kind`` another worker made for it after the kill: ``claim`` (the run
    resumed) or ``step`` (its next step began; a run with no step left counts
    from its claim).
    """
    found: list[float] = []
    for killed_at, name in kills:
        last: dict[str, str] = {}
        for e in timeline:
            if e["who"] == name and e["t"] <= killed_at and e["run"]:
                last[e["run"]] = e["kind"]
        for run, held in last.items():
            if held == "let_go":
                continue
            after = [e for e in timeline if e["run"] == run and e["t"] > killed_at]
            nxt = next((e for e in after if e["kind"] == kind), None) or next(
                (e for e in after if e["kind"] == "claim"), None
            )
            if nxt is not None and nxt["who"] != name:
                found.append(nxt["t"] - killed_at)
    return sorted(found)
