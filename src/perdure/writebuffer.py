"""The write buffer: what a run recorded since its last durable write, kept for the next one.

Workflow code records some values with no store write of their own (a value
it recorded, a sleep's end, a wait it settled, a message it received, and the
receipts that go with them). An :class:`~perdure.execution.Execution` keeps
them in its :class:`WriteBuffer` and hands them to its next fenced write (a
step's, a park, the end), putting them back when the store refuses that write.
"""

from __future__ import annotations

from perdure import journal


class WriteBuffer:
    """Entries recorded since the last durable write, and the receipts to append with them."""

    def __init__(self) -> None:
        self._entries: list[journal.Entry] = []
        self._marks: list[journal.Mark] = []

    def add(self, entry: journal.Entry, mark: journal.Mark | None = None) -> None:
        """Keep ``entry`` (replacing one at its position) and ``mark`` for the next write."""
        self._entries = [e for e in self._entries if e.position != entry.position]
        self._entries.append(entry)
        if mark is not None:
            self._marks.append(mark)

    def take(self) -> tuple[list[journal.Entry], list[journal.Mark]]:
        """Hand the buffered entries and marks to a write, emptying the buffer."""
        entries, marks = self._entries, self._marks
        self._entries, self._marks = [], []
        return entries, marks

    def restore(self, entries: list[journal.Entry], marks: list[journal.Mark]) -> None:
        """Put back entries and marks whose write was refused, ahead of newer ones."""
        newer = self._entries
        self._entries = [e for e in entries if all(n.position != e.position for n in newer)]
        self._entries += newer
        self._marks[:0] = marks
