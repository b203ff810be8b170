"""The claim of a warm-parked run by key on PostgreSQL, in one statement (``claim_warm``).

A mixin of :class:`~perdure.store.postgres.store.PostgresStore`. The statement
(``claim_warm`` in ``postgres/sql/queries.sql``) claims the run at the
generation its worker parked it with, only if its row is the version the
statement's snapshot saw and only if the held journal's ``started`` tail is
the stored one, writes the receipt and returns the outcomes the worker does
not hold, as arrays: one round trip, and nothing read back.
It reads no updates ahead (``Claimed.updates``): a lateral read of them in
the statement cost more to plan, on every call, than the read it spared.
``claim_answering`` sends it with the answer of the update that woke the run
(``answer_alone``), both in one pipeline: one transaction, one commit.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from psycopg.rows import dict_row

from perdure.store import claiming, port, rows, transitions
from perdure.store.postgres import bridge, connection

Cursor = connection.Cursor


class WarmClaimTransitions(claiming.ClaimTransitions[Cursor]):
    """``_claim_warm`` for PostgreSQL (see the module docstring)."""

    if TYPE_CHECKING:

        def _alone_params(
            self,
            claim: port.Claim,
            entries: Sequence[port.JournalEntry],
            marks: Sequence[port.Mark],
            **extra: Any,
        ) -> dict[str, Any]: ...

        def _position_taken(self, run_id: str) -> AbstractContextManager[None]: ...

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
        """One autocommit statement: the claim, its receipt, its outcomes, the held tail compared.

        The held journal's ``started`` tail (see :meth:`_unchanged`) is
        compared with the stored one inside the claim, which is not made when
        they differ, and the outcomes come with it: nothing is read back.
        """
        params = self._warm_params(app, worker, workflows, run_id, known, ttl, dry_run)

        def work(cur: Cursor) -> port.Claimed | None:
            return self._warm_claimed(self._exec(cur, "claim_warm", **params).fetchone(), known)

        # Not retried when the connection is lost: the claim may have committed,
        # and then its lease lapses and the run is recovered as any other.
        return self._transact(work, single=True)

    def claim_answering(
        self,
        app: str,
        worker: str,
        workflows: Sequence[tuple[str, str]],
        *,
        run_id: str,
        known: port.KnownJournal,
        lease_ttl: float,
        dry_run: bool,
        entries: Sequence[port.JournalEntry],
        update_id: str,
        response: str,
        marks: Sequence[port.Mark] = (),
    ) -> tuple[port.Claimed | None, bool]:
        """``claim_warm`` and then ``answer_alone`` under its claim, in one transaction.

        Both statements go in one pipeline with one Sync: the server runs
        them as one implicit transaction, one round trip and one commit, and
        a failure of either rolls both back.
        """
        ttl = transitions.seconds(lease_ttl, "lease_ttl", positive=True)
        if not workflows:
            return None, False
        claim_params = self._warm_params(app, worker, workflows, run_id, known, ttl, dry_run)
        # The claim this transaction makes; the answer's fence reads no lease.
        expected = port.Claim(
            run_id, worker, known.generation + 1, datetime.min.replace(tzinfo=UTC)
        )
        answer_params = self._alone_params(
            expected, entries, marks, update_id=update_id, response=response
        )

        def work(cur: Cursor) -> tuple[port.Claimed | None, bool]:
            if bridge.bridged():
                # An event loop's connection (no worker thread runs there):
                # the same two statements, in turn, in the transaction.
                claimed = self._exec(cur, "claim_warm", **claim_params).fetchone()
                answered = self._exec(cur, "answer_alone", **answer_params).fetchone()
            else:
                with (
                    cur.connection.pipeline() as pipeline,
                    cur.connection.cursor(row_factory=dict_row) as second,
                ):
                    self._exec(cur, "claim_warm", **claim_params)
                    self._exec(second, "answer_alone", **answer_params)
                    pipeline.sync()
                    claimed, answered = cur.fetchone(), second.fetchone()
            return self._warm_claimed(claimed, known), answered is not None

        with self._position_taken(run_id):
            # Not retried when the connection is lost, as claim_warm is not.
            return self._transact(work, single=not bridge.bridged())

    def _warm_params(
        self,
        app: str,
        worker: str,
        workflows: Sequence[tuple[str, str]],
        run_id: str,
        known: port.KnownJournal,
        ttl: float,
        dry_run: bool,
    ) -> dict[str, Any]:
        held = list(known.journal)
        first = next((i for i, e in enumerate(held) if e.status == "started"), None)
        tail = held[first:] if first is not None else []
        return {
            "app": app,
            "worker": worker,
            "run_id": run_id,
            "generation": known.generation,
            "workflows": [w for w, _ in workflows],
            "versions": [v for _, v in workflows],
            "lease_ttl": ttl,
            "dry_run": dry_run,
            "after": None if first is None else held[first].position - 1,
            "tail_positions": [e.position for e in tail],
            "tail_kinds": [e.kind for e in tail],
            "tail_names": [e.name for e in tail],
            "tail_statuses": [e.status for e in tail],
            "tail_outputs": [e.output for e in tail],
            "tail_errors": [e.error for e in tail],
            "tail_attempts": [e.attempt for e in tail],
            "known_outcomes": sorted(known.outcomes),
        }

    def _warm_claimed(self, row: rows.Row | None, known: port.KnownJournal) -> port.Claimed | None:
        """The claim claim_warm returned (None: not claimed), with the journal its worker holds."""
        if row is None:
            return None
        run = self.read.run(row)
        assert run.worker is not None and run.lease_expires_at is not None
        claim = port.Claim(run.run_id, run.worker, run.generation, run.lease_expires_at)
        return port.Claimed(claim, run, list(known.journal), self._settled_of(row), False)

    def _settled_of(self, row: rows.Row) -> list[port.Outcome]:
        """The outcomes claim_warm returned as arrays, one column each, in their order."""
        names = row["outcome_names"] or []
        columns = ("outcome_kinds", "outcome_signal_ids", "outcome_payloads")
        kinds, signal_ids, payloads = (row[c] or [] for c in columns)
        digests, ats = row["outcome_digests"] or [], row["outcome_ats"] or []
        return [
            self.read.outcome(
                {
                    "run_id": row["run_id"],
                    "name": name,
                    "outcome": kind,
                    "signal_id": signal_id,
                    "payload": payload,
                    "payload_digest": digest,
                    "at": at,
                }
            )
            for name, kind, signal_id, payload, digest, at in zip(
                names, kinds, signal_ids, payloads, digests, ats, strict=True
            )
        ]
