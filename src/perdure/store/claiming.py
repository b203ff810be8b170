"""Claims written once over named queries, for every SQL adapter: who may write for which run.

:class:`ClaimTransitions` adds ``claim``, ``renew`` and ``release`` to
:class:`perdure.store.transitions.Transitions`. A claim takes runs in no queue
through the adapter's own ``_claim`` (which steps over runs in queues) and runs
in queues through :meth:`ClaimTransitions._claim_queued` (the queues section,
:mod:`perdure.store.queueing`, fills it in), in one transaction; the owners
section's ``claim_owned`` makes the same claim behind the app's owner record.
A run whose rows fail validation is set aside (``_quarantine``), here and in
the plans section's claims of tasks, instead of being handed out.
"""

from __future__ import annotations

import abc
import json
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import TypeVar

from perdure import errors
from perdure.store import ledger, port, transitions

C = TypeVar("C")


class ClaimTransitions(transitions.Transitions[C]):
    """Claims of runs and the lease they hold, shared by the SQL adapters; ``C`` is the cursor."""

    @abc.abstractmethod
    def _claim(
        self,
        cur: C,
        app: str,
        worker: str,
        workflows: Sequence[tuple[str, str]],
        ttl: float,
        limit: int,
        recover_until: datetime | None,
        known: Mapping[str, port.KnownJournal],
        dry_run: bool = False,
    ) -> list[port.Claimed]:
        """Claim up to ``limit`` ready runs in this transaction, setting corrupt ones aside.

        A lapsed run is recovered only if the transaction's instant is at or
        before ``recover_until`` (None: never), judged inside the claim.
        """

    def claim(
        self,
        app: str,
        worker: str,
        workflows: Sequence[tuple[str, str]],
        *,
        lease_ttl: float,
        limit: int = 1,
        recover_until: datetime | None = port.RECOVER_ANY,
        dry_run: bool = False,
        known: Mapping[str, port.KnownJournal] | None = None,
    ) -> list[port.Claimed]:
        """Claim up to ``limit`` ready runs; a run whose rows fail validation is set aside.

        Lapsed runs are recovered only if the transaction's instant is at or
        before ``recover_until`` (None: never).
        """
        ttl = transitions.seconds(lease_ttl, "lease_ttl", positive=True)
        if recover_until is not None and recover_until.tzinfo is None:
            raise errors.InvalidInput("recover_until must be an aware datetime")
        if limit < 1 or not workflows:
            return []
        return self._claim_transact(
            app,
            lambda cur: self._claim_all(
                cur, app, worker, workflows, ttl, limit, recover_until, dry_run, known or {}
            ),
        )

    def claim_warm(
        self,
        app: str,
        worker: str,
        workflows: Sequence[tuple[str, str]],
        *,
        run_id: str,
        known: port.KnownJournal,
        lease_ttl: float,
        dry_run: bool = False,
    ) -> port.Claimed | None:
        """Claim ``run_id`` alone if it is ready at ``known.generation`` (see :mod:`.warmport`)."""
        ttl = transitions.seconds(lease_ttl, "lease_ttl", positive=True)
        if not workflows:
            return None
        return self._claim_warm(app, worker, workflows, run_id, known, ttl, dry_run)

    def create_claimed(
        self, new: port.NewRun, worker: str, *, lease_ttl: float
    ) -> tuple[port.Run, port.Claimed | None]:
        """Create ``new`` running under ``worker`` (see :mod:`.eagerport`)."""
        ttl = transitions.seconds(lease_ttl, "lease_ttl", positive=True)
        if not port.WORKER_ID.match(worker):
            raise errors.InvalidInput(
                "a worker id is 1 to 128 printable ASCII characters without spaces"
            )
        if new.queue is not None or new.plan is not None:
            raise errors.InvalidInput(
                "a run in a queue or with a plan is claimed under its limits, not as it is created"
            )
        params = {k: v for k, v in vars(new).items() if k != "plan"}

        def work(cur: C) -> tuple[port.Run, port.Claimed | None]:
            row = self._exec(
                cur,
                "create_claimed",
                ledger_limit=self._ledger_limit,
                worker=worker,
                lease_ttl=ttl,
                **params,
            ).fetchone()
            if row is None:
                return self._stored_start(cur, new), None
            self._created_claimed(cur, new.run_id, worker)
            run = self.read.run(row)
            assert run.lease_expires_at is not None
            claim = port.Claim(run.run_id, worker, run.generation, run.lease_expires_at)
            return run, port.Claimed(claim, run, [])

        return self._start_transact(work)

    def _created_claimed(self, cur: C, run_id: str, worker: str) -> None:
        """Give a run created claimed its two receipts (an adapter's statement may have)."""
        self._append(
            cur,
            [
                ledger.Receipt(run_id, 1, "initialized", 0, None),
                ledger.Receipt(run_id, 2, "claimed", 1, worker),
            ],
        )

    def _start_transact(
        self, work: Callable[[C], tuple[port.Run, port.Claimed | None]]
    ) -> tuple[port.Run, port.Claimed | None]:
        """Run an eager start's ``work`` as one write (an adapter may commit it alone)."""
        return self._transact(work)

    @abc.abstractmethod
    def _claim_warm(
        self,
        app: str,
        worker: str,
        workflows: Sequence[tuple[str, str]],
        run_id: str,
        known: port.KnownJournal,
        ttl: float,
        dry_run: bool,
    ) -> port.Claimed | None:
        """Claim one warm-parked run by key, in the adapter's cheapest way."""

    def _claim_transact(
        self, app: str, work: Callable[[C], list[port.Claimed]]
    ) -> list[port.Claimed]:
        """Run a claim's ``work`` in one transaction (an adapter may open it its own way)."""
        return self._transact(work)

    _claims_made = 0

    def _claim_all(
        self,
        cur: C,
        app: str,
        worker: str,
        workflows: Sequence[tuple[str, str]],
        ttl: float,
        limit: int,
        recover_until: datetime | None,
        dry_run: bool,
        known: Mapping[str, port.KnownJournal],
    ) -> list[port.Claimed]:
        """Claim runs in no queue and runs in queues, in one transaction.

        A dry run is never placed in a queue, so a dry-run claim looks at
        runs in no queue only.
        """
        if dry_run:
            return self._claim(
                cur, app, worker, workflows, ttl, limit, recover_until, known, dry_run=True
            )
        self._claims_made += 1
        queued_first = self._claims_made % 2 == 0
        # Runs in queues and the others take turns to go first, so that
        # neither kind starves the other of a busy worker's slots.
        claimed = []
        if queued_first:
            claimed += self._claim_queued(cur, app, worker, workflows, ttl, limit)
        if len(claimed) < limit:
            left = limit - len(claimed)
            claimed += self._claim(cur, app, worker, workflows, ttl, left, recover_until, known)
        if not queued_first and len(claimed) < limit:
            left = limit - len(claimed)
            claimed += self._claim_queued(cur, app, worker, workflows, ttl, left)
        return claimed

    def _claim_queued(
        self,
        cur: C,
        app: str,
        worker: str,
        workflows: Sequence[tuple[str, str]],
        ttl: float,
        limit: int,
    ) -> list[port.Claimed]:
        """Claim runs in queues, as their limits admit (a store without queues has none)."""
        return []

    def _quarantine(self, cur: C, run_id: str, exc: errors.CorruptState) -> None:
        """Make an unreadable run needs_attention (and say so in its ledger)."""
        error = {"code": exc.code, "message": str(exc), "invariant": exc.invariant}
        row = self._exec(cur, "quarantine", run_id=run_id, error=json.dumps(error)).fetchone()
        # A sequence that was already broken gets no receipt: numbering one
        # from it would only add another broken row.
        if row is None or not isinstance(row["ledger_sequence"], int) or row["ledger_sequence"] < 1:
            return
        generation = row["generation"] if isinstance(row["generation"], int) else 0
        note = f"set aside: {exc.invariant}"
        receipt = ledger.Receipt(
            run_id, row["ledger_sequence"], "finished", max(0, generation), None, note=note
        )
        self._append(cur, [receipt])

    def _unchanged(
        self,
        cur: C,
        known: Mapping[str, port.KnownJournal],
        run_id: str,
        prior_state: str,
        prior_generation: int,
    ) -> list[port.JournalEntry] | None:
        """The journal a claimer holds for a run just claimed, if the claim proves it current.

        Found not running at the generation it was parked with, the run has had
        no claim since. Only ``resolve`` could have changed its journal then,
        and only an entry still ``started``: those (a parked run's waits, at
        its end) are read back and compared (see :class:`port.KnownJournal`).
        """
        held = known.get(run_id)
        if held is None or prior_state == "running" or prior_generation != held.generation:
            return None
        journal = list(held.journal)
        first = next((i for i, e in enumerate(journal) if e.status == "started"), None)
        if first is not None:
            after = journal[first].position - 1
            rows = self._exec(cur, "journal_after", run_id=run_id, after_position=after)
            if [self.read.entry(row) for row in rows.fetchall()] != journal[first:]:
                return None
        return journal

    def _claimed(
        self,
        cur: C,
        found: Sequence[tuple[port.Run, bool]],
        held: Mapping[str, list[port.JournalEntry]] | None = None,
        bare: Collection[str] = (),
        known: Mapping[str, port.KnownJournal] | None = None,
    ) -> list[port.Claimed]:
        """Return the claims of runs just claimed, each ``(run, recovered)``, with their records.

        The journals in ``held`` (by run id, see :meth:`_unchanged`) are not
        read again, nor the outcomes of the runs in ``bare`` (known to have
        none). For a run in ``held`` its claimer's ``known`` journal names the
        outcomes it holds (they never change: left out) and the updates its
        code waits for (the first after each is read, see ``Claimed.updates``).
        """
        journals: dict[str, list[port.JournalEntry]] = dict(held or {})
        run_ids = [run.run_id for run, _ in found]
        unread = [run_id for run_id in run_ids if run_id not in journals]
        for row in self._rows_of(cur, unread, "journal", "journals"):
            journals.setdefault(row["run_id"], []).append(self.read.entry(row))
        holders = {r: known[r] for r in (held or {}) if known and r in known}
        outcomes: dict[str, list[port.Outcome]] = {}
        unread = [run_id for run_id in run_ids if run_id not in bare]
        for row in self._rows_of(cur, unread, "outcomes", "outcomes_of_runs"):
            holder = holders.get(row["run_id"])
            if holder is not None and row["name"] in holder.outcomes:
                continue
            outcomes.setdefault(row["run_id"], []).append(self.read.outcome(row))
        result = []
        for run, recovered in found:
            assert run.worker is not None and run.lease_expires_at is not None
            claim = port.Claim(run.run_id, run.worker, run.generation, run.lease_expires_at)
            journal, settled = journals.get(run.run_id, []), outcomes.get(run.run_id, [])
            holder = holders.get(run.run_id)
            ahead = self._updates_ahead(cur, run.run_id, holder.updates) if holder else {}
            result.append(port.Claimed(claim, run, journal, settled, recovered, ahead))
        return result

    def _updates_ahead(
        self, cur: C, run_id: str, waits: Sequence[tuple[str, int]]
    ) -> dict[tuple[str, int], port.UpdateRecord]:
        """The first update after each ``(name, after sequence)``, read under the claim."""
        ahead = {}
        for name, after in waits:
            params = {"run_id": run_id, "name": name, "after_sequence": after}
            row = self._exec(cur, "next_update", **params).fetchone()
            if row is not None:
                ahead[(name, after)] = self.read.update(row)
        return ahead

    def _rows_of(
        self, cur: C, run_ids: Sequence[str], by_key: str, by_list: str
    ) -> Sequence[transitions.Row]:
        """The rows ``by_key`` (of one run) or ``by_list`` (of several) return for ``run_ids``."""
        if not run_ids:
            return []
        # One run (SQLite claims them one by one) reads its rows by key, which
        # costs about half of a lookup through a list of ids.
        if len(run_ids) == 1:
            return self._exec(cur, by_key, run_id=run_ids[0]).fetchall()
        return self._exec(cur, by_list, run_ids=list(run_ids)).fetchall()

    def renew(self, claim: port.Claim, *, lease_ttl: float) -> port.Claim:
        """Extend the lease to now + ``lease_ttl`` (fenced)."""
        ttl = transitions.seconds(lease_ttl, "lease_ttl", positive=True)

        def work(cur: C) -> port.Claim:
            row = self._fenced(cur, "renew", claim, claim.canceling, lease_ttl=ttl)
            expires = self.read.instant(row, "lease_expires_at")
            return replace(claim, lease_expires_at=expires)

        return self._transact(work)

    def next_lapse(self, app: str) -> datetime | None:
        """The earliest lease of the app's running runs still to lapse, or None."""
        row = self._transact(
            lambda cur: self._exec(cur, "next_lapse", app=app).fetchone(), single=True
        )
        if row is None or row["at"] is None:
            return None
        return self.read.instant(row, "at")

    def release(
        self, claim: port.Claim, *, delay: float, failed: bool, marks: Sequence[port.Mark] = ()
    ) -> None:
        """Give the run back as queued, claimable after ``delay`` seconds (fenced)."""
        receipts = [*ledger.checked_marks(marks), port.Mark("released")]
        params = {
            "delay": transitions.seconds(delay, "delay"),
            "failed": failed,
            "receipts": len(receipts),
        }

        def work(cur: C) -> None:
            row = self._fenced(cur, "release", claim, claim.canceling, **params)
            self._append_marks(cur, claim, row["ledger_sequence"], receipts)
            self._notify(cur, [row["app"]])

        self._transact(work)
