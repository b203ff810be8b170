"""Many worker processes on one PostgreSQL store, killed and replaced at random.

Three ``perdure worker`` processes serve 300 runs of ``chaos_app.order``
(reserve, charge once, ship, notify). While they work, a seeded schedule picks
a live worker, waits until that worker has appended a random number of new
lines to its effects file (so each kill lands on a busy worker, ordered by
what the processes wrote, not by sleeping), kills it with SIGKILL and starts a
replacement. Then every worker is stopped with SIGTERM, one clean worker
drains what is left, and the ledgers and effects files are checked:

* no run was held by two live claims at once: claims of a run carry strictly
  increasing generations, every receipt a worker wrote carries the generation
  and worker of the latest claim, and in the effects files a run never runs a
  step of an older generation after a newer one began;
* no run is lost: all 300 end succeeded, or needs_attention with
  effect_outcome_unknown on the once step where a kill hit its effect;
* every once effect ran at most once (exactly once for a succeeded run).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import perdure
from perdure import codec

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

HERE = Path(__file__).resolve().parent
APP = "chaos"
STEPS = ("reserve", "charge", "ship", "notify")
ONCE = "charge"
RUNS = 300
WORKERS = 3
KILLS = 10
SEED = 20240611
STEP_SECONDS = 0.1  # a run takes about half a second, so the kills meet busy workers
CHAOS_LIMIT = 60.0  # seconds for the whole kill-and-replace phase
DRAIN_LIMIT = 25.0  # seconds for the clean worker to end every run
TERMINAL = ("succeeded", "failed", "canceled", "needs_attention")


def wait_for(check: Callable[[], Any], what: str, timeout: float) -> Any:
    """Poll ``check`` until it returns something truthy; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.02)


@dataclass(frozen=True)
class Effect:
    """One line of an effects file."""

    run_id: str
    step: str
    pid: int
    generation: int
    worker: str
    phase: str
    at: int

    @classmethod
    def parse(cls, line: str) -> Effect:
        run_id, step, pid, generation, worker, phase, at = line.split(" ")
        return cls(run_id, step, int(pid), int(generation), worker, phase, int(at))


class Fleet:
    """Worker processes of ``chaos_app``; every one left is killed at teardown."""

    def __init__(self, url: str, effects: Path, logs: Path) -> None:
        self.url = url
        self.effects = effects
        self.logs = logs
        path = [str(HERE), *(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)]
        self.env = {
            **os.environ,
            "PERDURE_STORE": url,
            "CHAOS_EFFECTS_DIR": str(effects),
            "PYTHONPATH": os.pathsep.join(path),
            "PYTHONUNBUFFERED": "1",
            "CHAOS_STEP_SECONDS": str(STEP_SECONDS),
        }
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self) -> subprocess.Popen[bytes]:
        command = [
            sys.executable,
            "-m",
            "perdure",
            "worker",
            "chaos_app:app",
            "--store",
            self.url,
            "--lease-ttl",
            "2",
            "--heartbeat",
            "0.5",
            "--concurrency",
            "4",
        ]
        path = self.logs / f"worker-{len(self.procs)}.log"
        with open(path, "wb") as log:
            proc = subprocess.Popen(
                command, cwd=HERE, env=self.env, stdout=log, stderr=subprocess.STDOUT
            )
        self.procs.append(proc)
        # Serving means its SIGTERM handler is installed (Worker.run logs it after).
        wait_for(
            lambda: proc.poll() is not None or b"INFO perdure.worker: worker " in path.read_bytes(),
            f"worker {proc.pid} to serve",
            20.0,
        )
        assert proc.poll() is None, path.read_text(errors="replace")
        return proc

    def lines(self, pid: int) -> int:
        path = self.effects / f"effects-{pid}.log"
        return path.read_bytes().count(b"\n") if path.exists() else 0

    def kill(self, proc: subprocess.Popen[bytes]) -> None:
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=10) == -signal.SIGKILL

    def stop(self, procs: list[subprocess.Popen[bytes]]) -> list[int | None]:
        """SIGTERM every process, then wait for each (bounded)."""
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
        statuses: list[int | None] = []
        for proc in procs:
            try:
                statuses.append(proc.wait(timeout=20))
            except subprocess.TimeoutExpired:
                # Its threads' stacks go to its log (perdure worker dumps them on SIGUSR1).
                os.kill(proc.pid, signal.SIGUSR1)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=2)
                proc.kill()
                statuses.append(None)
        return statuses

    def log_tail(
        self,
        procs: list[subprocess.Popen[bytes]] | None = None,
        statuses: list[int | None] | None = None,
    ) -> str:
        """The logs' tails; a process that did not exit 0 gets its whole log, first."""
        failed: dict[int, int | None] = {}
        if procs is not None and statuses is not None:
            failed = {
                self.procs.index(proc): status
                for proc, status in zip(procs, statuses, strict=True)
                if status != 0
            }
        heads, tails = [], []
        for index, proc in enumerate(self.procs):
            path = self.logs / f"worker-{index}.log"
            text = path.read_text(errors="replace").splitlines()
            if index in failed:
                heads.append(
                    f"--- worker-{index}.log (pid {proc.pid}, exit {failed[index]})\n"
                    + "\n".join(text[-400:])
                )
                continue
            dumped = any("most recent call first" in line for line in text)
            tails.append(f"--- {path.name}\n" + "\n".join(text[-(200 if dumped else 15) :]))
        return "\n".join(heads + tails)

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)


