"""Lease renewal that a step holding the GIL cannot starve.

A step that holds the GIL (a C extension, a backtracking regex, tight numeric
code) stops every other thread of its process, the heartbeat thread included.
A lease renewed from that thread lapses although the worker is alive and
working, another worker takes the run over, and the step runs twice. So a
worker renews its leases from a small companion process, the *keeper*, that
no step of the worker can starve. The keeper renews only while the worker
shows that it is alive, by either sign:

* its heartbeat thread beats (a line every ``heartbeat`` seconds), or
* the worker process is runnable and its CPU time grew since the keeper's
  last look (Linux ``/proc``): what a step bound to the GIL looks like.

A worker that is stopped (``SIGSTOP``), dead or gone shows neither: the
keeper stops renewing, the leases lapse as they always did, and fencing
refuses whatever the worker writes if it wakes up. When the worker's end of
the pipe closes (it exited or was killed) the keeper exits.

The keeper reopens the store from its URL, so a store passed as an object
(a test wrapper, an injected clock) is renewed from a thread instead.

Wire format, one JSON object a line. Worker to keeper: a first line with the
configuration, then ``hold`` (a claim to renew), ``drop`` and ``beat``.
Keeper to worker: ``ready`` once it renews (until then the worker renews
from its own heartbeat thread), and ``lost`` (a renewal was refused: another
claim owns the run, or its cancel was requested).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import IO, Any

from perdure import errors
from perdure.store import planport, port

log = logging.getLogger("perdure.keeper")

LostHandler = Callable[[str, int, errors.LeaseLost], None]

# Not ``-m perdure.keeper``: the package imports this module first, which runpy
# warns about. The package is registered without running its ``__init__`` (the
# whole API: about 0.15 s of CPU, taken from the worker's cores at every worker
# start), so the keeper loads only the modules it uses.
_ENTRY = (
    "import importlib.util, sys, types\n"
    "spec = importlib.util.find_spec('perdure')\n"
    "package = types.ModuleType('perdure')\n"
    "package.__path__, package.__spec__ = list(spec.submodule_search_locations), spec\n"
    "sys.modules['perdure'] = package\n"
    "import perdure.keeper as k\n"
    "sys.exit(k.serve(sys.stdin, sys.stdout))\n"
)


def _claim_line(claim: port.Claim) -> dict[str, Any]:
    return {
        "op": "hold",
        "run_id": claim.run_id,
        "worker": claim.worker,
        "generation": claim.generation,
        "lease_expires_at": claim.lease_expires_at.isoformat(),
        "canceling": claim.canceling,
    }


class Keeper:
    """The worker's side of the keeper process."""

    def __init__(
        self,
        url: str,
        *,
        lease_ttl: float,
        heartbeat: float,
        on_lost: LostHandler,
        watch: int | None = None,
    ) -> None:
        """Prepare a keeper for the worker process ``watch`` (default: this one)."""
        self._config = {
            "url": url,
            "lease_ttl": lease_ttl,
            "heartbeat": heartbeat,
            "pid": os.getpid() if watch is None else watch,
        }
        self._on_lost = on_lost
        self._process: subprocess.Popen[str] | None = None
        self._lock = threading.Lock()
        self._dropped: list[str] = []
        self._reader: threading.Thread | None = None
        self.ready = threading.Event()
        """Set once the keeper has opened the store and renews."""

    def start(self) -> None:
        """Start the keeper process.

        Raises:
            OSError: the process could not be started.
        """
        # The URL may carry a password: it travels on the pipe, never in argv.
        self._process = subprocess.Popen(
            [sys.executable, "-c", _ENTRY],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        self._send(self._config)
        self._reader = threading.Thread(
            target=self._read, args=(self._process.stdout,), name="perdure-keeper", daemon=True
        )
        self._reader.start()

    @property
    def alive(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def hold(self, claim: port.Claim) -> None:
        """Renew ``claim`` from now on (a newer generation of a run replaces an older one)."""
        self.hold_all([claim])

    def hold_all(self, claims: Sequence[port.Claim]) -> None:
        """Renew each of ``claims`` from now on, told to the keeper in one write."""
        self._send_lines([json.dumps(_claim_line(claim)) for claim in claims])

    def hold_task(self, key: str, claim: planport.TaskClaim) -> None:
        """Renew a task's claim from now on, under ``key`` (``run_id/task``)."""
        line = {
            "op": "hold",
            "run_id": key,
            "task": claim.task,
            "task_run": claim.run_id,
            "worker": claim.worker,
            "generation": claim.generation,
            "lease_expires_at": claim.lease_expires_at.isoformat(),
        }
        self._send(line)

    def drop(self, run_id: str, generation: int, *, settled: bool = False) -> None:
        """Stop renewing the run's claim of ``generation``.

        A ``settled`` claim (its run ended, parked or was released under it)
        need not wake the keeper: until the drop arrives, the keeper's renewal
        of it is refused by the store's fence, which changes nothing, and its
        ``lost`` report names a claim the worker no longer runs. So such drops
        wait for the next hold or beat, which carries them in one write. Any
        other drop (a run given up on while the store still shows it running)
        is sent at once, so that its lease lapses on time.
        """
        line = json.dumps({"op": "drop", "run_id": run_id, "generation": generation})
        if not settled:
            self._send_lines([line])
            return
        with self._lock:
            self._dropped.append(line)

    def beat(self) -> None:
        """Tell the keeper the worker is alive."""
        self._send({"op": "beat"})

    def close(self, timeout: float = 5.0) -> None:
        """Stop the keeper: it renews nothing more and exits."""
        process = self._process
        if process is None:
            return
        with self._lock, contextlib.suppress(OSError, ValueError):
            assert process.stdin is not None
            process.stdin.close()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if self._reader is not None:
            self._reader.join(timeout)
        if process.stdout is not None:
            process.stdout.close()

    def _send(self, message: dict[str, Any]) -> None:
        self._send_lines([json.dumps(message)])

    def _send_lines(self, lines: list[str]) -> None:
        process = self._process
        if process is None or process.stdin is None:
            return
        with self._lock, contextlib.suppress(OSError, ValueError):
            lines, self._dropped = [*self._dropped, *lines], []
            process.stdin.write("\n".join(lines) + "\n")
            process.stdin.flush()

    def _read(self, stream: IO[str] | None) -> None:
        if stream is None:
            return
        for line in stream:
            try:
                message = json.loads(line)
                if message.get("op") == "ready":
                    self.ready.set()
                if message.get("op") != "lost":
                    continue
                run_id, generation = str(message["run_id"]), int(message["generation"])
                cls = errors.Canceled if message.get("code") == "canceled" else errors.StaleClaim
                self._on_lost(run_id, generation, cls(run_id, str(message.get("message", ""))))
            except (ValueError, KeyError, TypeError) as exc:
                log.warning("unreadable line from the lease keeper: %r (%s)", line, exc)


# -- the keeper process -------------------------------------------------------


class _Progress:
    """Whether a process is runnable and spent CPU time since the last look."""

    def __init__(self, pid: int) -> None:
        self._path = f"/proc/{pid}/stat"
        self._cpu: int | None = None

    def advanced(self) -> bool:
        try:
            with open(self._path, encoding="ascii", errors="replace") as stat:
                # The command name may hold spaces and parentheses: split after it.
                fields = stat.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            return False
        state, cpu = fields[0], int(fields[11]) + int(fields[12])
        before, self._cpu = self._cpu, cpu
        # T/t: stopped or traced; Z/X: dead. Neither is working on a step.
        return state not in ("T", "t", "Z", "X") and before is not None and cpu > before


def _task_claim_of(message: dict[str, Any]) -> planport.TaskClaim:
    # Renewal reads only the run, the task and the generation.
    return planport.TaskClaim(
        run_id=str(message["task_run"]),
        task=str(message["task"]),
        worker=str(message["worker"]),
        generation=int(message["generation"]),
        lease_expires_at=datetime.fromisoformat(str(message["lease_expires_at"])),
        attempt=0,
        effect="",
        app="",
        workflow="",
        version="",
        input="",
    )


def _claim_of(message: dict[str, Any]) -> port.Claim:
    return port.Claim(
        run_id=str(message["run_id"]),
        worker=str(message["worker"]),
        generation=int(message["generation"]),
        lease_expires_at=datetime.fromisoformat(str(message["lease_expires_at"])),
        canceling=bool(message.get("canceling")),
    )


class _KeeperState:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.held: dict[str, port.Claim] = {}
        # Tasks of plan runs, by "run_id/task".
        self.tasks: dict[str, planport.TaskClaim] = {}
        self.last_beat = time.monotonic()
        self.closed = threading.Event()

    def apply(self, message: dict[str, Any]) -> None:
        op = message.get("op")
        with self.lock:
            if op == "beat":
                self.last_beat = time.monotonic()
            elif op == "hold" and "task" in message:
                task = _task_claim_of(message)
                key = str(message["run_id"])
                known = self.tasks.get(key)
                if known is None or known.generation <= task.generation:
                    self.tasks[key] = task
            elif op == "hold":
                claim = _claim_of(message)
                held = self.held.get(claim.run_id)
                if held is None or held.generation <= claim.generation:
                    self.held[claim.run_id] = claim
            elif op == "drop" and str(message["run_id"]) in self.tasks:
                key = str(message["run_id"])
                if self.tasks[key].generation == int(message["generation"]):
                    del self.tasks[key]
            elif op == "drop":
                held = self.held.get(str(message["run_id"]))
                if held is not None and held.generation == int(message["generation"]):
                    del self.held[held.run_id]

    def listen(self, stream: IO[str]) -> None:
        try:
            for line in stream:
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    self.apply(json.loads(line))
        finally:
            self.closed.set()


def _report(out: IO[str], claim: port.Claim, lost: errors.LeaseLost) -> None:
    line = {
        "op": "lost",
        "run_id": claim.run_id,
        "generation": claim.generation,
        "code": lost.code,
        "message": str(lost),
    }
    out.write(json.dumps(line) + "\n")
    out.flush()


def _renew_tasks(store: port.Store, state: _KeeperState, lease_ttl: float, out: IO[str]) -> None:
    with state.lock:
        tasks = list(state.tasks.items())
    if not tasks or not isinstance(store, planport.PlanStore):
        return
    for key, task in tasks:
        try:
            store.renew_task(task, lease_ttl=lease_ttl)
        except errors.StaleClaim as lost:
            line = {"op": "lost", "run_id": key, "generation": task.generation}
            out.write(json.dumps({**line, "code": lost.code, "message": str(lost)}) + "\n")
            out.flush()
            with state.lock:
                if state.tasks.get(key) == task:
                    del state.tasks[key]
        except Exception as exc:
            print(f"perdure keeper: renewal of task {key} failed: {exc}", file=sys.stderr)


def _renew_all(store: port.Store, state: _KeeperState, lease_ttl: float, out: IO[str]) -> None:
    with state.lock:
        claims = list(state.held.values())
    for claim in claims:
        try:
            store.renew(claim, lease_ttl=lease_ttl)
        except errors.Canceled as lost:
            _report(out, claim, lost)
            # The worker is told once and then settles the cancel; the lease
            # must last while it does.
            acknowledged = port.Claim(
                claim.run_id, claim.worker, claim.generation, claim.lease_expires_at, True
            )
            with state.lock:
                if state.held.get(claim.run_id) == claim:
                    state.held[claim.run_id] = acknowledged
        except errors.StaleClaim as lost:
            _report(out, claim, lost)
            with state.lock:
                if state.held.get(claim.run_id) == claim:
                    del state.held[claim.run_id]
        except Exception as exc:
            print(f"perdure keeper: renewal of run {claim.run_id} failed: {exc}", file=sys.stderr)


def serve(stdin: IO[str], stdout: IO[str]) -> int:
    """Run the keeper: renew the worker's claims while the worker is alive."""
    from perdure.store import open_store  # the worker's side never opens a store here

    config = json.loads(stdin.readline() or "null")
    if not isinstance(config, dict):
        return 2
    lease_ttl, heartbeat = float(config["lease_ttl"]), float(config["heartbeat"])
    pid = int(config["pid"])
    parent = os.getppid()
    # Renewals append no receipts, so the ledger bound plays no part here.
    store = open_store(str(config["url"]), migrate=False)
    stdout.write(json.dumps({"op": "ready"}) + "\n")
    stdout.flush()
    state = _KeeperState()
    threading.Thread(target=state.listen, args=(stdin,), daemon=True).start()
    progress = _Progress(pid)
    try:
        while not state.closed.wait(heartbeat):
            if os.getppid() != parent:
                break  # the worker is gone although something kept its pipe open
            # Looked at on every tick, so that its CPU baseline stays fresh.
            working = progress.advanced()
            if working or time.monotonic() - state.last_beat < 2 * heartbeat:
                _renew_all(store, state, lease_ttl, stdout)
                _renew_tasks(store, state, lease_ttl, stdout)
    finally:
        store.close()
    return 0
