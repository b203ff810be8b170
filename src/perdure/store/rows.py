"""One row reader and one invariant vocabulary for every store adapter.

Every row an adapter reads becomes a port record here, checked column by
column: a row with an unknown state, a negative counter or a NULL where the
port allows none raises :class:`errors.CorruptState` naming the run and the
invariant, the same name on every adapter (:data:`INVARIANTS`, documented in
``docs/provenance.md``), so a damaged or forged row stops the run instead of
reaching the engine half-understood. Records to write are checked here too.

Adapters differ only in how a column holds an instant or a flag: an
:class:`Encoding` says how (:data:`MICROSECONDS` for integer microseconds
since the epoch and 0/1, :data:`NATIVE` for aware timestamps and booleans),
and a :class:`Reader` built on it reads every record.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol, cast, get_args

from perdure import errors
from perdure.store import liveport, port, queueport, scheduleport

ENTRY_STATUSES: frozenset[str] = frozenset(get_args(port.EntryStatus))
OUTCOME_KINDS: frozenset[str] = frozenset(get_args(port.OutcomeKind))
WAIT_KINDS: frozenset[str] = frozenset(get_args(port.WaitKind))

# The columns of each record, as invariant names spell them (``run_state``, ...).
_COLUMNS = {
    "run": "run_id app workflow version state input result error key parent_id generation "
    "failures worker lease_expires_at ready_at cancel_requested ledger_sequence ledger_limit "
    "created_at updated_at deadline suspend_requested suspended_from continued_as origin "
    "queue queue_key priority plan_digest plan_policy",
    "task": "run_id name position parents effect state generation attempt recoveries "
    "max_recoveries worker lease_expires_at ready_at effect_started output error blocked_by "
    "created_at updated_at started_at ended_at",
    "journal": "position kind name status output error attempt",
    "ledger": "run_id sequence kind at generation worker step digest note",
    "wait": "run_id app name kind deadline created_at",
    "outcome": "run_id name kind signal_id payload payload_digest at",
    "message": "run_id channel key sequence payload at",
    "token": "token_id app scope digest created_at expires_at revoked_at",
    "update": "run_id update_id name sequence payload state response at settled_at",
    "schedule": "app name workflow version cron tz catch_up input tick_arg paused "
    "settled_until last_tick last_run_id created_at updated_at",
    "queue": "app name concurrency per_key rate_limit rate_seconds created_at updated_at "
    "running waiting",
}

INVARIANTS: dict[str, str] = {
    **{
        f"{record}_{column}": f"a {record} row's {column} is not what the schema promises"
        for record, columns in _COLUMNS.items()
        for column in columns.split()
    },
    "run_worker_id": "a run's worker id is not 1-128 printable ASCII characters",
    "run_claim": "a running run has no worker or no lease",
    "journal_position_taken": "a write would replace a journal entry that is not started",
    "outcome_missing": "an outcome record that was refused as a duplicate cannot be read",
    "chain_current": "a chain of runs that continued as new has no current run",
    "chain_links": "the runs of a chain do not form one line of successors",
    "task_claim": "a running task has no worker, lease or claim",
    "task_parents": "a task ran or succeeded while a parent had not succeeded",
    "task_unknown_parent": "a task names a parent the plan run does not have",
    "task_run": "a task belongs to a run that is not a plan run, or runs in a run that ended",
}
"""Every invariant an adapter names when it refuses what it read or would write."""

# The column ``outcome`` of an outcome row is its kind.
_COLUMN_NAMES = {("outcome", "outcome"): "kind"}


def corrupt(run_id: str | None, invariant: str, detail: str) -> errors.CorruptState:
    """Return the error for a breach of ``invariant`` (one of :data:`INVARIANTS`)."""
    if invariant not in INVARIANTS:
        raise AssertionError(f"{invariant!r} is not in the invariant vocabulary")
    return errors.CorruptState(run_id, invariant, detail)


# -- how adapters hold instants and flags ----------------------------------------

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def to_us(when: datetime) -> int:
    """Return ``when`` as integer microseconds since the epoch.

    Raises:
        errors.InvalidInput: ``when`` is naive, so its instant is unknown.
    """
    if when.tzinfo is None or when.utcoffset() is None:
        raise errors.InvalidInput(f"instant {when.isoformat()} has no time zone")
    return (when - EPOCH) // _MICROSECOND


def opt_us(when: datetime | None) -> int | None:
    """Return :func:`to_us` of ``when``, or None."""
    return None if when is None else to_us(when)


def from_us(value: int) -> datetime:
    """Return the aware UTC instant of ``value`` microseconds since the epoch."""
    return EPOCH + timedelta(microseconds=value)


def _micros_instant(value: object) -> datetime | None:
    if type(value) is not int:
        return None
    try:
        return from_us(value)
    except OverflowError:
        return None


def _native_instant(value: object) -> datetime | None:
    if not isinstance(value, datetime) or value.tzinfo is None:
        return None
    return value.astimezone(UTC)


def _int_flag(value: object) -> bool | None:
    return value == 1 if type(value) is int and value in (0, 1) else None


def _native_flag(value: object) -> bool | None:
    return value if isinstance(value, bool) else None


@dataclass(frozen=True)
class Encoding:
    """How an adapter's columns hold instants and flags; a decoder returns None for garbage."""

    instant: Callable[[object], datetime | None]
    instant_shape: str
    flag: Callable[[object], bool | None]
    flag_shape: str