@pytest.fixture
def fleet(postgres_url: str, tmp_path: Path) -> Iterator[Fleet]:
    effects = tmp_path / "effects"
    effects.mkdir()
    started = Fleet(postgres_url, effects, tmp_path)
    try:
        yield started
    finally:
        started.close()


def ended_count(app: perdure.App) -> int:
    import psycopg

    assert app.url is not None
    with psycopg.connect(app.url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM perdure.runs WHERE app = %s AND state = ANY(%s)",
            (APP, list(TERMINAL)),
        ).fetchone()
    assert row is not None
    return int(row[0])


def read_effects(effects: Path) -> list[Effect]:
    found = []
    for path in sorted(effects.glob("effects-*.log")):
        text = path.read_text()
        assert text == "" or text.endswith("\n"), f"{path.name} ends with a torn line"
        found += [Effect.parse(line) for line in text.splitlines()]
    return found


def check_ledger(run_id: str, history: list[perdure.Provenance]) -> dict[int, str]:
    """Check one run's claims in its ledger; return {generation: worker} of its claims."""
    assert history[0].kind == "initialized", history
    assert history[-1].kind == "finished", history
    claims: dict[int, str] = {}
    holder: tuple[int, str] | None = None
    for receipt in history:
        if receipt.kind in ("claimed", "recovered"):
            assert receipt.worker is not None, (run_id, receipt)
            # A claim takes a generation no earlier claim of the run had.
            assert holder is None or receipt.generation > holder[0], (run_id, history)
            holder = (receipt.generation, receipt.worker)
            claims[receipt.generation] = receipt.worker
        elif receipt.worker is not None:
            # Written for a claim: only the latest claim's holder may write.
            assert holder == (receipt.generation, receipt.worker), (run_id, receipt, history)
        if receipt.kind in ("step_completed", "effect_started", "finished"):
            assert holder is not None and receipt.generation == holder[0], (run_id, history)
    return claims


