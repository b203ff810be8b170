"""The claim of a warm-parked run by key on PostgreSQL, in one statement (``claim_warm``).

A mixin of :class:`~perdure.store.postgres.store.PostgresStore`. The statement
(``claim_warm`` in ``postgres/sql/queries.sql``) claims the run at the
generation its worker parked it with, only if its row is the version the
statement's snapshot saw and only if the held journal's ``started`` tail is
the stored one, writes the receipt and returns the outcomes the worker does
not hold, as arrays: one round trip, and nothing read back.
It reads no updates ahead (``Claimed.updates``): a lateral read of them in
the statement cost more to plan, on every call, than the read it spared.
"""

from __future__ import annotations

from collections.abc import Sequence

from perdure.store import claiming, port, rows
from perdure.store.postgres import connection

Cursor = connection.Cursor


class WarmClaimTransitions(claiming.ClaimTransitions[Cursor]):
    """``_claim_warm`` for PostgreSQL (see the module docstring)."""

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
        held = list(known.journal)
        first = next((i for i, e in enumerate(held) if e.status == "started"), None)
        tail = held[first:] if first is not None else []

        def work(cur: Cursor) -> port.Claimed | None:
            row = self._exec(
                cur,
                "claim_warm",
                app=app,
                worker=worker,
                run_id=run_id,
                generation=known.generation,
                workflows=[w for w, _ in workflows],
                versions=[v for _, v in workflows],
                lease_ttl=ttl,
                dry_run=dry_run,
                after=None if first is None else held[first].position - 1,
                tail_positions=[e.position for e in tail],
                tail_kinds=[e.kind for e in tail],
                tail_names=[e.name for e in tail],
                tail_statuses=[e.status for e in tail],
                tail_outputs=[e.output for e in tail],
                tail_errors=[e.error for e in tail],
                tail_attempts=[e.attempt for e in tail],
                known_outcomes=sorted(known.outcomes),
            ).fetchone()
            if row is None:
                return None
            run = self.read.run(row)
            assert run.worker is not None and run.lease_expires_at is not None
            claim = port.Claim(run_id, run.worker, run.generation, run.lease_expires_at)
            return port.Claimed(claim, run, held, self._settled_of(row), False)

        # Not retried when the connection is lost: the claim may have committed,
        # and then its lease lapses and the run is recovered as any other.
        return self._transact(work, single=True)

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
