"""Continue-as-new written once, over named queries, for every SQL adapter.

:class:`ChainTransitions` adds the operations of
:mod:`perdure.store.chainport` to :class:`perdure.store.transitions.Transitions`.
Ending the old run, creating its successor and moving what the successor
inherits (key, parent, unconsumed messages, unapplied signals) is one
transaction: a crash before it commits leaves the old run running (its
lapsed lease is recovered and it continues again, from the same journal); a
crash after leaves exactly one successor, queued.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import TypeVar

from perdure import errors
from perdure.store import ledger, port, rows, transitions

C = TypeVar("C")

_NUMBERED = re.compile(r"^(?P<base>[^#]+)#(?P<index>[1-9][0-9]*)$")


def renumbered(names: Iterable[str]) -> dict[str, str]:
    """Return the successor's name of each unapplied wait name (see :mod:`chainport`).

    Within one base name the waits keep their order (``submit`` before
    ``submit#2``) and are numbered again from the first: ``submit``,
    ``submit#2``, ...
    """
    by_base: dict[str, list[tuple[int, str]]] = {}
    for name in names:
        numbered = _NUMBERED.match(name)
        base, index = (name, 1) if numbered is None else (numbered["base"], int(numbered["index"]))
        by_base.setdefault(base, []).append((index, name))
    moved: dict[str, str] = {}
    for base, found in by_base.items():
        for position, (_, name) in enumerate(sorted(found), start=1):
            moved[name] = base if position == 1 else f"{base}#{position}"
    return moved


class ChainTransitions(transitions.Transitions[C]):
    """The chain operations shared by the SQL adapters; ``C`` is the adapter's cursor."""

    def continue_run(
        self,
        claim: port.Claim,
        entries: Sequence[port.JournalEntry],
        successor: port.NewRun,
        *,
        consumed: Mapping[str, int],
        marks: Sequence[port.Mark] = (),
    ) -> port.Run:
        """End the claimed run and create its queued successor (see ``chainport.ChainStore``)."""
        entries = rows.checked_entries(claim.run_id, entries)
        receipts = [
            *ledger.checked_marks(marks),
            port.Mark("continued", note=f"as {successor.run_id}"),
        ]
        old_id, new_id = claim.run_id, successor.run_id
        channels = sorted(consumed)
        batch = self._batch(
            {"channels": channels, "sequences": [int(consumed[c]) for c in channels]}
        )

        def work(cur: C) -> port.Run:
            found = self._exec(cur, "lock_run", run_id=old_id).fetchone()
            if found is None:
                raise errors.StaleClaim(old_id)
            key = self.read.run(found).key
            # A cancel requested meanwhile wins: the run does not continue.
            params = {"successor_id": new_id, "receipts": len(receipts)}
            row = self._fenced(cur, "chain_end", claim, False, **params)
            self._put_journal(cur, old_id, entries)
            self._append_marks(cur, claim, row["ledger_sequence"], receipts)
            new = {"old_id": old_id, "run_id": new_id, "key": key}
            created = self._exec(
                cur,
                "chain_create",
                workflow=successor.workflow,
                version=successor.version,
                input=successor.input,
                **new,
            ).fetchone()
            if created is None:
                raise errors.InvalidInput(f"run id {new_id!r} is already taken")
            note = f"continued from {old_id}"
            self._append(cur, [ledger.Receipt(new_id, 1, "initialized", 0, None, note=note)])
            self._exec(cur, "chain_messages_move", old_id=old_id, run_id=new_id, **batch)
            self._exec(cur, "chain_messages_counted", run_id=new_id)
            pending = self._exec(cur, "chain_pending_signals", run_id=old_id).fetchall()
            names = renumbered(r["name"] for r in pending)
            if names:
                olds = sorted(names)
                pairs = self._batch({"olds": olds, "names": [names[n] for n in olds]})
                self._exec(cur, "chain_signals_move", old_id=old_id, run_id=new_id, **pairs)
            # The old run's other records go, its updates are abandoned and
            # its children follow their parent_close (the row names no parent).
            self._end_runs(cur, [row])
            self._notify(cur, [row["app"]])
            stored = self._exec(cur, "run_by_id", run_id=new_id).fetchone()
            return self.read.run(stored if stored is not None else created)

        return self._transact(work)

    def chain(self, run_id: str) -> list[port.Run]:
        """Return the runs of ``run_id``'s chain, first to current."""

        def work(cur: C) -> list[port.Run]:
            row = self._exec(cur, "run_by_id", run_id=run_id).fetchone()
            if row is None:
                raise errors.RunNotFound(run_id)
            run = self.read.run(row)
            if run.origin is None:
                return [run]
            links = [self.read.run(r) for r in self._exec(cur, "chain_runs", origin=run.origin)]
            return _ordered(run.origin, links)

        return self._transact(work, single=True)

    def current_run(self, run_id: str) -> port.Run | None:
        """Return the current run of ``run_id``'s chain (the run itself outside any chain)."""

        def work(cur: C) -> port.Run | None:
            row = self._exec(cur, "run_by_id", run_id=run_id).fetchone()
            if row is None:
                return None
            run = self.read.run(row)
            if run.continued_as is None or run.origin is None:
                return run
            current = self._exec(cur, "chain_current", origin=run.origin).fetchone()
            if current is None:
                raise _no_current(run_id, run.origin)
            return self.read.run(current)

        return self._transact(work, single=True)

    def _current_locked(self, cur: C, run_id: str) -> str:
        """Return the id of the current run of ``run_id``'s chain, its row locked."""
        row = self._exec(cur, "lock_run", run_id=run_id).fetchone()
        if row is None:
            raise errors.RunNotFound(run_id)
        # A continue that commits while this waits on a lock adds a link: look again.
        while row["continued_as"] is not None and row["origin"] is not None:
            current = self._exec(cur, "chain_current", origin=row["origin"]).fetchone()
            if current is None:
                raise _no_current(run_id, row["origin"])
            row = self._exec(cur, "lock_run", run_id=current["run_id"]).fetchone()
            assert row is not None
        return str(row["run_id"])


def _no_current(run_id: str, origin: str) -> errors.CorruptState:
    return rows.corrupt(run_id, "chain_current", f"chain {origin} has no current run")


def _ordered(origin: str, links: Sequence[port.Run]) -> list[port.Run]:
    """Order a chain's runs by their links, from the first still stored.

    Retention may have pruned the oldest links: the chain then starts at the
    one link no other names as its successor.
    """
    by_id = {run.run_id: run for run in links}
    named = {run.continued_as for run in links}
    heads = [run.run_id for run in links if run.run_id not in named]
    at: str | None = origin if origin in by_id else (heads[0] if len(heads) == 1 else None)
    ordered: list[port.Run] = []
    while at is not None and at in by_id and len(ordered) < len(by_id):
        ordered.append(by_id[at])
        at = by_id[at].continued_as
    if len(ordered) != len(by_id):
        raise rows.corrupt(origin, "chain_links", f"{len(by_id) - len(ordered)} runs off the chain")
    return ordered