def test_workers_killed_at_random_lose_no_run_and_repeat_no_once_effect(
    fleet: Fleet, postgres_url: str
) -> None:
    app = perdure.App(postgres_url, name=APP)
    try:
        run_ids = [app.client.start("order", "1", [n]).run_id for n in range(RUNS)]
        rng = random.Random(SEED)
        live = [fleet.start() for _ in range(WORKERS)]

        # Chaos: kill a busy worker, start its replacement; KILLS times, bounded.
        kills: list[tuple[int, int]] = []  # (pid, effect lines it had written)
        chaos_end = time.monotonic() + CHAOS_LIMIT
        while len(kills) < KILLS and time.monotonic() < chaos_end:
            victim = rng.choice(live)
            target = fleet.lines(victim.pid) + rng.randint(2, 16)

            def busy_or_done(pid: int = victim.pid, target: int = target) -> str | None:
                if fleet.lines(pid) >= target:
                    return "busy"
                return "done" if ended_count(app) == RUNS else None

            busy = wait_for(
                busy_or_done,
                f"worker {victim.pid} to write {target} effect lines",
                max(1.0, chaos_end - time.monotonic()),
            )
            if busy == "done":
                break
            fleet.kill(victim)
            kills.append((victim.pid, fleet.lines(victim.pid)))
            live.remove(victim)
            live.append(fleet.start())

        statuses = fleet.stop(live)
        assert statuses == [0] * len(live), fleet.log_tail(live, statuses)

        # A clean worker drains what the killed ones left behind.
        drain = fleet.start()
        try:
            wait_for(lambda: ended_count(app) == RUNS, f"all {RUNS} runs to end", DRAIN_LIMIT)
        finally:
            drained = fleet.stop([drain])
            assert drained == [0], fleet.log_tail([drain], drained)

        assert len(kills) == KILLS, f"only {len(kills)} kills before the runs ended: {kills}"
        infos = {run_id: app.get(run_id) for run_id in run_ids}
        effects = read_effects(fleet.effects)
        by_run: dict[str, list[Effect]] = defaultdict(list)
        for effect in effects:
            by_run[effect.run_id].append(effect)
        pids = {proc.pid for proc in fleet.procs}
        assert {e.pid for e in effects} <= pids

        outcomes: Counter[str] = Counter()
        for run_id in run_ids:
            info = infos[run_id]
            # 0 lost runs: every run ended, and only in the two allowed ways.
            if info.state == "succeeded":
                assert info.result == [f"{s}:{info_n(app, run_id)}" for s in STEPS]
                outcomes["succeeded"] += 1
            else:
                assert info.state == "needs_attention", (run_id, info.state, info.error)
                assert info.error is not None
                assert (info.error["code"], info.error.get("step")) == (
                    "effect_outcome_unknown",
                    ONCE,
                ), (run_id, info.error)
                outcomes["effect_outcome_unknown"] += 1

            # 0 runs held by two live claims: the ledger.
            claims = check_ledger(run_id, app.history(run_id))

            # ... and the effects: every execution ran under a claim of this run,
            # and none of an older generation ran once a newer one had begun.
            mine = sorted(by_run[run_id], key=lambda e: e.at)
            for effect in mine:
                assert claims.get(effect.generation) == effect.worker, (run_id, effect, claims)
                assert f"-{effect.pid}-" in effect.worker, effect
            generations = [e.generation for e in mine]
            assert generations == sorted(generations), (run_id, mine)
            started = Counter((e.step, e.generation) for e in mine if e.phase == "effect")
            assert max(started.values(), default=0) <= 1, (run_id, mine)

            # Every once effect at most once; exactly once when the run succeeded.
            charged = sum(1 for e in mine if e.step == ONCE and e.phase == "effect")
            assert charged <= 1, (run_id, mine)
            journal = [(e.position, e.name, e.status) for e in app.store.journal(run_id)]
            if info.state == "succeeded":
                assert charged == 1, (run_id, mine)
                assert {e.step for e in mine if e.phase == "effect"} == set(STEPS)
                assert journal == [(i + 1, s, "ok") for i, s in enumerate(STEPS)]
            else:
                assert journal == [(1, "reserve", "ok"), (2, ONCE, "started")], journal

        assert sum(outcomes.values()) == RUNS
        print(f"kills={kills} outcomes={dict(outcomes)} effect lines={len(effects)}")
    finally:
        app.close()


def info_n(app: perdure.App, run_id: str) -> int:
    """Return the run's input ``n``."""
    run = app.store.get_run(run_id)
    assert run is not None
    data = codec.decode(run.input)
    assert isinstance(data, dict)
    return int(data["args"][0])
