"""The provenance ledger's rules, shared by every adapter: numbering and retention.

A transition that the ledger records raises the run's ``ledger_sequence`` by
the number of receipts it appends, in the same write; the receipts take the
numbers up to the new value (:func:`numbered`). Each run keeps its newest
receipts, as many as the ``ledger_limit`` stored with it when it was created,
so that every process trims and reads a run by the same bound whatever its
own setting. Adapters store :class:`Receipt` values and delete, in the same
write, what falls out of the run's window; they decide neither numbers nor
the bound.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from perdure import errors
from perdure.store import port


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


def checked_marks(marks: Sequence[port.Mark]) -> list[port.Mark]:
    """Refuse a receipt kind the ledger would later read as corrupt.

    Raises:
        errors.InvalidInput: a kind that is not one of :data:`port.LEDGER_KINDS`.
    """
    for mark in marks:
        if mark.kind not in port.LEDGER_KINDS:
            raise errors.InvalidInput(f"unknown ledger receipt kind {mark.kind!r}")
    return list(marks)


def numbered_rows(
    run_id: str, last: int, generation: int, worker: str | None, marks: Sequence[port.Mark]
) -> list[dict[str, Any]]:
    """:func:`numbered`, as the rows (column to value) an adapter inserts one by one."""
    first = last - len(marks) + 1
    return [
        {
            "run_id": run_id,
            "sequence": first + i,
            "kind": m.kind,
            "generation": generation,
            "worker": worker,
            "step": m.step,
            "digest": m.digest,
            "note": m.note,
        }
        for i, m in enumerate(checked_marks(marks))
    ]


def numbered(
    run_id: str, last: int, generation: int, worker: str | None, marks: Sequence[port.Mark]
) -> list[Receipt]:
    """Number ``marks`` so that the last gets ``last`` (the run's raised ledger_sequence)."""
    return [Receipt(**row) for row in numbered_rows(run_id, last, generation, worker, marks)]
