"""One trial: a fresh store, a process crashed at one store write, a process that recovers.

Everything that touches the store runs in a child process forked for the
purpose; the exploring process only creates and drops databases and reads the
small JSON files the children leave. A child process ends with ``os._exit``,
so nothing it inherited (a connection, a thread) is closed or flushed twice.

Time is a fake clock that ticks at each reading: the crashed process starts
at a fixed instant, the recovering one a day later, so every lease the crashed process held has
lapsed (``scenario.LEASE_TTL`` is ten minutes) without anyone waiting.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import shutil
import traceback
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from perdure import errors
from perdure.store import open_store, port
from perdure.testing import faults
from perdure.testing.chaos import checks
from perdure.testing.chaos import scenario as scenario_api
from perdure.testing.clock import FakeClock

MODES = ("raise-before", "raise-after", "exit-before", "exit-after")
"""Where a trial's process fails at its k-th store write (docs/testing.md)."""

START = datetime(2030, 1, 1, tzinfo=UTC)
RECOVERY_START = START + timedelta(days=1)
DIED = 137  # the exit status of a process stopped at its site by os._exit
DRIVE_RAISED = 3


@dataclass(frozen=True)
class Site:
    """The ``k``-th store write of the crashed process, and what happens there."""

    k: int
    mode: str

    def __str__(self) -> str:
        return f"{self.mode}@{self.k}"


@dataclass(frozen=True)
class Outcome:
    """What one trial found: violations (must be none) and notes."""

    site: Site | None
    violations: list[str]
    writes: list[str]
    reached: bool
    folder: str
    ends: dict[str, int]
    """How the runs the drive started ended, by state."""


# -- stores -------------------------------------------------------------------------


class Stores:
    """A fresh, migrated store per trial, on SQLite files or PostgreSQL databases."""

    def __init__(self, url: str, folder: Path) -> None:
        self.url = url
        self.folder = folder
        self.postgres = urlsplit(url).scheme in ("postgresql", "postgres")
        self._template: str | None = None
        self._made = 0

    def fresh(self) -> str:
        """Return the URL of an empty, migrated store no trial used before."""
        self._made += 1
        if not self.postgres:
            path = self.folder / f"store-{self._made}.db"
            template = self.folder / "template.db"
            if not template.exists():
                in_child(lambda: open_store(f"sqlite:///{template}").close(), timeout=120)
            shutil.copyfile(template, path)
            return f"sqlite:///{path}"
        if self._template is None:
            name = f"perdure_chaos_{uuid.uuid4().hex[:12]}"
            self._admin(f'CREATE DATABASE "{name}"')
            self._template = name
            made = self._url_of(name)
            in_child(lambda: open_store(made).close(), timeout=120)
        name = f"{self._template}_{self._made}"
        self._admin(f'CREATE DATABASE "{name}" TEMPLATE "{self._template}"')
        return self._url_of(name)

    def discard(self, url: str) -> None:
        """Remove a trial's store."""
        if self.postgres:
            self._admin(f'DROP DATABASE IF EXISTS "{urlsplit(url).path.lstrip("/")}" WITH (FORCE)')
        else:
            path = Path(urlsplit(url).path[1:])
            for suffix in ("", "-wal", "-shm"):
                Path(f"{path}{suffix}").unlink(missing_ok=True)

    def close(self) -> None:
        """Drop the template database (PostgreSQL)."""
        if self._template is not None:
            self._admin(f'DROP DATABASE IF EXISTS "{self._template}" WITH (FORCE)')
            self._template = None

    def _url_of(self, name: str) -> str:
        return urlunsplit(urlsplit(self.url)._replace(path=f"/{name}"))

    def _admin(self, sql: str) -> None:
        try:
            import psycopg
        except ImportError as exc:  # pragma: no cover - the postgres extra is missing
            raise errors.InvalidStoreURL(
                "PostgreSQL needs the postgres extra: pip install 'perdure[postgres]'"
            ) from exc
        try:
            with psycopg.connect(self.url, autocommit=True, connect_timeout=10) as conn:
                conn.execute(sql)  # names we made ourselves
        except psycopg.Error as exc:
            raise errors.StoreUnavailable(f"PostgreSQL refused {sql.split(' ')[0]}: {exc}") from exc


# -- child processes ------------------------------------------------------------------


def in_child(target: Callable[[], Any], *, timeout: float, log: Path | None = None) -> int | None:
    """Run ``target`` in a forked process; return its exit status (None: killed at ``timeout``)."""
    context = multiprocessing.get_context("fork")
    process = context.Process(target=_child, args=(target, log), daemon=True)
    process.start()
    process.join(timeout)
    if process.exitcode is None:
        process.kill()
        process.join(10)
        return None
    return process.exitcode


def _child(target: Callable[[], Any], log: Path | None) -> None:
    if log is not None:
        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
    logging.basicConfig(level=logging.WARNING, force=True)
    status = 0
    try:
        status = target() or 0
    except BaseException:
        traceback.print_exc()
        status = 1
    os._exit(status)


# -- one trial ------------------------------------------------------------------------


