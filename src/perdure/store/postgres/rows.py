"""Records to rows and back for the PostgreSQL store.

Every row :mod:`perdure.store.postgres.store` reads becomes a record here, so a row
with an unknown state, a negative counter or a NULL where the port allows none
raises :class:`errors.CorruptState` naming the run and the invariant instead of
reaching the engine half-understood. Records to write are checked here too and
spread into the parallel arrays the queries ``unnest``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

from perdure import errors
from perdure.store import port

Row = dict[str, Any]

_ENTRY_STATUSES = frozenset({"started", "ok", "error"})
_OUTCOME_KINDS = frozenset({"signaled", "timed_out", "canceled"})
_WAIT_KINDS = frozenset({"signal", "channel", "child"})


class _Reader:
    """Typed access to one row's columns on behalf of one run."""

    def __init__(self, row: Row, run_id: str | None, table: str) -> None:
        self.row = row
        self.run_id = run_id
        self.table = table

    def _bad(self, column: str, wanted: str) -> errors.CorruptState:
        value = self.row.get(column)
        return errors.CorruptState(
            self.run_id, f"{self.table}_{column}", f"expected {wanted}, found {value!r}"
        )

    def text(self, column: str) -> str:
        value = self.row.get(column)
        if not isinstance(value, str):
            raise self._bad(column, "text")
        return value

    def opt_text(self, column: str) -> str | None:
        return None if self.row.get(column) is None else self.text(column)

    def count(self, column: str, minimum: int = 0) -> int:
        value = self.row.get(column)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self._bad(column, f"an integer >= {minimum}")
        return value

    def flag(self, column: str) -> bool:
        value = self.row.get(column)
        if not isinstance(value, bool):
            raise self._bad(column, "a boolean")
        return value

    def instant(self, column: str) -> datetime:
        value = self.row.get(column)
        if not isinstance(value, datetime) or value.tzinfo is None:
            raise self._bad(column, "an aware timestamp")
        return value.astimezone(UTC)

    def opt_instant(self, column: str) -> datetime | None:
        return None if self.row.get(column) is None else self.instant(column)

    def choice(self, column: str, allowed: frozenset[str] | tuple[str, ...]) -> str:
        value = self.row.get(column)
        if value not in allowed:
            raise self._bad(column, "one of " + ", ".join(sorted(allowed)))
        return cast(str, value)


def instant(row: Row, column: str, run_id: str | None, table: str) -> datetime:
    """Return ``row[column]`` as an aware UTC instant."""
    return _Reader(row, run_id, table).instant(column)


def _run_id(row: Row) -> str | None:
    value = row.get("run_id")
    return value if isinstance(value, str) else None


def run(row: Row) -> port.Run:
    """Return the run a ``perdure.runs`` row holds."""
    r = _Reader(row, _run_id(row), "run")
    run_id = r.text("run_id")
    state = cast(port.RunState, r.choice("state", port.RUN_STATES))
    worker = r.opt_text("worker")
    if worker is not None and not port.WORKER_ID.match(worker):
        raise errors.CorruptState(run_id, "run_worker_id", f"worker id {worker[:40]!r}")
    lease = r.opt_instant("lease_expires_at")
    if state == "running" and (worker is None or lease is None):
        raise errors.CorruptState(run_id, "run_claim", "a running run has no worker or lease")
    return port.Run(
        run_id=run_id,
        app=r.text("app"),
        workflow=r.text("workflow"),
        version=r.text("version"),
        state=state,
        input=r.text("input"),
        result=r.opt_text("result"),
        error=r.opt_text("error"),
        key=r.opt_text("key"),
        parent_id=r.opt_text("parent_id"),
        generation=r.count("generation"),
        failures=r.count("failures"),
        worker=worker,
        lease_expires_at=lease,
        ready_at=r.opt_instant("ready_at"),
        cancel_requested=r.flag("cancel_requested"),
        ledger_sequence=r.count("ledger_sequence"),
        created_at=r.instant("created_at"),
        updated_at=r.instant("updated_at"),
    )


def entry(row: Row) -> port.JournalEntry:
    """Return the journal entry a ``perdure.journal`` row holds."""
    r = _Reader(row, _run_id(row), "journal")
    return port.JournalEntry(
        position=r.count("position", 1),
        kind=r.text("kind"),
        name=r.text("name"),
        status=cast(port.EntryStatus, r.choice("status", _ENTRY_STATUSES)),
        output=r.opt_text("output"),
        error=r.opt_text("error"),
        attempt=r.count("attempt", 1),
    )


def receipt(row: Row) -> port.LedgerEntry:
    """Return the provenance receipt a ``perdure.ledger`` row holds."""
    r = _Reader(row, _run_id(row), "ledger")
    return port.LedgerEntry(
        run_id=r.text("run_id"),
        sequence=r.count("sequence", 1),
        kind=r.choice("kind", port.LEDGER_KINDS),
        at=r.instant("at"),
        generation=r.count("generation"),
        worker=r.opt_text("worker"),
        step=r.opt_text("step"),
        digest=r.opt_text("digest"),
        note=r.opt_text("note"),
    )


