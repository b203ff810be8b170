"""The port's records: what the store's operations take and return, and the words they use.

A run (:class:`NewRun` to create, :class:`Run` as stored), the right to write
for it (:class:`Claim`, :class:`Claimed`), its journal (:class:`JournalEntry`)
and ledger (:class:`Mark`, :class:`LedgerEntry`), its waits, their outcomes
and its channel messages (:class:`WaitSpec`, :class:`WaitRecord`,
:class:`Outcome`, :class:`NewMessage`, :class:`Message`), and the read-only
views (:class:`Timer`, :class:`Census`); with the states and kinds their
fields take. Every record is a frozen dataclass. :mod:`perdure.store.port`
names each of them too (``port.Run``, ``port.Claim``, ...), which is how the
engine and the adapters refer to them; the operations that take and return
them, and their contracts, are there.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, get_args

from perdure import errors
from perdure.store import planport

RunState = Literal[
    "queued",
    "running",
    "waiting",
    "suspended",
    "succeeded",
    "failed",
    "canceled",
    "needs_attention",
]
RUN_STATES: tuple[RunState, ...] = (
    "queued",
    "running",
    "waiting",
    "suspended",
    "succeeded",
    "failed",
    "canceled",
    "needs_attention",
)
TERMINAL_STATES: frozenset[str] = frozenset({"succeeded", "failed", "canceled", "needs_attention"})

WORKER_ID = re.compile(r"^[\x21-\x7e]{1,128}$")
"""A worker id: 1 to 128 printable ASCII characters, no spaces."""

EntryStatus = Literal["started", "ok", "error"]
"""``started``: a ``once`` effect began and has no recorded outcome yet."""

OutcomeKind = Literal["signaled", "timed_out", "canceled"]
WaitKind = Literal["signal", "channel", "child", "update"]
TimerKind = Literal["sleep", "timer"]
"""``sleep``: a waiting run with no registered wait; ``timer``: a queued run held back."""

LEDGER_KINDS: frozenset[str] = frozenset(
    {
        "initialized",
        "claimed",
        "recovered",
        "step_started",
        "effect_started",
        "step_completed",
        "step_described",
        "step_failed",
        "parked",
        "woken",
        "outcome_applied",
        "cancel_requested",
        "canceled",
        "released",
        "resolved",
        "finished",
        "suspend_requested",
        "suspended",
        "resumed",
        "task_claimed",
        "task_completed",
        "task_failed",
        "task_blocked",
        "task_recovered",
        "continued",
    }
)


@dataclass(frozen=True)
class NewRun:
    """A run to create. ``key`` makes creation idempotent within the app."""

    run_id: str
    app: str
    workflow: str
    version: str
    input: str
    key: str | None = None
    parent_id: str | None = None
    # A child's policy when its parent ends: "cancel", or None (it runs on).
    parent_close: str | None = None
    # The instant by which the run must have ended, else it is canceled
    # (deadline_exceeded); None: no deadline.
    deadline: datetime | None = None
    # The run's queue (None: none), its key and priority there (queueport).
    queue: str | None = None
    queue_key: str | None = None
    priority: int = 0
    # Claimed only by dry-run claims; a child of a dry run is dry whatever this says.
    dry_run: bool = False
    # A plan run: its shape's digest and tasks (perdure.store.planport); None: a workflow run.
    plan: planport.PlanSpec | None = None


@dataclass(frozen=True)
class Run:
    """A run as stored.

    ``generation`` counts claims (0 until first claimed). ``failures`` counts
    consecutive failed attempts (a release with ``failed=True`` or a lapsed
    lease taken over by a claim) and returns to 0 when a step is recorded.
    ``ready_at`` is when a queued run may be claimed (backoff) or when a
    waiting run's earliest deadline falls (``None``: no deadline).
    """

    run_id: str
    app: str
    workflow: str
    version: str
    state: RunState
    input: str
    result: str | None
    error: str | None
    key: str | None
    parent_id: str | None
    generation: int
    failures: int
    worker: str | None
    lease_expires_at: datetime | None
    ready_at: datetime | None
    cancel_requested: bool
    ledger_sequence: int
    created_at: datetime
    updated_at: datetime
    # The number of receipts the run keeps, fixed when it is created, so that
    # a process with another bound neither trims nor reads it by its own.
    ledger_limit: int = 256
    # See perdure.store.controlport: the run's deadline, a suspend asked of a
    # running run, and the state a suspended run returns to on resume.
    deadline: datetime | None = None
    suspend_requested: bool = False
    suspended_from: str | None = None
    # Continue-as-new (perdure.store.chainport): the successor of a run that
    # continued, and the first run of its chain (None outside any chain).
    continued_as: str | None = None
    origin: str | None = None
    # Its queue, key and priority there (see queueport); None: in no queue.
    queue: str | None = None
    queue_key: str | None = None
    priority: int = 0
    # Claimed only by dry-run claims (see ``Store.claim``).
    dry_run: bool = False
    # A plan run's shape digest and scheduling policy (perdure.store.planport).
    plan_digest: str | None = None
    plan_policy: int | None = None


def same_start(found: Run, new: NewRun, read: Callable[[str], Any] = json.loads) -> bool:
    """Whether ``new`` repeats the start of ``found``, the run its key names.

    A key names one start: the same workflow with the same inputs (compared as
    JSON values, so the order of keyword arguments does not matter). The
    version may differ, so that a start repeated across a deploy still returns
    the run it created. ``read`` turns an input's text into the value compared:
    an app with a payload codec opens its sealed inputs, whose stored texts
    differ for equal inputs.
    A dry start never names a real run, nor a real one a dry run.

    Raises:
        errors.CorruptState: the stored inputs are not JSON.
    """
    if found.workflow != new.workflow or found.dry_run != new.dry_run:
        return False
    try:
        stored = read(found.input)
    except ValueError as exc:
        raise errors.CorruptState(found.run_id, "run_input_json", str(exc)) from exc
    return _canonical(stored) == _canonical(read(new.input))


def _canonical(value: Any) -> str:
    # The caller's trace context rides in the input record but is not an input.
    if isinstance(value, dict) and "trace" in value:
        value = {k: v for k, v in value.items() if k != "trace"}
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class Claim:
    """The right to write for one run, as long as ``generation`` is current.

    ``canceling`` is set by the engine once it has seen the run's cancel, so
    that clean-up steps can still be journaled while the run unwinds.
    """

    run_id: str
    worker: str
    generation: int
    lease_expires_at: datetime
    canceling: bool = False


@dataclass(frozen=True)
class JournalEntry:
    """What the run did at one position (1, 2, ...) of its journal.

    ``kind`` is the engine's word for the call (``step``, ``sleep``, ``now``,
    ``random``, ``uuid``, ``wait``, ``receive``, ``child``, ...); ``name`` is
    the step key (``charge``, ``charge#2``) or the wait/channel name.
    ``output`` and ``error`` are JSON text.
    """

    position: int
    kind: str
    name: str
    status: EntryStatus
    output: str | None = None
    error: str | None = None
    attempt: int = 1


@dataclass(frozen=True)
class Mark:
    """A provenance receipt the engine asks to append with a write."""

    kind: str
    step: str | None = None
    digest: str | None = None
    note: str | None = None


@dataclass(frozen=True)
class LedgerEntry:
    """One provenance receipt: no payloads, only a digest of them."""

    run_id: str
    sequence: int
    kind: str
    at: datetime
    generation: int
    worker: str | None
    step: str | None
    digest: str | None
    note: str | None


@dataclass(frozen=True)
class WaitSpec:
    """A wait to register when parking.

    ``after_sequence`` (channel waits only) is the last message sequence the
    run has consumed on that channel.
    """

    name: str
    kind: WaitKind
    deadline: datetime | None = None
    after_sequence: int = 0


@dataclass(frozen=True)
class WaitRecord:
    """A registered wait that has no outcome yet."""

    run_id: str
    app: str
    name: str
    kind: WaitKind
    deadline: datetime | None
    created_at: datetime


@dataclass(frozen=True)
class Timer:
    """A run held until ``due`` by nothing but time (see ``Store.timers``)."""

    run_id: str
    app: str
    kind: TimerKind
    due: datetime
    workflow: str


@dataclass(frozen=True)
class Outcome:
    """The write-once record that settles a wait."""

    run_id: str
    name: str
    outcome: OutcomeKind
    signal_id: str | None
    payload: str | None
    payload_digest: str | None
    at: datetime


@dataclass(frozen=True)
class NewMessage:
    """A channel message to store, deduplicated by ``(run_id, channel, key)``."""

    run_id: str
    channel: str
    key: str
    payload: str


@dataclass(frozen=True)
class Message:
    """A stored channel message; ``sequence`` is its delivery order in the run."""

    run_id: str
    channel: str
    key: str
    sequence: int
    payload: str
    at: datetime


UpdateState = Literal["pending", "answered", "abandoned"]
UPDATE_STATES: frozenset[str] = frozenset(get_args(UpdateState))


@dataclass(frozen=True)
class UpdateRecord:
    """A stored update: the request, and its answer once there is one.

    ``response`` is JSON text while ``answered``; ``settled_at`` is when it was
    answered or abandoned.
    """

    run_id: str
    update_id: str
    name: str
    sequence: int
    payload: str
    state: UpdateState
    response: str | None
    at: datetime
    settled_at: datetime | None


@dataclass(frozen=True)
class Claimed:
    """A fresh claim with everything needed to replay the run."""

    claim: Claim
    run: Run
    journal: list[JournalEntry]
    outcomes: list[Outcome] = field(default_factory=list)
    recovered: bool = False
    # The first update after each (name, after sequence) of KnownJournal.updates,
    # as next_update would have returned it under this claim.
    updates: dict[tuple[str, int], UpdateRecord] = field(default_factory=dict)


@dataclass(frozen=True)
class KnownJournal:
    """The journal a claimer already holds for a run it parked, at the generation it parked.

    A run's journal grows and changes only under a claim of the run, fenced
    by its generation; the one exception, ``resolve``, settles an entry that
    is still ``started``. A run that a claim finds not running (parked, then
    woken or due) at the generation its holder parked it with has had no
    claim since, so only the ``started`` entries of ``journal`` (a parked
    run's waits) can differ from the stored ones: the claim reads those back
    and, if they are as held, returns ``journal`` instead of reading it all.

    ``outcomes`` names the outcomes the holder already has: outcomes never
    change once stored, so a claim of one run by key (``claim_warm``) may
    leave those out of what it returns. ``updates`` are the update waits it
    parked on, each ``(name, after sequence)``: ``claim`` reads the first
    update after each when it proves the journal current (``Claimed.updates``),
    which spares the run that read once it goes on; ``claim_warm`` may.
    """

    generation: int
    journal: Sequence[JournalEntry]
    outcomes: frozenset[str] = frozenset()
    updates: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class Census:
    """An app's runs counted by state, and the oldest instant a waiting run is due.

    ``oldest_due`` is the earliest ``ready_at`` at or before ``at`` (the
    store's clock when counted) among the app's waiting runs, or None.
    """

    states: dict[str, int]
    oldest_due: datetime | None
    at: datetime
