"""``perdure demo``: an order workflow that survives the SIGKILL of its worker.

The demo writes a small module (``demo_shop.py``) into a temporary directory,
starts a run of its ``order`` workflow, serves it with a worker *process*,
kills that process with SIGKILL once two steps are done and the run sleeps,
starts a second worker and shows the run finishing. Every step appends a line
to ``effects.log``; at the end each step must have run exactly once.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

from perdure import client as client_api
from perdure import errors, records
from perdure.store import open_store, port

DEMO_MODULE = '''\
"""The shop of ``perdure demo``: an order workflow of four steps and a durable sleep.

Each step appends ``<run id>/<step>`` to effects.log next to this file, so
that any re-execution of a step would show there.
"""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path

import perdure

app = perdure.App(name="demo")  # the worker's --store says where runs live
EFFECTS = Path(__file__).with_name("effects.log")


def record_effect() -> None:
    with EFFECTS.open("a", encoding="utf-8") as log:
        log.write(perdure.idempotency_key() + "\\n")
    time.sleep(0.25)  # a little work, so that progress is visible


@app.step()
def reserve_stock(order_id: str, items: int) -> dict:
    record_effect()
    return {"hold": f"H-{order_id}", "items": items}


@app.step(effect="once", retry=perdure.Retry(max_attempts=1))
def charge_card(order_id: str, cents: int) -> str:
    record_effect()
    return f"ch_{order_id.lower()}_{cents}"


@app.step()
def ship(order_id: str) -> str:
    record_effect()
    return f"TRK-{order_id}"


@app.step()
def notify(order_id: str, tracking: str) -> bool:
    record_effect()
    return True


@app.workflow(version="1")
def order(ctx: perdure.Context, order_id: str, cents: int) -> dict:
    hold = reserve_stock(order_id, 2)
    charge = charge_card(order_id, cents)
    ctx.sleep(timedelta(seconds=3))  # let the warehouse pick the items
    tracking = ship(order_id)
    notify(order_id, tracking)
    return {"order": order_id, "hold": hold["hold"], "charge": charge, "tracking": tracking}
'''

STEPS = ("reserve_stock", "charge_card", "ship", "notify")
ORDER = ("A-1001", 4200)
LEASE_TTL = "2"
HEARTBEAT = "0.5"
TIME_LIMIT = 25.0


class DemoFailed(Exception):
    """The demo did not show what it should."""


def _absolute(url: str) -> str:
    """Make a relative ``sqlite:///`` URL absolute, since the workers run elsewhere."""
    prefix = "sqlite:///"
    if url.startswith(prefix) and not url.startswith(prefix + "/"):
        return prefix + os.path.abspath(url[len(prefix) :])
    return url


