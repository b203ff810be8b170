"""Strict conversion between the embedded store's rows and the port's records.

Instants are stored as integer microseconds since the Unix epoch. Every row is
checked column by column; anything that is not exactly what the schema
promises raises :class:`errors.CorruptState` naming the table and column, so a
damaged or forged row stops the run instead of being guessed at.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Collection
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from perdure import errors
from perdure.store import port

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)

_ENTRY_STATUSES = ("started", "ok", "error")
_OUTCOME_KINDS = ("signaled", "timed_out", "canceled")
_WAIT_KINDS = ("signal", "channel", "child")


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


class _Columns:
    """Typed, checked access to one row's columns."""

    def __init__(self, table: str, row: sqlite3.Row) -> None:
        self._table = table
        self._row = row
        # Every table keeps run_id; an unreadable one is reported, not trusted.
        found = row["run_id"]
        self.run_id = found if isinstance(found, str) else None

    def _bad(self, column: str, expected: str, value: Any) -> errors.CorruptState:
        return errors.CorruptState(
            self.run_id, f"{self._table}.{column}", f"expected {expected}, found {value!r}"
        )

    def text(self, column: str) -> str:
        value = self._row[column]
        if not isinstance(value, str):
            raise self._bad(column, "text", value)
        return value

    def opt_text(self, column: str) -> str | None:
        value = self._row[column]
        if value is not None and not isinstance(value, str):
            raise self._bad(column, "text or NULL", value)
        return value

    def integer(self, column: str, minimum: int = 0) -> int:
        value = self._row[column]
        if type(value) is not int or value < minimum:
            raise self._bad(column, f"an integer >= {minimum}", value)
        return value

    def flag(self, column: str) -> bool:
        value = self._row[column]
        if type(value) is not int or value not in (0, 1):
            raise self._bad(column, "0 or 1", value)
        return value == 1

    def time(self, column: str) -> datetime:
        value = self._row[column]
        if type(value) is not int:
            raise self._bad(column, "integer microseconds", value)
        try:
            return from_us(value)
        except OverflowError:
            raise self._bad(column, "an instant in range", value) from None

    def opt_time(self, column: str) -> datetime | None:
        return None if self._row[column] is None else self.time(column)

    def choice(self, column: str, allowed: Collection[str]) -> str:
        value = self._row[column]
        if value not in allowed:
            raise self._bad(column, "one of " + ", ".join(sorted(allowed)), value)
        return cast(str, value)


def run(row: sqlite3.Row) -> port.Run:
    """Return the :class:`port.Run` of a ``runs`` row."""
    c = _Columns("runs", row)
    worker = c.opt_text("worker")
    if worker is not None and not port.WORKER_ID.match(worker):
        raise errors.CorruptState(row["run_id"], "run_worker_id", f"worker id {worker[:40]!r}")
    return port.Run(
        run_id=c.text("run_id"),
        app=c.text("app"),
        workflow=c.text("workflow"),
        version=c.text("version"),
        state=cast(port.RunState, c.choice("state", port.RUN_STATES)),
        input=c.text("input"),
        result=c.opt_text("result"),
        error=c.opt_text("error"),
        key=c.opt_text("key"),
        parent_id=c.opt_text("parent_id"),
        generation=c.integer("generation"),
        failures=c.integer("failures"),
        worker=worker,
        lease_expires_at=c.opt_time("lease_expires_at"),
        ready_at=c.opt_time("ready_at"),
        cancel_requested=c.flag("cancel_requested"),
        ledger_sequence=c.integer("ledger_sequence"),
        created_at=c.time("created_at"),
        updated_at=c.time("updated_at"),
    )


def entry(row: sqlite3.Row) -> port.JournalEntry:
    """Return the :class:`port.JournalEntry` of a ``journal`` row."""
    c = _Columns("journal", row)
    return port.JournalEntry(
        position=c.integer("position", 1),
        kind=c.text("kind"),
        name=c.text("name"),
        status=cast(port.EntryStatus, c.choice("status", _ENTRY_STATUSES)),
        output=c.opt_text("output"),
        error=c.opt_text("error"),
        attempt=c.integer("attempt", 1),
    )


def receipt(row: sqlite3.Row) -> port.LedgerEntry:
    """Return the :class:`port.LedgerEntry` of a ``ledger`` row."""
    c = _Columns("ledger", row)
    return port.LedgerEntry(
        run_id=c.text("run_id"),
        sequence=c.integer("sequence", 1),
        kind=c.choice("kind", port.LEDGER_KINDS),
        at=c.time("at"),
        generation=c.integer("generation"),
        worker=c.opt_text("worker"),
        step=c.opt_text("step"),
        digest=c.opt_text("digest"),
        note=c.opt_text("note"),
    )


def wait(row: sqlite3.Row) -> port.WaitRecord:
    """Return the :class:`port.WaitRecord` of a ``waits`` row."""
    c = _Columns("waits", row)
    return port.WaitRecord(
        run_id=c.text("run_id"),
        app=c.text("app"),
        name=c.text("name"),
        kind=cast(port.WaitKind, c.choice("kind", _WAIT_KINDS)),
        deadline=c.opt_time("deadline"),
        created_at=c.time("created_at"),
    )


def outcome(row: sqlite3.Row) -> port.Outcome:
    """Return the :class:`port.Outcome` of an ``outcomes`` row."""
    c = _Columns("outcomes", row)
    return port.Outcome(
        run_id=c.text("run_id"),
        name=c.text("name"),
        outcome=cast(port.OutcomeKind, c.choice("outcome", _OUTCOME_KINDS)),
        signal_id=c.opt_text("signal_id"),
        payload=c.opt_text("payload"),
        payload_digest=c.opt_text("payload_digest"),
        at=c.time("at"),
    )


def message(row: sqlite3.Row) -> port.Message:
    """Return the :class:`port.Message` of a ``messages`` row."""
    c = _Columns("messages", row)
    return port.Message(
        run_id=c.text("run_id"),
        channel=c.text("channel"),
        key=c.text("key"),
        sequence=c.integer("sequence", 1),
        payload=c.text("payload"),
        at=c.time("at"),
    )


def check_outcome_kind(kind: str) -> None:
    """Refuse an outcome kind the store could not read back.

    Raises:
        errors.InvalidInput: ``kind`` is not an :data:`port.OutcomeKind`.
    """
    if kind not in _OUTCOME_KINDS:
        raise errors.InvalidInput(f"unknown outcome {kind!r}")


def check_wait_kind(kind: str) -> None:
    """Refuse a wait kind the store could not read back.

    Raises:
        errors.InvalidInput: ``kind`` is not a :data:`port.WaitKind`.
    """
    if kind not in _WAIT_KINDS:
        raise errors.InvalidInput(f"unknown wait kind {kind!r}")


def check_entry(item: port.JournalEntry) -> None:
    """Refuse a journal entry the store could not read back.

    Raises:
        errors.InvalidInput: a position below 1, an unknown status or attempt below 1.
    """
    if item.position < 1 or item.attempt < 1 or item.status not in _ENTRY_STATUSES:
        raise errors.InvalidInput(f"malformed journal entry {item!r}")


def check_mark(mark: port.Mark) -> None:
    """Refuse a receipt kind the store could not read back.

    Raises:
        errors.InvalidInput: ``mark.kind`` is not one of :data:`port.LEDGER_KINDS`.
    """
    if mark.kind not in port.LEDGER_KINDS:
        raise errors.InvalidInput(f"unknown ledger receipt kind {mark.kind!r}")
