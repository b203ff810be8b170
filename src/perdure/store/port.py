"""The Store protocol: every durable transition a run can make, and its records.

Lifecycle of a run as the store sees it::

    create_run ──> queued ──claim──> running ──finish──> succeeded | failed
                     ▲  ▲              │  │  │                     canceled | needs_attention
                     │  └──release─────┘  │  └─park──> waiting ──wake/settle_wait/send/
                     │                    │                │      deadline (claim, sweep)──> queued
                     │   lease lapses: another claim       │
                     │   takes it over (generation + 1)    └─request_cancel──> canceled
                     └──resolve (needs_attention, output)

Rules every adapter keeps:

* Each operation is one atomic transaction. Either all of it is stored or none.
* Every write made for a claimed run (``renew``, ``begin_effect``,
  ``finish_step``, ``transaction_step``, ``park``, ``finish``, ``release``,
  ``create_children``) is conditional on the claim's ``generation`` still
  being the run's generation and the run still ``running``. When it matches
  nothing, the operation raises :class:`errors.StaleClaim` (another claim owns
  the run) or :class:`errors.Canceled` (the run's cancel was requested and the
  claim has not acknowledged it with ``canceling=True``) and changes nothing.
  ``finish`` with state ``canceled`` or ``needs_attention`` ignores the cancel
  flag, so a canceled run can always be settled by its owner.
* Time comes from the store's clock: the injected :class:`Clock` if one was
  given, else the store's own (the system clock for an embedded store, the
  database server's clock for a shared one, so that hosts never compare their
  clocks). Deadlines and leases are absolute instants. That clock may step
  (NTP, a resumed VM): a lease is never further ahead than its TTL (``sweep``
  pulls it back), and a claim recovers lapsed runs only while the caller
  trusts the clock (``claim``'s ``recover_until``).
* Payloads, results, errors and inputs are JSON text. The store never parses
  them (except to compute nothing); the engine encodes and validates them.
* Every transition appends provenance receipts to the run's ledger in the same
  transaction: the ones named in each operation's docstring, plus the
  :class:`Mark` values the engine passes. The ledger numbers receipts from 1
  without gaps and keeps only the newest of them: as many as the run's
  ``ledger_limit``, which the store sets from its own bound when it creates the run.
* An adapter refuses rows it cannot read (unknown state, malformed column) with
  :class:`errors.CorruptState`; it never guesses.
* Ending a run (``finish`` in any terminal state but ``needs_attention``, a
  cancel, a failed ``resolve``) removes the run's
  wait, outcome and message records, and if the run has a parent, creates the
  parent's outcome record ``child:<run_id>`` (put-if-absent, payload
  ``{"run_id", "state", "result", "error"}`` as JSON) and wakes the parent if
  it is parked on that child (a registered wait of that name).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, Protocol

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


class Clock(Protocol):
    """A source of aware UTC instants."""

    def now(self) -> datetime: ...


class SystemClock:
    """The machine's clock."""

    def now(self) -> datetime:
        return datetime.now(UTC)


RECOVER_ANY = datetime.max.replace(tzinfo=UTC)
"""The ``recover_until`` that trusts the store's clock whatever it reads."""


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


@dataclass(frozen=True)
class Claimed:
    """A fresh claim with everything needed to replay the run."""

    claim: Claim
    run: Run
    journal: list[JournalEntry]
    outcomes: list[Outcome] = field(default_factory=list)
    recovered: bool = False


@dataclass(frozen=True)
class Census:
    """An app's runs counted by state, and the oldest instant a waiting run is due.

    ``oldest_due`` is the earliest ``ready_at`` at or before ``at`` (the
    store's clock when counted) among the app's waiting runs, or None.
    """

    states: dict[str, int]
    oldest_due: datetime | None
    at: datetime


