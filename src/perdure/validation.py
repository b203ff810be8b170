"""Check what was read from the store before the engine acts on it.

Each check raises :class:`errors.CorruptState` naming the run and the
invariant; nothing is repaired by guessing. The invariants are listed in
``docs/provenance.md``.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from typing import get_args

from perdure import errors, live
from perdure import journal as bodies
from perdure.store import port

JOURNAL_KINDS = frozenset(
    {"step", "sleep", "now", "random", "uuid", "wait", "receive", "child", "child_result", "patch"}
    | {"update", "respond", "event", "stream", "stream_close", "first"}
)
# Kinds whose entry may stay "started": a once effect in flight, or an open wait.
STARTED_KINDS = frozenset({"step", "wait", "receive", "update", "first"})
ENTRY_STATUSES: frozenset[str] = frozenset(get_args(port.EntryStatus))
OUTCOME_KINDS: frozenset[str] = frozenset(get_args(port.OutcomeKind))


def _fail(run_id: str, invariant: str, detail: str) -> errors.CorruptState:
    return errors.CorruptState(run_id, invariant, detail)


def _json(run_id: str, invariant: str, text: str | None) -> None:
    if text is None:
        return
    try:
        json.loads(text)
    except ValueError as exc:
        raise _fail(run_id, invariant, f"not valid JSON: {exc}") from exc


def worker_id(run_id: str, value: str | None, *, where: str) -> None:
    """Refuse a worker id that is not 1 to 128 printable non-space ASCII characters."""
    if value is not None and not port.WORKER_ID.match(value):
        raise _fail(run_id, f"{where}_worker_id", f"worker id {value[:40]!r} is malformed")


def run(record: port.Run, *, max_failures: int) -> None:
    """Check one run record: identity, claim fields and JSON columns."""
    rid = record.run_id
    if record.state not in port.RUN_STATES:
        raise _fail(rid, "run_state", f"unknown state {record.state!r}")
    if record.generation < 0:
        raise _fail(rid, "run_generation", f"generation {record.generation} is negative")
    if not 0 <= record.failures <= max_failures:
        raise _fail(rid, "run_failures", f"failures {record.failures} not in 0..{max_failures}")
    if record.ledger_sequence < 0:
        raise _fail(rid, "run_ledger_sequence", f"sequence {record.ledger_sequence} is negative")
    worker_id(rid, record.worker, where="run")
    if record.state == "running" and (record.worker is None or record.lease_expires_at is None):
        raise _fail(rid, "run_claim", "a running run has no worker or no lease")
    if record.state == "running" and record.generation == 0:
        raise _fail(rid, "run_claim", "a running run was never claimed")
    _json(rid, "run_input_json", record.input)
    _json(rid, "run_result_json", record.result)
    _json(rid, "run_error_json", record.error)


def positions(run_id: str, entries: Sequence[port.JournalEntry]) -> None:
    """Check that positions run 1, 2, ..., n without gaps or repeats."""
    for expected, entry in enumerate(entries, start=1):
        if entry.position != expected:
            kind = "journal_duplicate_position" if entry.position < expected else "journal_gap"
            raise _fail(run_id, kind, f"expected position {expected}, found {entry.position}")


def journal(run_id: str, entries: Sequence[port.JournalEntry]) -> None:
    """Check positions, kinds, statuses and JSON of a run's journal."""
    positions(run_id, entries)
    started_at: int | None = None
    for expected, entry in enumerate(entries, start=1):
        if entry.kind not in JOURNAL_KINDS:
            raise _fail(run_id, "journal_kind", f"position {expected}: unknown kind {entry.kind!r}")
        if entry.status not in ENTRY_STATUSES:
            raise _fail(run_id, "journal_status", f"position {expected}: {entry.status!r}")
        if entry.status == "started":
            if entry.kind not in STARTED_KINDS:
                raise _fail(run_id, "journal_status", f"a {entry.kind} entry cannot be started")
            started_at = expected if started_at is None else started_at
        if not entry.name:
            raise _fail(run_id, "journal_name", f"position {expected} has no name")
        if entry.attempt < 1:
            raise _fail(run_id, "journal_attempt", f"position {expected}: attempt {entry.attempt}")
        _json(run_id, "journal_output_json", entry.output)
        _json(run_id, "journal_error_json", entry.error)
        if entry.kind in live.KINDS:
            live.check(run_id, entry)
        _attempts(run_id, entry)
    if started_at is not None and started_at != len(entries):
        raise _fail(
            run_id,
            "journal_started_not_last",
            f"position {started_at} is unsettled but the journal goes on",
        )