MICROSECONDS = Encoding(_micros_instant, "integer microseconds in range", _int_flag, "0 or 1")
NATIVE = Encoding(_native_instant, "an aware timestamp", _native_flag, "a boolean")


class Row(Protocol):
    """A row by column name: a ``sqlite3.Row`` or a dict."""

    def __getitem__(self, column: str, /) -> Any: ...


def _value(row: Row, column: str) -> Any:
    try:
        return row[column]
    except (KeyError, IndexError):
        return None


class _Columns:
    """Typed, checked access to one row's columns on behalf of one run."""

    def __init__(self, encoding: Encoding, record: str, row: Row) -> None:
        self._encoding = encoding
        self._record = record
        self._row = row
        # Every table keeps run_id; an unreadable one is reported, not trusted.
        found = _value(row, "run_id")
        self.run_id = found if isinstance(found, str) else None

    def _bad(self, column: str, expected: str) -> errors.CorruptState:
        name = _COLUMN_NAMES.get((self._record, column), column)
        found = _value(self._row, column)
        return corrupt(
            self.run_id, f"{self._record}_{name}", f"expected {expected}, found {found!r}"
        )

    # text, opt_text and count read the row themselves (as _value does): a run's
    # row is read at every claim, a column at a time.
    def text(self, column: str) -> str:
        try:
            value = self._row[column]
        except (KeyError, IndexError):
            value = None
        if not isinstance(value, str):
            raise self._bad(column, "text")
        return value

    def opt_text(self, column: str) -> str | None:
        try:
            value = self._row[column]
        except (KeyError, IndexError):
            return None
        if value.__class__ is str or value is None:
            return value
        return self.text(column)

    def count(self, column: str, minimum: int = 0) -> int:
        try:
            value = self._row[column]
        except (KeyError, IndexError):
            value = None
        if type(value) is not int or value < minimum:
            raise self._bad(column, f"an integer >= {minimum}")
        return value

    def flag(self, column: str) -> bool:
        value = self._encoding.flag(_value(self._row, column))
        if value is None:
            raise self._bad(column, self._encoding.flag_shape)
        return value

    def instant(self, column: str) -> datetime:
        value = self._encoding.instant(_value(self._row, column))
        if value is None:
            raise self._bad(column, self._encoding.instant_shape)
        return value

    def opt_instant(self, column: str) -> datetime | None:
        return None if _value(self._row, column) is None else self.instant(column)

    def choice(self, column: str, allowed: Collection[str]) -> str:
        value = _value(self._row, column)
        if value not in allowed:
            raise self._bad(column, "one of " + ", ".join(sorted(allowed)))
        return cast(str, value)


