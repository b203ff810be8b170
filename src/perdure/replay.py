"""Match the calls a workflow makes against its journal. No I/O.

A run's code is re-executed from the top on every claim. Each durable call
takes the next journal position; :class:`JournalCursor` says whether that
position holds a recorded entry for the same call (replay it) or nothing
(execute it), and refuses a recorded entry of another kind or name.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from perdure import effects, errors, validation
from perdure.store import port


@dataclass(frozen=True)
class Call:
    """What the code does at a position: a kind and a name."""

    kind: str
    name: str

    def describe(self) -> str:
        return f"{self.kind} {self.name!r}"


class JournalCursor:
    """Walk a run's journal in step with its code."""

    def __init__(self, run_id: str, entries: Sequence[port.JournalEntry]) -> None:
        validation.positions(run_id, entries)
        self.run_id = run_id
        self._entries = list(entries)
        self._position = 0
        self._names: Counter[str] = Counter()
        self._waits: Counter[str] = Counter()

    @property
    def position(self) -> int:
        """The position of the latest call (0 before the first)."""
        return self._position

    @property
    def replaying(self) -> bool:
        """Whether recorded entries remain ahead of the cursor."""
        return self._position < len(self._entries)

    def step_key(self, name: str) -> str:
        """Return the key of the next call of step ``name`` (``name``, ``name#2``, ...)."""
        self._names[name] += 1
        return effects.step_key(name, self._names[name])

    def wait_key(self, name: str) -> str:
        """Return the key of the next wait on ``name`` (``name``, ``name#2``, ...)."""
        self._waits[name] += 1
        return effects.step_key(name, self._waits[name])

    def peek_wait_key(self, name: str) -> str:
        """Return the key the next wait on ``name`` would take, without taking it."""
        return effects.step_key(name, self._waits[name] + 1)

    def next(self, call: Call) -> port.JournalEntry | None:
        """Advance to the next position and return its recorded entry, or None to execute.

        Raises:
            errors.NonDeterminism: the recorded entry is for a different call.
        """
        self._position += 1
        if self._position > len(self._entries):
            return None
        entry = self._entries[self._position - 1]
        if entry.kind != call.kind or entry.name != call.name:
            recorded = Call(entry.kind, entry.name)
            raise errors.NonDeterminism(
                f"run {self.run_id} position {self._position}: "
                f"journal has {recorded.describe()}, code now calls {call.describe()}"
            )
        return entry

    def peek(self) -> port.JournalEntry | None:
        """Return the entry recorded at the next position without advancing, or None."""
        return self.at(self._position + 1)

    def record(self, entry: port.JournalEntry) -> None:
        """Remember an entry this execution wrote, so later re-execution replays it."""
        index = entry.position - 1
        if index < len(self._entries):
            self._entries[index] = entry
        elif index == len(self._entries):
            self._entries.append(entry)
        else:
            raise errors.CorruptState(self.run_id, "journal_gap", f"wrote {entry.position}")

    def at(self, position: int) -> port.JournalEntry | None:
        """Return the entry known at ``position`` (1, 2, ...), or None past the end."""
        return self._entries[position - 1] if 0 < position <= len(self._entries) else None

    def entries(self) -> list[port.JournalEntry]:
        """Return the journal as this cursor knows it."""
        return list(self._entries)

    def rewind(self) -> None:
        """Go back to the start for another pass over the same code."""
        self._position = 0
        self._names.clear()
        self._waits.clear()