def outcome(row: Row) -> port.Outcome:
    """Return the outcome record a ``perdure.outcomes`` row holds."""
    r = _Reader(row, _run_id(row), "outcome")
    return port.Outcome(
        run_id=r.text("run_id"),
        name=r.text("name"),
        outcome=cast(port.OutcomeKind, r.choice("outcome", _OUTCOME_KINDS)),
        signal_id=r.opt_text("signal_id"),
        payload=r.opt_text("payload"),
        payload_digest=r.opt_text("payload_digest"),
        at=r.instant("at"),
    )


def wait(row: Row) -> port.WaitRecord:
    """Return the registered wait a ``perdure.waits`` row holds."""
    r = _Reader(row, _run_id(row), "wait")
    return port.WaitRecord(
        run_id=r.text("run_id"),
        app=r.text("app"),
        name=r.text("name"),
        kind=cast(port.WaitKind, r.choice("kind", _WAIT_KINDS)),
        deadline=r.opt_instant("deadline"),
        created_at=r.instant("created_at"),
    )


def message(row: Row) -> port.Message:
    """Return the channel message a ``perdure.messages`` row holds."""
    r = _Reader(row, _run_id(row), "message")
    return port.Message(
        run_id=r.text("run_id"),
        channel=r.text("channel"),
        key=r.text("key"),
        sequence=r.count("sequence", 1),
        payload=r.text("payload"),
        at=r.instant("at"),
    )


# -- records to query parameters ------------------------------------------------

ENTRY_ARRAYS = {
    "positions": "position",
    "kinds": "kind",
    "names": "name",
    "statuses": "status",
    "outputs": "output",
    "errors": "error",
    "attempts": "attempt",
}
RECEIPT_ARRAYS = {
    "run_ids": "run_id",
    "sequences": "sequence",
    "kinds": "kind",
    "generations": "generation",
    "workers": "worker",
    "steps": "step",
    "digests": "digest",
    "notes": "note",
}
CHILD_ARRAYS = {
    "run_ids": "run_id",
    "apps": "app",
    "workflows": "workflow",
    "versions": "version",
    "inputs": "input",
    "keys": "key",
}
WAIT_ARRAYS = {
    "names": "name",
    "kinds": "kind",
    "deadlines": "deadline",
    "after": "after_sequence",
}


def arrays(items: Sequence[object], columns: dict[str, str]) -> dict[str, list[Any]]:
    """Return one list per query parameter (``{param: attribute}``), for ``unnest``."""
    return {param: [getattr(item, attr) for item in items] for param, attr in columns.items()}


@dataclass(frozen=True)
class Receipt:
    """A ledger receipt to append, already numbered."""

    run_id: str
    sequence: int
    kind: str
    generation: int
    worker: str | None
    step: str | None = None
    digest: str | None = None
    note: str | None = None


def numbered(
    run_id: str, last: int, generation: int, worker: str | None, marks: Sequence[port.Mark]
) -> list[Receipt]:
    """Number ``marks`` so that the last gets ``last`` (the run's raised ledger_sequence)."""
    first = last - len(marks) + 1
    return [
        Receipt(run_id, first + i, m.kind, generation, worker, m.step, m.digest, m.note)
        for i, m in enumerate(marks)
    ]


def checked_marks(marks: Sequence[port.Mark]) -> list[port.Mark]:
    """Refuse a receipt kind the ledger would later read as corrupt."""
    for mark in marks:
        if mark.kind not in port.LEDGER_KINDS:
            raise errors.InvalidInput(f"unknown ledger receipt kind {mark.kind!r}")
    return list(marks)


def checked_entries(run_id: str, entries: Sequence[port.JournalEntry]) -> list[port.JournalEntry]:
    """Check entries to write; a position given twice follows the replacement rule, in order."""
    by_position: dict[int, port.JournalEntry] = {}
    for entry in entries:
        if entry.position < 1 or entry.attempt < 1 or entry.status not in _ENTRY_STATUSES:
            raise errors.InvalidInput(f"run {run_id}: malformed journal entry {entry!r}")
        earlier = by_position.get(entry.position)
        if earlier is not None and earlier.status != "started":
            raise errors.CorruptState(
                run_id, "journal_position_taken", f"position {entry.position} is written twice"
            )
        by_position[entry.position] = entry
    return list(by_position.values())


def child_payload(ended: Row) -> str:
    """Return the payload of the parent's ``child:<run_id>`` outcome.

    ``result`` and ``error`` are embedded as the JSON text stored, unparsed.
    """
    return (
        f'{{"run_id": {json.dumps(ended["run_id"])}, "state": {json.dumps(ended["state"])}, '
        f'"result": {ended["result"] or "null"}, "error": {ended["error"] or "null"}}}'
    )