class Store(Protocol):
    """Durable state of runs. Every method is one atomic transition."""

    url: str
    """The store's URL with any password removed."""

    def migrate(self) -> None:
        """Create or upgrade the schema; safe when several processes race.

        Raises:
            errors.SchemaTooNew: the stored schema is newer than this code.
        """
        ...

    def close(self) -> None:
        """Release connections. Idempotent."""
        ...

    def now(self) -> datetime:
        """Return the store's current time (see the module docstring)."""
        ...

    def wait_ready(self, timeout: float) -> bool:
        """Block until some run may have become ready, or ``timeout`` seconds pass.

        Returns True when woken by a notification (a run created, woken,
        released or settled in this process, or by any process for a shared
        store), False on timeout. Spurious wake-ups are allowed.
        """
        ...

    def notify_ready(self) -> None:
        """Wake every ``wait_ready`` caller of this store now."""
        ...

    # -- runs -------------------------------------------------------------

    def create_run(self, new: NewRun, journal: Sequence[JournalEntry] = ()) -> tuple[Run, bool]:
        """Create a queued run, or return the existing one with the same ``(app, key)``.

        Returns the run and whether this call created it. Concurrent calls
        with one key from any number of processes create exactly one run.
        Appends ``initialized`` when it creates. ``journal`` (a fork's copied
        prefix, positions 1..n) is stored with the run when it is created.
        """
        ...

    def create_children(self, claim: Claim, children: Sequence[NewRun]) -> list[Run]:
        """Create child runs of the claimed run in one transaction (fenced).

        Each child must carry a ``key``; a child whose key already exists is
        returned as stored, so a replayed fan-out creates nothing twice.
        """
        ...

    def get_run(self, run_id: str) -> Run | None:
        """Return the run, or None."""
        ...

    def list_runs(
        self,
        app: str,
        *,
        state: str | None = None,
        workflow: str | None = None,
        limit: int = 100,
        dry_run: bool | None = None,
    ) -> list[Run]:
        """Return the app's runs, newest first (only dry ones, or none, if ``dry_run`` says)."""
        ...

    def child_counts(self, run_id: str) -> dict[str, int]:
        """Return how many children of the run are in each state (from an index)."""
        ...

    def journal(self, run_id: str) -> list[JournalEntry]:
        """Return the run's journal ordered by position."""
        ...

    def history(self, run_id: str) -> list[LedgerEntry]:
        """Return the run's retained ledger, oldest first."""
        ...

    # -- claims -----------------------------------------------------------

    def claim(
        self,
        app: str,
        worker: str,
        workflows: Sequence[tuple[str, str]],
        *,
        lease_ttl: float,
        limit: int = 1,
        recover_until: datetime | None = RECOVER_ANY,
        dry_run: bool = False,
    ) -> list[Claimed]:
        """Claim up to ``limit`` ready runs of ``app`` whose (workflow, version) is listed.

        Only runs whose ``dry_run`` equals ``dry_run`` are candidates: an
        ordinary claim never returns a dry run, and a dry-run claim returns
        nothing else.

        Ready: ``queued`` with ``ready_at`` due or unset; ``waiting`` with
        ``ready_at`` due (a deadline passed); ``running`` whose lease expired
        (its worker is gone: the claim is a recovery, ``failures`` grows by one
        and the receipt is ``recovered``, else ``claimed``). Each claimed run
        becomes ``running`` under ``worker`` with ``generation + 1`` and a lease
        of ``lease_ttl`` seconds, and the run keeps ``lease_ttl`` (see
        ``sweep``). Two concurrent claims never return the same run.

        A lapsed ``running`` run is recovered only if the store's clock, read
        by this claim's own transaction, is at or before ``recover_until``;
        ``None`` recovers nothing (queued and due waiting runs are claimed as
        always). A caller that watches the store's clock against a monotonic
        one passes ``None`` while it distrusts the clock (it stepped forward,
        so live leases look lapsed) and else its predicted store time plus a
        tolerance, so that a step between its reading and this claim makes the
        claim recover nothing. The default, :data:`RECOVER_ANY`, trusts the
        store's clock.
        """
        ...

    def renew(self, claim: Claim, *, lease_ttl: float) -> Claim:
        """Extend the lease to now + ``lease_ttl`` (the run keeps ``lease_ttl``).

        Raises:
            errors.StaleClaim: another claim owns the run.
            errors.Canceled: the run's cancel was requested.
        """
        ...

    def release(
        self, claim: Claim, *, delay: float, failed: bool, marks: Sequence[Mark] = ()
    ) -> None:
        """Give the run back as ``queued``, claimable after ``delay`` seconds.

        ``failed`` counts the attempt as a failure. Appends ``released``.
        Raises StaleClaim or Canceled as every fenced write.
        """
        ...

    # -- journal ----------------------------------------------------------

    def begin_effect(
        self, claim: Claim, entries: Sequence[JournalEntry], marks: Sequence[Mark] = ()
    ) -> None:
        """Record that a ``once`` effect starts (its entry has status ``started``).

        ``entries`` may hold buffered entries before it; all are written. An
        existing entry at a position is replaced only if it has status
        ``started``; any other existing position raises CorruptState.
        """
        ...

    def finish_step(
        self, claim: Claim, entries: Sequence[JournalEntry], marks: Sequence[Mark] = ()
    ) -> None:
        """Record step outcomes (fenced). Resets ``failures`` to 0.

        Same replacement rule as ``begin_effect``.
        """
        ...

    def transaction_step(
        self,
        claim: Claim,
        entries: Sequence[JournalEntry],
        body: Callable[[Any], JournalEntry],
        marks: Sequence[Mark] = (),
    ) -> JournalEntry:
        """Run ``body(connection)`` inside the transaction that records its entry.

        The fence is checked first; ``body`` receives the adapter's own
        database connection and returns the entry to record. If ``body``
        raises, nothing is stored and the exception propagates.
        """
        ...

    def park(
        self,
        claim: Claim,
        entries: Sequence[JournalEntry],
        waits: Sequence[WaitSpec],
        *,
        wake_at: datetime | None,
        marks: Sequence[Mark] = (),
    ) -> bool:
        """Write ``entries``, register ``waits`` and make the run ``waiting``.

        ``ready_at`` becomes the earliest of ``wake_at`` and the waits'
        deadlines. If, inside the same transaction, any wait already has an
        outcome (signal or child), a channel wait already has a message after
        its ``after_sequence``, or ``ready_at`` is already due, the run is not
        parked: the entries are written, the claim stays valid and False is
        returned. Otherwise the lease is dropped, ``parked`` is appended and
        True returned. Adapters check for outcomes and messages after taking
        the run's row lock, so a delivery that commits concurrently either is
        seen here or finds the run ``waiting`` and wakes it.
        """
        ...

    def finish(
        self,
        claim: Claim,
        entries: Sequence[JournalEntry],
        *,
        state: RunState,
        result: str | None = None,
        error: str | None = None,
        marks: Sequence[Mark] = (),
    ) -> None:
        """End the run in a terminal ``state`` (fenced) and drop the lease.

        Appends ``finished`` (or ``canceled`` for state canceled). Runs the
        end-of-run rules of the module docstring.
        """
        ...

    # -- waits, outcomes, channels ----------------------------------------

    def settle_wait(self, run_id: str, name: str, outcome: Outcome) -> tuple[Outcome, bool]:
        """Create the wait's outcome record if none exists (put-if-absent).

        Returns the stored outcome and whether this call created it. A
        ``signaled`` outcome for a registered wait whose deadline has passed
        is stored as ``timed_out`` instead (no payload). When this call
        creates the record and the run is ``waiting``, the run becomes
        ``queued`` (``woken``). Never touches the journal.

        Raises:
            errors.RunNotFound: no such run.
            errors.RunFinished: the run has ended.
        """
        ...

    def outcomes(self, run_id: str) -> list[Outcome]:
        """Return every outcome record of the run."""
        ...

    def waits(self, app: str, run_id: str | None = None) -> list[WaitRecord]:
        """Return the registered waits that have no outcome, oldest first (from an index)."""
        ...

    def wake(self, run_id: str) -> bool:
        """Make a ``waiting`` run ``queued``; False if it was not waiting."""
        ...

    def send(self, message: NewMessage) -> bool:
        """Store a channel message unless ``(run_id, channel, key)`` exists.

        Returns whether it was stored (the first payload wins). Wakes the run
        if it waits on that channel.

        Raises:
            errors.RunNotFound: no such run.
            errors.RunFinished: the run has ended.
        """
        ...

    def next_message(self, run_id: str, channel: str, after_sequence: int) -> Message | None:
        """Return the run's first message on ``channel`` with a greater sequence."""
        ...

    # -- operators --------------------------------------------------------

    def request_cancel(self, run_id: str) -> bool:
        """Cancel the run and every descendant.

        Queued and waiting runs become ``canceled`` at once (receipt
        ``canceled``); running ones get ``cancel_requested`` and a ``canceled``
        outcome (put-if-absent) for each open signal or child wait, and are
        settled by their owner (or by the next claim if the owner is gone).
        Runs in ``needs_attention`` get the same and stay ``needs_attention``:
        a later ``resolve`` with an output ends them ``canceled``. Each newly
        flagged run gets the receipt ``cancel_requested``. The walk reaches
        every descendant, through runs of any state. Returns True if anything
        changed.

        Raises:
            errors.RunNotFound: no such run.
        """
        ...

    def resolve(
        self,
        run_id: str,
        generation: int,
        entry: JournalEntry,
        *,
        state: Literal["queued", "failed"],
        error: str | None,
        note: str,
    ) -> None:
        """Settle the ambiguous entry of a ``needs_attention`` run.

        Replaces the entry at ``entry.position`` (which must have status
        ``started``), then re-queues the run (``queued``, failures 0) or fails
        it with ``error``. Appends ``resolved`` with ``note``. A run whose
        cancel was requested is not re-queued: it ends ``canceled`` (no error;
        receipts ``resolved`` then ``canceled``), with the end-of-run rules.

        Raises:
            errors.NotResolvable: the run is not in ``needs_attention`` at
                ``generation`` or the entry is not ``started``.
        """
        ...

    def sweep(self) -> int:
        """Do the housekeeping a worker does now and then; return how much it changed.

        Settles registered waits whose deadline passed as ``timed_out`` and
        wakes their runs, re-queues waiting runs whose ``ready_at`` passed, and
        deletes wait, outcome and message records whose run no longer exists
        or has ended.

        Pulls the lease of every ``running`` run that is further ahead than
        now + its lease TTL (the store's clock stepped back since the lease
        was granted or renewed) back to now + that TTL, so a run whose worker
        died lapses within one TTL of the next sweep, not when the clock
        catches up. Live owners lose nothing: a renewal sets the same instant.
        The run's generation, ledger and ``updated_at`` are untouched.
        """
        ...

    def census(self, app: str) -> Census:
        """Count the app's runs by state and find its most overdue waiting run.

        One read, for metrics; it writes nothing and takes no lock a claim waits on.
        """
        ...

    # -- overview: read-only views for operators (perdure.store.overview) -----

    def apps(self) -> list[str]:
        """Return the names of the apps that have runs in the store, sorted."""
        ...

    def timers(self, app: str, run_id: str | None = None) -> list[Timer]:
        """Return the app's runs that only time will make claimable, earliest first.

        ``sleep``: a ``waiting`` run with a ``ready_at`` and no registered
        wait (a durable sleep; listed even once due, until it is claimed).
        ``timer``: a ``queued`` run whose ``ready_at`` is still ahead (the
        backoff of a retry or a release's delay). Writes nothing.
        """
        ...
