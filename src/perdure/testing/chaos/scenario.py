"""What a crash-point scenario is made of: an app, a drive, invariant checks.

A :class:`Scenario` names an app, a *drive* (the client side: it starts runs,
lets them execute and sends signals) and, optionally, checks of its own on top
of the explorer's (docs/testing.md, "Crash-point exploration")::

    from perdure.testing import chaos

    @app.step(effect="once")
    def charge(order: str) -> str:
        chaos.effect("charge", once=True)       # one line in the trial's side log
        return gateway.charge(order)

    def drive(d: chaos.Drive) -> None:
        run = d.start(checkout, "o-1", key="o-1")
        d.run_until_idle()                       # the run parks on its wait
        d.signal(run.run_id, "approval", True, signal_id="approval-1")
        d.run_until_idle()

    scenario = chaos.Scenario("checkout", app, drive)

The drive runs in the process that is crashed, then again from the top in the
process that recovers, as a client that retries after a crash would: so it
starts runs with a ``key`` and sends signals with a ``signal_id``, and every
call is safe to repeat.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from perdure import app as app_api
from perdure import client as client_api
from perdure import codec, errors, execution, records, steps
from perdure.store import port
from perdure.testing import environment

EVENTS_ENV = "PERDURE_CHAOS_EVENTS"
PHASE_ENV = "PERDURE_CHAOS_PHASE"
LEASE_TTL = 600.0
"""Seconds of the trial's fake clock a claim holds its run (the recovery starts a day later)."""


@dataclass(frozen=True)
class Event:
    """One line of a trial's side log, written outside perdure as things happen.

    ``kind`` is ``effect`` (a step body did its effect, via :func:`effect`),
    ``recorded`` (a step's outcome committed in the journal: ``key`` is
    ``<run_id>/<step key>``) or ``signal`` (the drive holds a receipt for the
    signal ``key``, which settled a wait of run ``label``). ``phase`` is
    ``count``, ``crash`` or ``recover``.
    """

    phase: str
    kind: str
    key: str
    once: bool = False
    label: str = ""


def effect(label: str = "", *, once: bool = False, key: str | None = None) -> None:
    """Record that a step body did its effect, in the side log of the running trial.

    Call it inside a step, where the effect happens; ``once=True`` in a
    ``once`` step (the explorer then fails the trial if it runs twice).
    ``key`` defaults to the step's idempotency key (``<run_id>/<step key>``).
    Outside the explorer it does nothing, so the app runs unchanged elsewhere.
    """
    path = os.environ.get(EVENTS_ENV)
    if not path:
        return
    append(path, Event("", "effect", key or steps.idempotency_key(), once, label))


def append(path: str, event: Event) -> None:
    """Append one event as a JSON line with one ``write`` (O_APPEND: never torn, never lost)."""
    line = json.dumps(
        {
            "phase": event.phase or os.environ.get(PHASE_ENV, ""),
            "kind": event.kind,
            "key": event.key,
            "once": event.once,
            "label": event.label,
        }
    )
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def read_events(path: str) -> list[Event]:
    """Return the side log's events in the order they happened."""
    try:
        with open(path, encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except FileNotFoundError:
        return []
    return [Event(**json.loads(line)) for line in lines if line.strip()]


@dataclass(frozen=True)
class TrialView:
    """What a scenario's check sees once the recovery is over.

    ``at_crash`` holds each run's journal as the crashed process left it,
    ``journals`` and ``runs`` the state after the recovery, ``events`` the
    side log of every phase.
    """

    scenario: str
    site: str
    runs: list[port.Run]
    journals: dict[str, list[port.JournalEntry]]
    at_crash: dict[str, list[port.JournalEntry]]
    events: list[Event]

    def effects(self, label: str | None = None) -> list[Event]:
        """Return the effect events, of one label if given."""
        return [
            e for e in self.events if e.kind == "effect" and (label is None or e.label == label)
        ]

    def roots(self) -> list[port.Run]:
        """Return the runs the drive started (those without a parent)."""
        return [r for r in self.runs if r.parent_id is None]

    def result(self, run: port.Run) -> Any:
        """Return the run's decoded result (None if it has none)."""
        return codec.decode(run.result) if run.result is not None else None

    def error(self, run: port.Run) -> dict[str, Any]:
        """Return the run's decoded error (empty if it has none)."""
        decoded = codec.decode(run.error) if run.error is not None else {}
        return decoded if isinstance(decoded, dict) else {"message": str(decoded)}


Check = Callable[[TrialView], Iterable[str]]


@dataclass(frozen=True)
class Scenario:
    """A workload to crash at every store write: an app, its drive, its checks.

    Args:
        name: the scenario's name in the report.
        app: the app whose workflows and steps the drive uses; each trial
            points it at a fresh store of its own.
        drive: called with a :class:`Drive` in the process that is crashed and
            again in the process that recovers; every call must be safe to
            repeat (starts with a ``key``, signals with a ``signal_id``).
        check: returns what is wrong with a trial's end state (one sentence
            per violation), on top of the explorer's own invariants.
        max_executions: how many executions one ``run_until_idle`` may take
            before the runs count as never resting.
    """

    name: str
    app: app_api.App
    drive: Callable[[Drive], None]
    check: Check | None = None
    description: str = ""
    max_executions: int = 200


class Drive:
    """The client side of a trial, handed to a scenario's drive.

    Runs execute in the calling process, one execution at a time, through the
    same claim and :class:`~perdure.execution.Execution` a worker uses (no
    heartbeat thread: the store writes come in the same order in every trial).
    """

    def __init__(self, app: app_api.App, store: port.Store, *, phase: str, events: str, bound: int):
        self.app = app
        self.store = store
        self.phase = phase
        self._events = events
        self._bound = bound
        self._host = environment._Host(environment.Environment(app), store)
        self._worker = f"chaos-{phase}-{os.getpid()}"

    def start(
        self, workflow: Any, /, *args: Any, key: str, **kwargs: Any
    ) -> client_api.RunHandle[Any]:
        """Start a run (``app.start``) under ``key``; a repeat returns the same run."""
        return self.app.start(workflow, *args, key=key, **kwargs)

    def signal(
        self, run_id: str, name: str, payload: Any = None, *, signal_id: str
    ) -> records.Receipt | None:
        """Signal the run; return the receipt, or None if the run has ended.

        A signal whose wait was settled by another signal returns that
        signal's receipt. The signal counts as delivered (the explorer then
        expects it applied exactly once) when the receipt names ``signal_id``.
        """
        try:
            receipt = self.app.signal(run_id, name, payload, signal_id=signal_id)
        except errors.WaitSettled as exc:
            receipt = exc.receipt
        except errors.RunFinished:
            return None
        if receipt.signal_id == signal_id and receipt.outcome == "signaled":
            append(self._events, Event(self.phase, "signal", signal_id, label=run_id))
        return receipt

    def run_until_idle(self) -> int:
        """Execute runs until none can be claimed now; return how many executions ran.

        Raises:
            environment.Busy: more than the scenario's ``max_executions``.
        """
        ran = 0
        while True:
            claimed = self.store.claim(
                self.app.name,
                self._worker,
                self.app.workflow_versions(),
                lease_ttl=LEASE_TTL,
                limit=1,
            )
            if not claimed:
                return ran
            # As a worker does: a stale claim means another claim owns the run.
            with contextlib.suppress(errors.StaleClaim):
                execution.Execution(self._host, claimed[0]).run()
            ran += 1
            if ran >= self._bound:
                raise environment.Busy(f"still claiming runs after {ran} executions")