@contextlib.contextmanager
def _terminate_on_sigterm() -> Iterator[None]:
    """Let SIGTERM unwind the demo (so its workers are stopped) instead of killing it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class _Demo:
    def __init__(
        self, out: Callable[[str], None], folder: Path, url: str, report: dict[str, Any]
    ) -> None:
        self.out = out
        self.folder = folder
        self.url = url
        self.report = report
        self.started = time.monotonic()
        self.started_at = datetime.now(UTC)
        self.workers: list[subprocess.Popen[bytes]] = []
        self.labels: dict[int, str] = {}
        self.seen = 0
        self.store: port.Store | None = None
        self.run_id = ""

    # -- output ---------------------------------------------------------------

    def say(self, message: str, at: datetime | None = None) -> None:
        if at is not None:
            elapsed = max(0.0, (at - self.started_at).total_seconds())
        else:
            elapsed = time.monotonic() - self.started
        self.out(f"[{elapsed:4.1f}s] {message}")

    def who(self, worker_id: str | None) -> str:
        if not worker_id:
            return "a worker"
        parts = worker_id.rsplit("-", 2)
        if len(parts) == 3 and parts[1].isdigit():
            return self.labels.get(int(parts[1]), worker_id)
        return worker_id

    # -- workers --------------------------------------------------------------

    def start_worker(self) -> subprocess.Popen[bytes]:
        number = len(self.workers) + 1
        package_root = str(Path(__file__).resolve().parent.parent)
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (package_root, env.get("PYTHONPATH", "")) if p
        )
        command = [
            sys.executable,
            "-m",
            "perdure",
            "worker",
            "demo_shop:app",
            "--store",
            self.url,
            "--lease-ttl",
            LEASE_TTL,
            "--heartbeat",
            HEARTBEAT,
        ]
        with open(self.folder / f"worker-{number}.log", "wb") as log:
            proc = subprocess.Popen(
                command,
                cwd=self.folder,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        self.workers.append(proc)
        self.labels[proc.pid] = f"worker {number}"
        self.say(
            f"worker {number} started (pid {proc.pid}): perdure worker demo_shop:app "
            f"--lease-ttl {LEASE_TTL} --heartbeat {HEARTBEAT}"
        )
        return proc

    def stop_workers(self) -> None:
        for proc in self.workers:
            if proc.poll() is None:
                proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)

    def worker_logs(self) -> None:
        for number in range(1, len(self.workers) + 1):
            path = self.folder / f"worker-{number}.log"
            with contextlib.suppress(OSError):
                tail = path.read_text(errors="replace").splitlines()[-12:]
                self.out(f"--- last lines of worker {number}'s log ---")
                for line in tail:
                    self.out(f"    {line}")

    # -- watching -------------------------------------------------------------

    def describe(self, entry: records.Provenance, journal: list[port.JournalEntry]) -> str | None:
        who = self.who(entry.worker)
        if entry.kind == "claimed":
            return f"run claimed by {who} (attempt {entry.generation})"
        if entry.kind == "recovered":
            return (
                f"run recovered by {who} after the previous lease lapsed "
                f"(attempt {entry.generation})"
            )
        if entry.kind == "effect_started":
            return f"step {entry.step}: effect started (a once step: journaled before it runs)"
        if entry.kind == "step_completed":
            found = [e for e in journal if e.kind == "step" and e.name == entry.step]
            output = f" -> {found[-1].output}" if found and found[-1].output else ""
            return f"step {entry.step} done{output}"
        if entry.kind == "step_failed":
            return f"step {entry.step} failed"
        if entry.kind == "parked":
            sleeps = [e for e in journal if e.kind == "sleep" and e.output]
            until = ""
            if sleeps:
                when = datetime.fromisoformat(json.loads(sleeps[-1].output or '""'))
                until = f" until +{(when - self.started_at).total_seconds():.1f}s"
            return f"run parked in its durable sleep{until}; {who} released it"
        if entry.kind in ("step_started", "initialized"):
            return None
        return f"run {entry.kind.replace('_', ' ')}" + (f" by {who}" if entry.worker else "")

    def watch(
        self, client: client_api.Client, until: Callable[[records.RunInfo], bool], what: str
    ) -> records.RunInfo:
        assert self.store is not None
        while True:
            info = client.get(self.run_id)
            journal = self.store.journal(self.run_id)
            for entry in client.history(self.run_id):
                if entry.sequence <= self.seen:
                    continue
                self.seen = entry.sequence
                line = self.describe(entry, journal)
                if line:
                    self.say(line, entry.at)
            if until(info):
                return info
            if info.done:
                raise DemoFailed(
                    f"the run ended {info.state} while waiting for {what}: "
                    f"{(info.error or {}).get('message', '')}"
                )
            live = self.workers[-1]
            if live.poll() is not None:
                raise DemoFailed(
                    f"{self.labels[live.pid]} exited with status {live.returncode} "
                    f"while waiting for {what}"
                )
            if time.monotonic() - self.started > TIME_LIMIT:
                raise DemoFailed(f"gave up after {TIME_LIMIT:.0f}s waiting for {what}")
            time.sleep(0.05)

    # -- the story ------------------------------------------------------------

    def run(self) -> int:
        (self.folder / "demo_shop.py").write_text(DEMO_MODULE, encoding="utf-8")
        effects = self.folder / "effects.log"
        effects.touch()
        self.out("perdure demo: an order workflow outlives the worker that runs it")
        self.store = open_store(self.url)
        self.report["store"] = self.store.url  # without any password
        self.out(f"  code   {self.folder / 'demo_shop.py'}")
        self.out(f"  store  {self.store.url}")
        self.out("  steps  reserve_stock, charge_card (once), sleep 3s, ship, notify")
        client = client_api.Client(self.store, "demo")
        handle = client.start("order", "1", list(ORDER))
        self.run_id = handle.run_id
        self.report["run_id"] = self.run_id
        self.say(f"run {self.run_id} started: order{ORDER!r}")

        first = self.start_worker()
        info = self.watch(client, lambda i: i.state == "waiting", "the durable sleep")
        first.kill()
        first.wait(timeout=5)
        self.report["killed_pid"] = first.pid
        self.say(f"worker 1 killed with SIGKILL (pid {first.pid}) while the run was {info.state}")

        second = self.start_worker()
        info = self.watch(client, lambda i: i.done, "the end of the run")
        if info.state != "succeeded":
            raise DemoFailed(f"the run ended {info.state}: {(info.error or {}).get('message')}")

        journal = self.store.journal(self.run_id)
        self.out(
            "journal: "
            + " | ".join(
                f"{e.position} {e.kind}{'' if e.name == e.kind else ' ' + e.name} {e.status}"
                for e in journal
            )
        )
        lines = effects.read_text(encoding="utf-8").splitlines()
        counts = collections.Counter(
            line.split("/", 1)[1] for line in lines if line.startswith(self.run_id + "/")
        )
        self.report["counts"] = {step: counts.get(step, 0) for step in STEPS}
        self.out("executions per step (from effects.log):")
        for step in STEPS:
            self.out(f"  {step.ljust(14)} {counts.get(step, 0)}")
        wrong = [f"{s} ran {counts.get(s, 0)} times" for s in STEPS if counts.get(s, 0) != 1]
        if wrong:
            raise DemoFailed("a step did not run exactly once: " + ", ".join(wrong))
        self.report["result"] = info.result
        self.out(f"result: {json.dumps(info.result)}")

        second.send_signal(signal.SIGTERM)
        try:
            code = second.wait(timeout=10)
        except subprocess.TimeoutExpired as exc:
            raise DemoFailed("worker 2 did not stop within 10s of SIGTERM") from exc
        self.say(f"worker 2 stopped on SIGTERM (exit status {code})")
        elapsed = time.monotonic() - self.started
        self.report["elapsed"] = round(elapsed, 2)
        self.out(
            f"ok in {elapsed:.1f}s: the run survived the loss of its worker and every "
            "step ran exactly once"
        )
        return 0


def run_demo(
    out: Callable[[str], None] = print,
    *,
    store: str | None = None,
    report: dict[str, Any] | None = None,
) -> int:
    """Run the demo, printing progress through ``out``; return the exit status (0: all good).

    ``store`` runs it on another store than a fresh SQLite file in the
    temporary directory; ``report`` (if given) receives a summary.
    """
    summary: dict[str, Any] = report if report is not None else {}
    with tempfile.TemporaryDirectory(prefix="perdure-demo-") as tmp:
        folder = Path(tmp)
        url = _absolute(store) if store else f"sqlite:///{folder / 'demo.db'}"
        summary["ok"] = False
        demo = _Demo(out, folder, url, summary)
        try:
            with _terminate_on_sigterm():
                code = demo.run()
        except (errors.InvalidInput, errors.StoreError) as exc:
            out(f"demo failed: [{exc.code}] {exc}")
            summary["problem"] = str(exc)
            return 2
        except DemoFailed as exc:
            out(f"demo failed: {exc}")
            demo.worker_logs()
            summary["problem"] = str(exc)
            return 1
        except Exception as exc:
            out(f"demo failed: {type(exc).__name__}: {exc}")
            demo.worker_logs()
            summary["problem"] = f"{type(exc).__name__}: {exc}"
            return 1
        finally:
            demo.stop_workers()
            if demo.store is not None:
                demo.store.close()
        summary["ok"] = code == 0
        return code
