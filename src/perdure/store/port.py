"""The Store protocol: every durable transition a run can make, and its contract.

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

The records the operations take and return are defined in
:mod:`perdure.store.records` and named here too (``port.Run``,
``port.Claim``, ...), as the engine and the adapters refer to them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Literal, Protocol

from perdure.store import records

# The records, under the names the engine and the adapters use.
RunState = records.RunState
RUN_STATES = records.RUN_STATES
TERMINAL_STATES = records.TERMINAL_STATES
WORKER_ID = records.WORKER_ID
EntryStatus = records.EntryStatus
OutcomeKind = records.OutcomeKind
WaitKind = records.WaitKind
TimerKind = records.TimerKind
LEDGER_KINDS = records.LEDGER_KINDS
NewRun = records.NewRun
Run = records.Run
same_start = records.same_start
Claim = records.Claim
JournalEntry = records.JournalEntry
Mark = records.Mark
LedgerEntry = records.LedgerEntry
WaitSpec = records.WaitSpec
WaitRecord = records.WaitRecord
Timer = records.Timer
Outcome = records.Outcome
NewMessage = records.NewMessage
Message = records.Message
Claimed = records.Claimed
KnownJournal = records.KnownJournal
UpdateRecord = records.UpdateRecord
Census = records.Census


class Clock(Protocol):
    """A source of aware UTC instants."""

    def now(self) -> datetime: ...


class SystemClock:
    """The machine's clock."""

    def now(self) -> datetime:
        return datetime.now(UTC)


RECOVER_ANY = datetime.max.replace(tzinfo=UTC)
"""The ``recover_until`` that trusts the store's clock whatever it reads."""


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
        known: Mapping[str, KnownJournal] | None = None,
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

        ``known`` maps run ids to the journals the caller holds for runs it
        parked (:class:`KnownJournal`). A claimed run found not running at the
        generation given there comes back with that journal once its
        ``started`` entries are read back unchanged, not read whole again, and
        may come without the outcomes its ``outcomes`` names (they never
        change); any other run's journal and outcomes are read as always.
        """
        ...

    def renew(self, claim: Claim, *, lease_ttl: float) -> Claim:
        """Extend the lease to now + ``lease_ttl`` (the run keeps ``lease_ttl``).

        Raises:
            errors.StaleClaim: another claim owns the run.
            errors.Canceled: the run's cancel was requested.
        """
        ...

    def next_lapse(self, app: str) -> datetime | None:
        """The earliest lease of the app's running runs still to lapse, or None.

        A lapse is announced by nobody: an idle worker that waits until this
        instant (rather than its next poll) recovers a dead worker's run as
        soon as a claim may. Leases already lapsed are left out.
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
