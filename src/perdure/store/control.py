"""Suspend, resume and run deadlines written once, over named queries, for every SQL adapter.

:class:`ControlTransitions` adds the operations of
:mod:`perdure.store.controlport` to :class:`perdure.store.transitions.Transitions`,
and has the worker's ``sweep`` cancel the runs past their deadline.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TypeVar, cast

from perdure import errors
from perdure.store import controlport, ledger, port, rows, transitions

C = TypeVar("C")

_DEADLINE_ERROR = json.dumps(
    {"code": controlport.DEADLINE_EXCEEDED, "message": "the run did not end by its deadline"}
)


class ControlTransitions(transitions.Transitions[C]):
    """The flow-control operations shared by the SQL adapters; ``C`` is the adapter's cursor."""

    def suspend(self, run_id: str) -> controlport.SuspendResult:
        """Suspend a queued or waiting run at once; ask a running one's owner."""

        def work(cur: C) -> controlport.SuspendResult:
            run = self._lock_live(cur, run_id)
            if run.state == "needs_attention":
                raise errors.RunFinished(run_id, run.state)
            if run.plan_digest is not None:
                raise errors.InvalidInput(
                    f"run {run_id} is a plan run: its tasks are claimed one by one and it "
                    "cannot be suspended (cancel it, or fork it later)"
                )
            if run.state == "suspended" or (run.state == "running" and run.suspend_requested):
                return "already"
            query, kind, result = (
                ("suspend_request", "suspend_requested", "requested")
                if run.state == "running"
                else ("suspend_now", "suspended", "suspended")
            )
            row = self._exec(cur, query, run_id=run_id).fetchone()
            if row is None:  # the row is locked: only a state this code does not know
                raise rows.corrupt(run_id, "run_state", f"cannot suspend a {run.state} run")
            receipt = ledger.Receipt(run_id, row["ledger_sequence"], kind, row["generation"], None)
            self._append(cur, [receipt])
            return cast(controlport.SuspendResult, result)

        return self._transact(work)

    def unsuspend(self, run_id: str) -> port.RunState | None:
        """Return a suspended run to where it was (waking it if a wait is met), or withdraw."""

        def work(cur: C) -> port.RunState | None:
            run = self._lock_live(cur, run_id)
            if run.state == "suspended":
                query = "unsuspend"
            elif run.state == "running" and run.suspend_requested:
                query = "suspend_withdraw"
            else:
                return None
            row = self._exec(cur, query, run_id=run_id).fetchone()
            assert row is not None  # read under the same lock
            sequence, generation = row["ledger_sequence"], row["generation"]
            self._append(cur, [ledger.Receipt(run_id, sequence, "resumed", generation, None)])
            state = cast(port.RunState, row["state"])
            if state == "queued":
                self._notify(cur, [row["app"]])
            elif state == "waiting":
                ready_at = None if row["ready_at"] is None else self.read.instant(row, "ready_at")
                met = self._exec(cur, "park_satisfied", run_id=run_id, ready_at=ready_at)
                satisfied = met.fetchone()
                if satisfied is not None and satisfied["satisfied"] and self._wake(cur, [run_id]):
                    state = "queued"
            return state

        return self._transact(work)

    def let_go(
        self,
        claim: port.Claim,
        entries: Sequence[port.JournalEntry],
        marks: Sequence[port.Mark] = (),
        *,
        reset: bool = False,
    ) -> bool:
        """Record the owner's last entries and make the run suspended (fenced)."""
        entries = rows.checked_entries(claim.run_id, entries)
        marks = ledger.checked_marks(marks)
        params = {"reset": reset, "receipts": len(marks)}

        def work(cur: C) -> bool:
            ids = {"run_id": claim.run_id, "generation": claim.generation}
            row = self._exec(cur, "let_go", **ids, **params).fetchone()
            if row is None:
                self._lost(cur, claim, False)
            self._put_journal(cur, claim.run_id, entries)
            suspended: bool = row["state"] == "suspended"
            receipts = [*marks, port.Mark("suspended")] if suspended else marks
            self._append_marks(cur, claim, row["ledger_sequence"], receipts)
            return suspended

        return self._transact(work)

    def expire_deadlines(
        self, app: str | None = None, run_id: str | None = None, limit: int = 500
    ) -> int:
        """Cancel the live runs past their deadline, with their descendants."""

        def work(cur: C) -> int:
            params = {"app": app, "run_id": run_id, "limit": max(1, limit)}
            due = [r["run_id"] for r in self._exec(cur, "deadline_due", **params).fetchall()]
            if not due:
                return 0
            self._exec(cur, "lock_runs", run_ids=due)
            self._exec(cur, "deadline_error", run_ids=due, error=_DEADLINE_ERROR)
            self._cancel_trees(cur, due)
            return len(due)

        return self._transact(work)

    def sweep(self) -> int:
        """Do the housekeeping of :meth:`Transitions.sweep`, then cancel runs past deadline."""
        return super().sweep() + self.expire_deadlines()