def run(
    scenario: scenario_api.Scenario, url: str, folder: Path, site: Site | None, timeout: float
) -> Outcome:
    """Crash a process of ``scenario`` at ``site`` (or at nowhere: count), recover, check."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = _Paths(folder)
    phase = "count" if site is None else "crash"
    status = in_child(
        lambda: _crash(scenario, url, site, paths, phase), timeout=timeout, log=paths.log
    )
    crashed = _read(paths.crashed)
    writes = list(crashed.get("writes", []))
    reached = site is None or crashed.get("reached", False)
    violations: list[str] = []
    # After an injected error the process goes on and may end either way.
    expected = 0 if site is None else DIED if site.mode.startswith("exit") else None
    if status is None:
        violations.append(f"the {phase} process did not finish within {timeout:g}s")
    elif site is None and status != 0:
        violations.append(f"the drive failed without any crash (exit status {status})")
    elif site is not None and reached and expected is not None and status != expected:
        violations.append(f"the crashed process ended with status {status}, not {expected}")
    # The count trial recovers and is checked too: a scenario must pass with no crash,
    # and its drive must be safe to repeat.
    recovered = in_child(
        lambda: _recover(scenario, url, site, paths), timeout=timeout, log=paths.log
    )
    found = _read(paths.recovered)
    if recovered is None:
        violations.append(f"the recovery did not finish within {timeout:g}s")
    elif recovered != 0 or "violations" not in found:
        violations.append(f"the recovery process failed (exit status {recovered})")
    violations.extend(found.get("violations", []))
    ends = {str(k): int(v) for k, v in found.get("ends", {}).items()}
    return Outcome(site, violations, writes, bool(reached), str(folder), ends)


@dataclass(frozen=True)
class _Paths:
    folder: Path

    @property
    def events(self) -> str:
        return str(self.folder / "events.jsonl")

    @property
    def crashed(self) -> Path:
        return self.folder / "crashed.json"

    @property
    def recovered(self) -> Path:
        return self.folder / "recovered.json"

    @property
    def log(self) -> Path:
        return self.folder / "trial.log"


def _read(path: Path) -> dict[str, Any]:
    try:
        found: dict[str, Any] = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return {}
    return found


def _write(path: Path, value: dict[str, Any]) -> None:
    partial = path.with_suffix(".tmp")
    partial.write_text(json.dumps(value))
    os.replace(partial, path)


def _open(url: str, start: datetime, paths: _Paths, phase: str) -> faults.FaultyStore:
    os.environ[scenario_api.EVENTS_ENV] = paths.events
    os.environ[scenario_api.PHASE_ENV] = phase
    store = faults.FaultyStore(open_store(url, clock=_Ticking(start), migrate=False))

    def recorded(_result: Any, claim: port.Claim, entries: Any, *args: Any, **kw: Any) -> None:
        for entry in entries:
            if entry.kind == "step" and entry.status in ("ok", "error"):
                _note_recorded(paths, phase, claim.run_id, entry.name)

    def transacted(result: port.JournalEntry, claim: port.Claim, *args: Any, **kw: Any) -> None:
        _note_recorded(paths, phase, claim.run_id, result.name)

    for operation in ("begin_effect", "finish_step", "park", "finish"):
        store.after(operation, recorded, times=None)
    store.after("transaction_step", transacted, times=None)
    return store


class _Ticking(FakeClock):
    """A fake clock that moves a millisecond at every reading.

    Runs created in one trial then never share an instant, so a store that
    orders claims by time offers them in the same order in every trial (a
    pinned clock leaves PostgreSQL to break the ties as it likes).
    """

    def now(self) -> datetime:
        return self.advance(0.001)


def _note_recorded(paths: _Paths, phase: str, run_id: str, name: str) -> None:
    scenario_api.append(paths.events, scenario_api.Event(phase, "recorded", f"{run_id}/{name}"))


def _crash(
    scenario: scenario_api.Scenario, url: str, site: Site | None, paths: _Paths, phase: str
) -> int:
    store = _open(url, START, paths, phase)
    reached: list[bool] = []

    def report() -> None:
        _write(paths.crashed, {"writes": store.writes, "reached": bool(reached)})

    if site is not None:
        when = site.mode.split("-")[1]

        def fire(operation: str) -> None:
            reached.append(True)
            report()
            if site.mode.startswith("exit"):
                os._exit(DIED)
            raise errors.StoreUnavailable(f"injected failure {when} write {site.k} ({operation})")

        store.at_write(site.k, when, fire)
    drive = scenario_api.Drive(
        scenario.app, store, phase=phase, events=paths.events, bound=scenario.max_executions
    )
    try:
        with scenario.app.using(store):
            scenario.drive(drive)
    except Exception:
        report()
        if site is None or not reached:
            traceback.print_exc()
        # After an injected failure the process dies as it is, like a crash.
        return DRIVE_RAISED
    report()
    return 0


def _recover(scenario: scenario_api.Scenario, url: str, site: Site | None, paths: _Paths) -> int:
    store = _open(url, RECOVERY_START, paths, "recover")
    app = scenario.app.name
    at_crash = {r.run_id: store.journal(r.run_id) for r in store.list_runs(app, limit=10_000)}
    trouble: list[str] = []
    drive = scenario_api.Drive(
        scenario.app, store, phase="recover", events=paths.events, bound=scenario.max_executions
    )
    try:
        with scenario.app.using(store):
            scenario.drive(drive)
    except Exception as exc:
        traceback.print_exc()
        trouble.append(f"the recovering drive raised {type(exc).__name__}: {exc}")
    runs = store.list_runs(app, limit=10_000)
    view = scenario_api.TrialView(
        scenario=scenario.name,
        site=str(site) if site else "none",
        runs=runs,
        journals={r.run_id: store.journal(r.run_id) for r in runs},
        at_crash=at_crash,
        events=scenario_api.read_events(paths.events),
    )
    trouble.extend(checks.invariants(view))
    if scenario.check is not None:
        trouble.extend(scenario.check(view))
    ends = Counter(r.state for r in view.roots())
    _write(paths.recovered, {"violations": trouble, "ends": dict(ends)})
    return 0