class Reader:
    """Reads one adapter's rows into the port's records, refusing what breaks an invariant."""

    def __init__(self, encoding: Encoding) -> None:
        """Read instants and flags as ``encoding`` holds them."""
        self._encoding = encoding

    def _columns(self, record: str, row: Row) -> _Columns:
        return _Columns(self._encoding, record, row)

    def columns(self, record: str, row: Row) -> _Columns:
        """Return checked access to the columns of a ``record`` row."""
        return _Columns(self._encoding, record, row)

    def instant(self, row: Row, column: str, record: str = "run") -> datetime:
        """Return ``row[column]`` as an aware UTC instant."""
        return self._columns(record, row).instant(column)

    def claim_prior(self, row: Row) -> port.RunState:
        """Check the columns of a claim candidate that the claim overwrites; return its state.

        The claim's own row is read whole after it; what it overwrote would go
        unread, so it is judged here, as :meth:`run` judges it.
        """
        c = self._columns("run", row)
        state, _, _ = _ownership(c, c.text("run_id"))
        c.count("generation")
        c.count("failures")
        c.count("ledger_sequence")
        c.opt_instant("ready_at")
        c.instant("updated_at")
        return state

    def run(self, row: Row) -> port.Run:
        """Return the :class:`port.Run` of a ``runs`` row."""
        c = self._columns("run", row)
        run_id = c.text("run_id")
        state, worker, lease = _ownership(c, run_id)
        plan_digest = c.opt_text("plan_digest")
        return port.Run(
            run_id=run_id,
            app=c.text("app"),
            workflow=c.text("workflow"),
            version=c.text("version"),
            state=state,
            input=c.text("input"),
            result=c.opt_text("result"),
            error=c.opt_text("error"),
            key=c.opt_text("key"),
            parent_id=c.opt_text("parent_id"),
            generation=c.count("generation"),
            failures=c.count("failures"),
            worker=worker,
            lease_expires_at=lease,
            ready_at=c.opt_instant("ready_at"),
            cancel_requested=c.flag("cancel_requested"),
            ledger_sequence=c.count("ledger_sequence"),
            ledger_limit=c.count("ledger_limit"),
            created_at=c.instant("created_at"),
            updated_at=c.instant("updated_at"),
            deadline=c.opt_instant("deadline"),
            # NOT NULL in both schemas; a row read before 0011 has no such column.
            suspend_requested=(
                False if _value(row, "suspend_requested") is None else c.flag("suspend_requested")
            ),
            suspended_from=(
                None
                if _value(row, "suspended_from") is None
                else c.choice("suspended_from", ("queued", "waiting"))
            ),
            continued_as=c.opt_text("continued_as"),
            origin=c.opt_text("origin"),
            queue=c.opt_text("queue"),
            queue_key=c.opt_text("queue_key"),
            priority=0
            if _value(row, "priority") is None
            else c.count("priority", queueport.PRIORITY_MIN),
            dry_run=c.flag("dry_run"),
            plan_digest=plan_digest,
            plan_policy=None if _value(row, "plan_policy") is None else c.count("plan_policy"),
        )

    def entry(self, row: Row) -> port.JournalEntry:
        """Return the :class:`port.JournalEntry` of a ``journal`` row."""
        c = self._columns("journal", row)
        return port.JournalEntry(
            position=c.count("position", 1),
            kind=c.text("kind"),
            name=c.text("name"),
            status=cast(port.EntryStatus, c.choice("status", ENTRY_STATUSES)),
            output=c.opt_text("output"),
            error=c.opt_text("error"),
            attempt=c.count("attempt", 1),
        )

    def receipt(self, row: Row) -> port.LedgerEntry:
        """Return the :class:`port.LedgerEntry` of a ``ledger`` row."""
        c = self._columns("ledger", row)
        return port.LedgerEntry(
            run_id=c.text("run_id"),
            sequence=c.count("sequence", 1),
            kind=c.choice("kind", port.LEDGER_KINDS),
            at=c.instant("at"),
            generation=c.count("generation"),
            worker=c.opt_text("worker"),
            step=c.opt_text("step"),
            digest=c.opt_text("digest"),
            note=c.opt_text("note"),
        )

    def wait(self, row: Row) -> port.WaitRecord:
        """Return the :class:`port.WaitRecord` of a ``waits`` row."""
        c = self._columns("wait", row)
        return port.WaitRecord(
            run_id=c.text("run_id"),
            app=c.text("app"),
            name=c.text("name"),
            kind=cast(port.WaitKind, c.choice("kind", WAIT_KINDS)),
            deadline=c.opt_instant("deadline"),
            created_at=c.instant("created_at"),
        )

    def outcome(self, row: Row) -> port.Outcome:
        """Return the :class:`port.Outcome` of an ``outcomes`` row."""
        c = self._columns("outcome", row)
        return port.Outcome(
            run_id=c.text("run_id"),
            name=c.text("name"),
            outcome=cast(port.OutcomeKind, c.choice("outcome", OUTCOME_KINDS)),
            signal_id=c.opt_text("signal_id"),
            payload=c.opt_text("payload"),
            payload_digest=c.opt_text("payload_digest"),
            at=c.instant("at"),
        )

    def message(self, row: Row) -> port.Message:
        """Return the :class:`port.Message` of a ``messages`` row."""
        c = self._columns("message", row)
        return port.Message(
            run_id=c.text("run_id"),
            channel=c.text("channel"),
            key=c.text("key"),
            sequence=c.count("sequence", 1),
            payload=c.text("payload"),
            at=c.instant("at"),
        )

    def update(self, row: Row) -> liveport.UpdateRecord:
        """Return the :class:`liveport.UpdateRecord` of an ``updates`` row."""
        c = self._columns("update", row)
        state = cast(liveport.UpdateState, c.choice("state", liveport.UPDATE_STATES))
        response = c.opt_text("response")
        if state == "answered" and response is None:
            raise corrupt(c.run_id, "update_response", "an answered update has no response")
        return liveport.UpdateRecord(
            run_id=c.text("run_id"),
            update_id=c.text("update_id"),
            name=c.text("name"),
            sequence=c.count("sequence", 1),
            payload=c.text("payload"),
            state=state,
            response=response,
            at=c.instant("at"),
            settled_at=c.opt_instant("settled_at"),
        )

    def queue(self, row: Row) -> queueport.QueueRecord:
        """Return the :class:`queueport.QueueRecord` of a ``queues`` row (counts if selected)."""
        c = self._columns("queue", row)
        rate = _value(row, "rate_seconds")
        if rate is not None and (not isinstance(rate, int | float) or rate <= 0):
            raise c._bad("rate_seconds", "a positive number of seconds")
        return queueport.QueueRecord(
            app=c.text("app"),
            name=c.text("name"),
            concurrency=None if _value(row, "concurrency") is None else c.count("concurrency", 1),
            per_key=None if _value(row, "per_key") is None else c.count("per_key", 1),
            rate_limit=None if _value(row, "rate_limit") is None else c.count("rate_limit", 1),
            rate_seconds=None if rate is None else float(rate),
            created_at=c.instant("created_at"),
            updated_at=c.instant("updated_at"),
            running=0 if _value(row, "running") is None else c.count("running"),
            waiting=0 if _value(row, "waiting") is None else c.count("waiting"),
        )

    def schedule(self, row: Row) -> scheduleport.ScheduleRecord:
        """Return the :class:`scheduleport.ScheduleRecord` of a ``schedules`` row."""
        c = self._columns("schedule", row)
        catch_up = cast(scheduleport.CatchUp, c.choice("catch_up", scheduleport.CATCH_UPS))
        return scheduleport.ScheduleRecord(
            app=c.text("app"),
            name=c.text("name"),
            workflow=c.text("workflow"),
            version=c.text("version"),
            cron=c.text("cron"),
            tz=c.text("tz"),
            catch_up=catch_up,
            input=c.text("input"),
            tick_arg=c.flag("tick_arg"),
            paused=c.flag("paused"),
            settled_until=c.instant("settled_until"),
            last_tick=c.opt_instant("last_tick"),
            last_run_id=c.opt_text("last_run_id"),
            created_at=c.instant("created_at"),
            updated_at=c.instant("updated_at"),
        )


