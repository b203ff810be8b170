"""The provenance ledger's rules, shared by every adapter: numbering and retention.

A transition that the ledger records raises the run's ``ledger_sequence`` by
the number of receipts it appends, in the same write; the receipts take the
numbers up to the new value (:func:`numbered`). Only the newest
``ledger_limit`` receipts of a run are kept (:func:`floors`, :func:`retained`). Adapters
store :class:`Receipt` values as they are and delete what falls out of the
window; they decide neither numbers nor retention.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

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


def numbered(
    run_id: str, last: int, generation: int, worker: str | None, marks: Sequence[port.Mark]
) -> list[Receipt]:
    """Number ``marks`` so that the last gets ``last`` (the run's raised ledger_sequence)."""
    first = last - len(marks) + 1
    return [
        Receipt(run_id, first + i, m.kind, generation, worker, m.step, m.digest, m.note)
        for i, m in enumerate(checked_marks(marks))
    ]


def floors(receipts: Sequence[Receipt], limit: int) -> list[tuple[str, int]]:
    """Return, per run, the lowest sequence kept once ``receipts`` are appended."""
    newest: dict[str, int] = {}
    for receipt in receipts:
        newest[receipt.run_id] = max(receipt.sequence, newest.get(receipt.run_id, 0))
    return [(run_id, max(1, last - limit + 1)) for run_id, last in newest.items()]


def retained(receipts: Sequence[Receipt], limit: int) -> list[Receipt]:
    """Return the receipts that stay in the window of ``limit`` once all are appended."""
    kept = dict(floors(receipts, limit))
    return [r for r in receipts if r.sequence >= kept[r.run_id]]