def _attempts(run_id: str, entry: port.JournalEntry) -> None:
    """Check the failed attempts a step entry keeps (none, in journals from before them)."""
    if entry.kind != "step" or entry.error is None:
        return
    try:
        bodies.failed_attempts(entry)
    except ValueError as exc:
        raise _fail(run_id, "journal_attempts_shape", f"position {entry.position}: {exc}") from exc


def outcomes(
    run_id: str,
    found: Sequence[port.Outcome],
    entries: Sequence[port.JournalEntry],
    unjournaled: Collection[str] = (),
) -> None:
    """Check that each outcome belongs to this run and to a wait it can have.

    ``unjournaled`` are ids of runs the store holds as this run's children
    although its journal does not name them: an attempt created them and died
    before its next journal write, and a child may end before the replay
    journals it again (the replay finds it by its key).
    """
    # The run's children, gathered from its journal only when a child's outcome
    # asks: a run woken by a signal or an update is checked without a walk.
    children: set[str] | None = None
    for outcome in found:
        if outcome.run_id != run_id:
            raise _fail(run_id, "outcome_run", f"outcome {outcome.name!r} is for another run")
        if outcome.outcome not in OUTCOME_KINDS:
            raise _fail(run_id, "outcome_kind", f"unknown outcome {outcome.outcome!r}")
        if outcome.name.startswith("child:"):
            if children is None:
                children = {_child_id(e) for e in entries if e.kind == "child"}
                children |= set(unjournaled)
            if outcome.name[len("child:") :] not in children:
                raise _fail(
                    run_id,
                    "outcome_unknown_wait",
                    f"outcome {outcome.name!r} names no child of this run",
                )
        elif not outcome.name or "/" in outcome.name:
            raise _fail(run_id, "outcome_unknown_wait", f"outcome name {outcome.name!r}")
        _json(run_id, "outcome_payload_json", outcome.payload)


def unjournaled_children(
    found: Sequence[port.Outcome], entries: Sequence[port.JournalEntry]
) -> list[str]:
    """Return the child ids that outcomes name and the journal does not."""
    children = {_child_id(e) for e in entries if e.kind == "child"}
    named = (o.name[len("child:") :] for o in found if o.name.startswith("child:"))
    return [child for child in named if child not in children]


def _child_id(entry: port.JournalEntry) -> str:
    try:
        return bodies.ChildStarted.decode(entry.output).run_id
    except ValueError:
        return ""


def ledger(record: port.Run, entries: Sequence[port.LedgerEntry]) -> None:
    """Check the retained ledger against the run's sequence and the retention rule.

    The retention N is the run's own ``ledger_limit``, stored with it, never
    the reader's. For a run at sequence S exactly min(S, N) receipts are
    kept, numbered S-min(S,N)+1 .. S without gaps; when the ledger is whole
    (S <= N) the first is ``initialized``; generations never decrease. A run
    at sequence 0 with no receipts is the documented legacy shape.
    """
    rid = record.run_id
    total, limit = record.ledger_sequence, record.ledger_limit
    if limit < 1:
        raise _fail(rid, "ledger_limit", f"the run keeps {limit} receipts; at least 1 is needed")
    if total == 0 and not entries:
        return
    if total > 0 and not entries:
        raise _fail(rid, "ledger_empty", f"sequence is {total} but no receipts are stored")
    if len(entries) != min(total, limit):
        raise _fail(
            rid,
            "ledger_count",
            f"{len(entries)} receipts stored, expected min({total}, {limit}) = {min(total, limit)}",
        )
    first = total - len(entries) + 1
    previous_generation = -1
    for offset, entry in enumerate(entries):
        expected = first + offset
        if entry.run_id != rid:
            raise _fail(rid, "ledger_run", f"receipt {entry.sequence} is for another run")
        if entry.sequence != expected:
            raise _fail(
                rid, "ledger_sequence_gap", f"expected receipt {expected}, found {entry.sequence}"
            )
        if entry.kind not in port.LEDGER_KINDS:
            raise _fail(
                rid, "ledger_kind", f"receipt {entry.sequence}: unknown kind {entry.kind!r}"
            )
        if entry.kind == "initialized" and entry.sequence != 1:
            raise _fail(rid, "ledger_first", f"receipt {entry.sequence} claims to be 'initialized'")
        if entry.generation < previous_generation:
            raise _fail(
                rid,
                "ledger_generation",
                f"receipt {entry.sequence} goes back to generation {entry.generation}",
            )
        previous_generation = entry.generation
        worker_id(rid, entry.worker, where="ledger")
    if first == 1 and entries[0].kind != "initialized":
        raise _fail(rid, "ledger_first", f"receipt 1 is {entries[0].kind!r}, not 'initialized'")
    if previous_generation > record.generation:
        raise _fail(rid, "ledger_generation", "a receipt is newer than the run's generation")