# -- records to write ----------------------------------------------------------------


def check_outcome_kind(kind: str) -> None:
    """Refuse an outcome kind the store could not read back.

    Raises:
        errors.InvalidInput: ``kind`` is not an :data:`port.OutcomeKind`.
    """
    if kind not in OUTCOME_KINDS:
        raise errors.InvalidInput(f"unknown outcome {kind!r}")


def check_wait_kinds(waits: Sequence[port.WaitSpec], run_id: str) -> None:
    """Refuse waits the store could not read back, or one registered twice.

    Raises:
        errors.InvalidInput: an unknown :data:`port.WaitKind`, or a name given twice.
    """
    for spec in waits:
        if spec.kind not in WAIT_KINDS:
            raise errors.InvalidInput(f"unknown wait kind {spec.kind!r}")
    if len({spec.name for spec in waits}) != len(waits):
        raise errors.InvalidInput(f"run {run_id} registers a wait twice")


def _ownership(c: _Columns, run_id: str) -> tuple[port.RunState, str | None, datetime | None]:
    """Read a run's state, worker and lease, and check that they agree."""
    state = cast(port.RunState, c.choice("state", port.RUN_STATES))
    worker = c.opt_text("worker")
    if worker is not None and not port.WORKER_ID.match(worker):
        raise corrupt(run_id, "run_worker_id", f"worker id {worker[:40]!r}")
    lease = c.opt_instant("lease_expires_at")
    # A plan run has no owner of its own: its tasks hold the leases.
    if state == "running" and c.opt_text("plan_digest") is None and None in (worker, lease):
        raise corrupt(run_id, "run_claim", "a running run has no worker or lease")
    return state, worker, lease


def checked_entries(run_id: str, entries: Sequence[port.JournalEntry]) -> list[port.JournalEntry]:
    """Check entries to write; a position given twice follows the replacement rule, in order.

    Raises:
        errors.InvalidInput: a position below 1, an unknown status or an attempt below 1.
        errors.CorruptState: ``journal_position_taken``, a recorded entry written twice.
    """
    by_position: dict[int, port.JournalEntry] = {}
    for entry in entries:
        if entry.position < 1 or entry.attempt < 1 or entry.status not in ENTRY_STATUSES:
            raise errors.InvalidInput(f"run {run_id}: malformed journal entry {entry!r}")
        earlier = by_position.get(entry.position)
        if earlier is not None and earlier.status != "started":
            raise corrupt(
                run_id, "journal_position_taken", f"position {entry.position} is written twice"
            )
        by_position[entry.position] = entry
    return list(by_position.values())


def check_children(run_id: str, children: Sequence[port.NewRun]) -> None:
    """Refuse children that a replayed fan-out could not find again, or of another parent.

    Raises:
        errors.InvalidInput: a child without a key, or naming another parent.
    """
    for child in children:
        if child.key is None:
            raise errors.InvalidInput(f"child run {child.run_id} needs a key")
        if child.parent_id not in (None, run_id):
            raise errors.InvalidInput(
                f"child run {child.run_id} names parent {child.parent_id}, "
                f"not the claimed run {run_id}"
            )


def check_resolvable(run: port.Run, generation: int) -> None:
    """Refuse to resolve a run that is not in ``needs_attention`` at ``generation``.

    Raises:
        errors.NotResolvable: the run moved on, or never needed attention.
    """
    if run.state != "needs_attention" or run.generation != generation:
        raise errors.NotResolvable(
            f"run {run.run_id} is {run.state} at generation {run.generation}, "
            f"not needs_attention at generation {generation}"
        )


def check_resolvable_entry(
    run_id: str, entry: port.JournalEntry, stored: port.JournalEntry | None
) -> None:
    """Refuse to resolve unless ``stored`` is the ``started`` entry ``entry`` names.

    Raises:
        errors.NotResolvable: no entry there, a settled one, or one of another name.
    """
    if stored is None or stored.status != "started" or stored.name != entry.name:
        raise errors.NotResolvable(
            f"run {run_id} has no started entry {entry.name!r} at position {entry.position}"
        )


def ready_at(waits: Sequence[port.WaitSpec], wake_at: datetime | None) -> datetime | None:
    """Return when a parked run becomes claimable: the earliest deadline or ``wake_at``.

    Raises:
        errors.InvalidInput: an instant is naive.
    """
    instants = [w.deadline for w in waits if w.deadline is not None]
    instants += [wake_at] if wake_at is not None else []
    if any(i.tzinfo is None or i.utcoffset() is None for i in instants):
        raise errors.InvalidInput("deadlines and wake_at must be aware datetimes")
    return min(instants) if instants else None


def child_payload(run_id: str, state: str, result: str | None, error: str | None) -> str:
    """Return the payload of the parent's ``child:<run_id>`` outcome.

    ``result`` and ``error`` are the JSON texts stored with the ended run.

    Raises:
        errors.InvalidPayload: a stored result or error is not JSON.
    """

    def parsed(what: str, text: str | None) -> Any:
        if text is None:
            return None
        try:
            return json.loads(text)
        except ValueError:
            raise errors.InvalidPayload(f"the {what} of run {run_id} is not JSON") from None

    return json.dumps(
        {
            "run_id": run_id,
            "state": state,
            "result": parsed("result", result),
            "error": parsed("error", error),
        }
    )
