"""The shared store: PostgreSQL, for many workers on many hosts.

Each port operation is one transaction on a pooled psycopg 3 connection. What
makes it safe to share:

* Row locks order deliveries and parking. Every transition of a run begins by
  locking the run's row (the fenced UPDATE, or ``SELECT ... FOR NO KEY
  UPDATE``) and only then reads outcomes and messages, so a ``settle_wait``,
  ``send`` or child's end that commits concurrently with ``park`` is either
  seen by it or finds the run ``waiting`` and wakes it.
* Claims take candidates ``FOR NO KEY UPDATE SKIP LOCKED``, so workers step
  over each other instead of queueing on the first row.
* The database's clock judges leases and deadlines (unless a clock was
  injected), so hosts never compare their clocks.
* A transition that makes a run ready sends ``NOTIFY perdure_ready`` (delivered
  on commit); ``wait_ready`` LISTENs on a dedicated connection.

The URL, the pool, transactions and the listener are in
:mod:`perdure.store.postgres.connection`.

SQL lives in ``postgres/sql/queries.sql``; records become rows and rows
records in :mod:`perdure.store.postgres.rows`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any, Literal, NoReturn

import psycopg
import psycopg.errors

from perdure import errors
from perdure.store import port, sqlfiles
from perdure.store.postgres import connection, rows

log = logging.getLogger("perdure.store.postgres")

Row = connection.Row
Cursor = connection.Cursor

_Q = sqlfiles.queries("postgres")


class _BodyRaised(Exception):
    """Carries what a ``transaction_step`` body raised past the error translation."""

    def __init__(self, original: BaseException) -> None:
        super().__init__(str(original))
        self.original = original


class PostgresStore(connection.Connections):
    """The port on PostgreSQL (see the module docstring)."""

    def __init__(
        self, url: str, *, clock: port.Clock | None = None, ledger_limit: int = 256
    ) -> None:
        """Check ``url``, connect and open the pool; nothing is written.

        Raises:
            errors.InvalidStoreURL: ``url`` is not a usable PostgreSQL URL.
            errors.StoreUnavailable: the server cannot be reached or refuses us.
        """
        if ledger_limit < 1:
            raise errors.InvalidInput(f"ledger_limit must be at least 1, got {ledger_limit}")
        super().__init__(url)
        self._clock = clock
        self._ledger_limit = ledger_limit

    # -- plumbing -------------------------------------------------------------

    def _now(self) -> datetime | None:
        """Return the injected clock's instant, or None to let the server's clock decide."""
        if self._clock is None:
            return None
        now = self._clock.now()
        if now.tzinfo is None:
            raise errors.InvalidInput("the store's clock must return aware datetimes")
        return now

    def _exec(self, cur: Cursor, query: str, **params: Any) -> Cursor:
        """Execute a named query; ``now`` is always passed."""
        return cur.execute(_Q[query], {"now": self._now(), **params})

    def _fenced(
        self, cur: Cursor, query: str, claim: port.Claim, canceling: bool, **params: Any
    ) -> Row:
        """Run a fenced UPDATE; raise StaleClaim or Canceled when it matches nothing."""
        ids = {"run_id": claim.run_id, "generation": claim.generation, "canceling": canceling}
        row = self._exec(cur, query, **ids, **params).fetchone()
        if row is None:
            self._lost(cur, claim, canceling)
        return row

    def _lost(self, cur: Cursor, claim: port.Claim, canceling: bool) -> NoReturn:
        found = self._exec(cur, "fence_state", run_id=claim.run_id).fetchone()
        if found is None or found["generation"] != claim.generation or canceling:
            raise errors.StaleClaim(claim.run_id)
        if found["cancel_requested"]:
            raise errors.Canceled(claim.run_id)
        raise errors.StaleClaim(claim.run_id)

    def _append(self, cur: Cursor, receipts: Sequence[rows.Receipt]) -> None:
        """Append numbered receipts, keeping only the newest ``ledger_limit`` of each run."""
        if receipts:
            arrays = rows.arrays(receipts, rows.RECEIPT_ARRAYS)
            self._exec(cur, "ledger_append", ledger_limit=self._ledger_limit, **arrays)

    def _append_marks(
        self, cur: Cursor, claim: port.Claim, last: int, marks: Sequence[port.Mark]
    ) -> None:
        """Append a claimed run's receipts, the last numbered ``last``."""
        self._append(cur, rows.numbered(claim.run_id, last, claim.generation, claim.worker, marks))

    def _notify(self, cur: Cursor, apps: Iterable[str]) -> None:
        self._exec(cur, "notify", apps=sorted(set(apps)))

    def _write_journal(
        self, cur: Cursor, run_id: str, entries: Sequence[port.JournalEntry]
    ) -> None:
        """Write entries, replacing a stored entry only while it is ``started``."""
        if not entries:
            return
        arrays = rows.arrays(entries, rows.ENTRY_ARRAYS)
        written = self._exec(cur, "journal_put", run_id=run_id, **arrays).fetchall()
        taken = sorted({e.position for e in entries} - {row["position"] for row in written})
        if taken:
            raise errors.CorruptState(
                run_id, "journal_position_taken", f"position {taken[0]} holds a recorded entry"
            )

    def _wake(self, cur: Cursor, run_ids: Sequence[str]) -> list[str]:
        """Make the waiting ones of ``run_ids`` queued and announce them."""
        if not run_ids:
            return []
        return self._woken(cur, self._exec(cur, "wake_runs", run_ids=list(run_ids)).fetchall())

    def _woken(self, cur: Cursor, woken: Sequence[Row]) -> list[str]:
        """Append ``woken`` to runs just made queued (rows of a RETURNING) and announce them."""
        receipts = [
            rows.Receipt(r["run_id"], r["ledger_sequence"], "woken", r["generation"], None)
            for r in woken
        ]
        self._append(cur, receipts)
        if woken:
            self._notify(cur, (r["app"] for r in woken))
        return [r["run_id"] for r in woken]

    def _lock_live(self, cur: Cursor, run_id: str) -> port.Run:
        """Lock the run's row; refuse a missing or ended run."""
        row = self._exec(cur, "lock_run", run_id=run_id).fetchone()
        if row is None:
            raise errors.RunNotFound(run_id)
        run = rows.run(row)
        if run.state in port.TERMINAL_STATES:
            raise errors.RunFinished(run_id, run.state)
        return run

    def _end_runs(self, cur: Cursor, ended: Sequence[Row]) -> None:
        """Apply the end-of-run rules to runs that just ended (rows of a RETURNING)."""
        if not ended:
            return
        self._exec(cur, "end_cleanup", run_ids=[r["run_id"] for r in ended])
        children = [r for r in ended if r["parent_id"] is not None]
        if not children:
            return
        # Lock the parents before writing their outcomes, as every delivery does.
        self._exec(cur, "lock_runs", run_ids=sorted({r["parent_id"] for r in children}))
        pairs = {
            "parent_ids": [r["parent_id"] for r in children],
            "names": [f"child:{r['run_id']}" for r in children],
        }
        payloads = [rows.child_payload(r) for r in children]
        self._exec(cur, "child_outcomes_put", payloads=payloads, **pairs)
        self._woken(cur, self._exec(cur, "wake_parents", **pairs).fetchall())

    # -- lifecycle ------------------------------------------------------------

    def migrate(self) -> None:
        """Create or upgrade the schema under an advisory lock; safe when processes race.

        Raises:
            errors.SchemaTooNew: the stored schema is newer than this code.
        """
        migrations = sqlfiles.migrations("postgres")
        latest = migrations[-1].version if migrations else 0

        def work(cur: Cursor) -> None:
            cur.execute(_Q["migrate_lock"])
            cur.execute(_Q["migrate_prepare"])
            row = cur.execute(_Q["schema_version"]).fetchone()
            current = int(row["version"]) if row else 0
            if current > latest:
                raise errors.SchemaTooNew(
                    f"the store's schema is version {current} but this perdure knows up to "
                    f"{latest}; upgrade perdure"
                )
            for migration in migrations[current:]:
                cur.execute(migration.sql)
                cur.execute(_Q["record_migration"], {"version": migration.version})
                log.info("store %s: applied migration %s", self.url, migration.name)

        self._transact(work)

    def now(self) -> datetime:
        """Return the injected clock's time, else the database server's."""
        injected = self._now()
        if injected is not None:
            return injected
        row = self._transact(lambda cur: cur.execute(_Q["clock"]).fetchone(), single=True)
        assert row is not None
        return rows.instant(row, "now", None, "clock")

    def notify_ready(self) -> None:
        """Wake every ``wait_ready`` caller of this store, here and on other hosts."""
        with self._wake_cond:
            self._wakes += 1
            self._wake_cond.notify_all()
        try:
            self._transact(lambda cur: self._notify(cur, [""]))
        except errors.StoreError as exc:
            # Waiters elsewhere still poll; the local ones are awake already.
            log.warning("cannot notify through the store %s: %s", self.url, exc)

    # -- runs -----------------------------------------------------------------

    def create_run(
        self, new: port.NewRun, journal: Sequence[port.JournalEntry] = ()
    ) -> tuple[port.Run, bool]:
        """Create a queued run, or return the one stored under ``(app, key)``.

        A fork's copied ``journal`` is written with the run, only when created.
        """
        entries = rows.checked_entries(new.run_id, journal)

        def work(cur: Cursor) -> tuple[port.Run, bool]:
            row = self._exec(cur, "create_run", **vars(new)).fetchone()
            if row is not None:
                self._write_journal(cur, new.run_id, entries)
                self._notify(cur, [new.app])
                return rows.run(row), True
            if new.key is not None:
                found = self._exec(cur, "runs_by_key", apps=[new.app], keys=[new.key]).fetchone()
            else:
                found = self._exec(cur, "run_by_id", run_id=new.run_id).fetchone()
            if found is None:
                raise errors.StoreError(f"run {new.run_id} was neither created nor found")
            return rows.run(found), False

        return self._transact(work)

    def create_children(self, claim: port.Claim, children: Sequence[port.NewRun]) -> list[port.Run]:
        """Create the claimed run's children in one statement (fenced)."""
        for child in children:
            if child.key is None or child.parent_id not in (None, claim.run_id):
                raise errors.InvalidInput(
                    f"child run {child.run_id} needs a key and {claim.run_id} as its parent"
                )
        arrays = rows.arrays(children, rows.CHILD_ARRAYS)

        def work(cur: Cursor) -> list[port.Run]:
            self._fenced(cur, "fence_touch", claim, claim.canceling, receipts=0)
            if not children:
                return []
            created = self._exec(cur, "create_children", parent_id=claim.run_id, **arrays)
            apps = [r["app"] for r in created.fetchall()]
            if apps:
                self._notify(cur, apps)
            found = self._exec(cur, "runs_by_key", apps=arrays["apps"], keys=arrays["keys"])
            children_rows = found.fetchall()
            if len(children_rows) != len(children):
                raise errors.StoreError(
                    f"run {claim.run_id}: a child was neither created nor found"
                )
            return [rows.run(r) for r in children_rows]

        return self._transact(work)

    def get_run(self, run_id: str) -> port.Run | None:
        """Return the run, or None."""
        row = self._transact(
            lambda cur: self._exec(cur, "run_by_id", run_id=run_id).fetchone(), single=True
        )
        return None if row is None else rows.run(row)

    def list_runs(
        self, app: str, *, state: str | None = None, workflow: str | None = None, limit: int = 100
    ) -> list[port.Run]:
        """Return the app's runs, newest first."""
        params = {"app": app, "state": state, "workflow": workflow, "limit": max(0, limit)}
        found = self._transact(
            lambda cur: self._exec(cur, "list_runs", **params).fetchall(), single=True
        )
        return [rows.run(r) for r in found]

    def child_counts(self, run_id: str) -> dict[str, int]:
        """Return how many children of the run are in each state."""
        found = self._transact(
            lambda cur: self._exec(cur, "child_counts", run_id=run_id).fetchall(), single=True
        )
        for row in found:
            if row["state"] not in port.RUN_STATES:
                raise errors.CorruptState(
                    None, "run_state", f"a child of {run_id} is {row['state']!r}"
                )
        return {row["state"]: int(row["n"]) for row in found}

    def journal(self, run_id: str) -> list[port.JournalEntry]:
        """Return the run's journal ordered by position."""
        found = self._transact(
            lambda cur: self._exec(cur, "journal", run_id=run_id).fetchall(), single=True
        )
        return [rows.entry(r) for r in found]

    def history(self, run_id: str) -> list[port.LedgerEntry]:
        """Return the run's retained ledger, oldest first.

        Gaps and counts are judged by the engine's validation, which names them.
        """
        found = self._transact(
            lambda cur: self._exec(cur, "history", run_id=run_id).fetchall(), single=True
        )
        return [rows.receipt(row) for row in found]

    # -- claims ---------------------------------------------------------------

    def claim(
        self,
        app: str,
        worker: str,
        workflows: Sequence[tuple[str, str]],
        *,
        lease_ttl: float,
        limit: int = 1,
    ) -> list[port.Claimed]:
        """Claim up to ``limit`` ready runs; a run whose rows fail validation is left untouched."""
        if lease_ttl <= 0:
            raise errors.InvalidInput(f"lease_ttl must be positive, got {lease_ttl}")
        if limit < 1 or not workflows:
            return []
        params: dict[str, Any] = {
            "app": app,
            "worker": worker,
            "workflows": [w for w, _ in workflows],
            "versions": [v for _, v in workflows],
            "lease_ttl": float(lease_ttl),
            "limit": limit,
            "ledger_limit": self._ledger_limit,
        }

        def work(cur: Cursor) -> list[port.Claimed]:
            exclude: list[str] = []
            while True:
                try:
                    with cur.connection.transaction():  # a savepoint
                        return self._claim_once(cur, exclude=exclude, **params)
                except errors.CorruptState as exc:
                    # Claiming that run again would fail again and starve the others.
                    if exc.run_id is None or exc.run_id in exclude:
                        raise
                    log.error("claim sets run %s aside: %s", exc.run_id, exc)
                    exclude.append(exc.run_id)
                    self._quarantine(cur, exc)

        return self._transact(work)

    def _quarantine(self, cur: Cursor, exc: errors.CorruptState) -> None:
        """Make an unreadable run needs_attention (and say so in its ledger)."""
        assert exc.run_id is not None
        error = {"code": exc.code, "message": str(exc), "invariant": exc.invariant}
        row = self._exec(cur, "quarantine", run_id=exc.run_id, error=json.dumps(error)).fetchone()
        # A sequence that was already broken gets no receipt: numbering one
        # from it would only add another broken row.
        if row is None or not isinstance(row["ledger_sequence"], int) or row["ledger_sequence"] < 1:
            return
        generation = row["generation"] if isinstance(row["generation"], int) else 0
        note = f"set aside: {exc.invariant}"
        receipt = rows.Receipt(
            exc.run_id, row["ledger_sequence"], "finished", max(0, generation), None, note=note
        )
        self._append(cur, [receipt])

    def _claim_once(self, cur: Cursor, **params: Any) -> list[port.Claimed]:
        claimed = self._exec(cur, "claim", **params).fetchall()
        if not claimed:
            return []
        for row in claimed:
            # The claim overwrote these columns: judge the values it found.
            prior = row["prior_generation"]
            if not isinstance(prior, int) or prior < 0:
                raise errors.CorruptState(row["run_id"], "run_generation", f"generation {prior!r}")
            worker = row["prior_worker"]
            if worker is not None and (
                not isinstance(worker, str) or not port.WORKER_ID.match(worker)
            ):
                raise errors.CorruptState(row["run_id"], "run_worker_id", f"worker {worker!r}")
        run_ids = [r["run_id"] for r in claimed]
        journals: dict[str, list[port.JournalEntry]] = {}
        for row in self._exec(cur, "journals", run_ids=run_ids).fetchall():
            journals.setdefault(row["run_id"], []).append(rows.entry(row))
        outcomes: dict[str, list[port.Outcome]] = {}
        for row in self._exec(cur, "outcomes_of_runs", run_ids=run_ids).fetchall():
            outcomes.setdefault(row["run_id"], []).append(rows.outcome(row))
        result = []
        for row in claimed:
            run = rows.run(row)
            assert run.worker is not None and run.lease_expires_at is not None
            claim = port.Claim(run.run_id, run.worker, run.generation, run.lease_expires_at)
            journal = journals.get(run.run_id, [])
            recovered = row["prior_state"] == "running"
            result.append(
                port.Claimed(claim, run, journal, outcomes.get(run.run_id, []), recovered)
            )
        return result

    def renew(self, claim: port.Claim, *, lease_ttl: float) -> port.Claim:
        """Extend the lease to now + ``lease_ttl`` (fenced)."""
        if lease_ttl <= 0:
            raise errors.InvalidInput(f"lease_ttl must be positive, got {lease_ttl}")

        def work(cur: Cursor) -> port.Claim:
            row = self._fenced(cur, "renew", claim, claim.canceling, lease_ttl=float(lease_ttl))
            expires = rows.instant(row, "lease_expires_at", claim.run_id, "run")
            return replace(claim, lease_expires_at=expires)

        return self._transact(work)

    def release(
        self, claim: port.Claim, *, delay: float, failed: bool, marks: Sequence[port.Mark] = ()
    ) -> None:
        """Give the run back as queued, claimable after ``delay`` seconds (fenced)."""
        receipts = [*rows.checked_marks(marks), port.Mark("released")]
        params = {"delay": float(max(0.0, delay)), "failed": failed, "receipts": len(receipts)}

        def work(cur: Cursor) -> None:
            row = self._fenced(cur, "release", claim, claim.canceling, **params)
            self._append_marks(cur, claim, row["ledger_sequence"], receipts)
            self._notify(cur, [row["app"]])

        self._transact(work)

    # -- journal --------------------------------------------------------------

    def _record(
        self,
        claim: port.Claim,
        fence: str,
        entries: Sequence[port.JournalEntry],
        marks: Sequence[port.Mark],
    ) -> None:
        entries = rows.checked_entries(claim.run_id, entries)
        marks = rows.checked_marks(marks)
        params = {
            "run_id": claim.run_id,
            "generation": claim.generation,
            "worker": claim.worker,
            "canceling": claim.canceling,
            "reset": fence == "fence_step",
            "receipts": len(marks),
            "entries": len(entries),
            "ledger_limit": self._ledger_limit,
            **rows.arrays(entries, rows.ENTRY_ARRAYS),
            "mark_kinds": [m.kind for m in marks],
            "mark_steps": [m.step for m in marks],
            "mark_digests": [m.digest for m in marks],
            "mark_notes": [m.note for m in marks],
        }
        try:
            row = self._transact(
                lambda cur: self._exec(cur, "record_step", **params).fetchone(), single=True
            )
        except errors.StoreError as exc:
            if isinstance(exc.__cause__, psycopg.errors.RaiseException):
                raise errors.CorruptState(
                    claim.run_id, "journal_position_taken", "a position holds a recorded entry"
                ) from None
            raise
        if row is None:
            self._transact(lambda cur: self._lost(cur, claim, claim.canceling))

    def begin_effect(
        self,
        claim: port.Claim,
        entries: Sequence[port.JournalEntry],
        marks: Sequence[port.Mark] = (),
    ) -> None:
        """Record that a ``once`` effect starts, with any buffered entries before it (fenced)."""
        self._record(claim, "fence_touch", entries, marks)

    def finish_step(
        self,
        claim: port.Claim,
        entries: Sequence[port.JournalEntry],
        marks: Sequence[port.Mark] = (),
    ) -> None:
        """Record step outcomes (fenced); resets ``failures`` to 0."""
        self._record(claim, "fence_step", entries, marks)

    def transaction_step(
        self,
        claim: port.Claim,
        entries: Sequence[port.JournalEntry],
        body: Callable[[Any], port.JournalEntry],
        marks: Sequence[port.Mark] = (),
    ) -> port.JournalEntry:
        """Run ``body(connection)`` in the transaction that records its entry (fenced first).

        The connection is psycopg's, inside the transaction: ``body`` must not
        commit or roll back.
        """
        buffered = list(entries)
        marks = rows.checked_marks(marks)

        def work(cur: Cursor) -> port.JournalEntry:
            row = self._fenced(cur, "fence_step", claim, claim.canceling, receipts=len(marks))
            try:
                entry = body(cur.connection)
            except BaseException as exc:
                raise _BodyRaised(exc) from exc
            self._write_journal(
                cur, claim.run_id, rows.checked_entries(claim.run_id, [*buffered, entry])
            )
            self._append_marks(cur, claim, row["ledger_sequence"], marks)
            return entry

        try:
            return self._transact(work, retry=False)  # body is the caller's code: run it once
        except _BodyRaised as raised:
            raise raised.original from None

    def park(
        self,
        claim: port.Claim,
        entries: Sequence[port.JournalEntry],
        waits: Sequence[port.WaitSpec],
        *,
        wake_at: datetime | None,
        marks: Sequence[port.Mark] = (),
    ) -> bool:
        """Write entries, register waits and make the run waiting unless a wait is already met."""
        entries = rows.checked_entries(claim.run_id, entries)
        marks = rows.checked_marks(marks)
        arrays = rows.arrays(waits, rows.WAIT_ARRAYS)
        if len(set(arrays["names"])) != len(waits):
            raise errors.InvalidInput(f"run {claim.run_id} registers a wait twice")
        instants = [w.deadline for w in waits if w.deadline is not None]
        instants += [wake_at] if wake_at is not None else []
        if any(i.tzinfo is None for i in instants):
            raise errors.InvalidInput("deadlines and wake_at must be aware datetimes")
        ready_at = min(instants) if instants else None

        def work(cur: Cursor) -> bool:
            # The fence takes the row lock before outcomes and messages are read.
            row = self._fenced(cur, "fence_touch", claim, claim.canceling, receipts=len(marks))
            self._write_journal(cur, claim.run_id, entries)
            self._exec(cur, "waits_register", run_id=claim.run_id, app=row["app"], **arrays)
            met = self._exec(cur, "park_satisfied", run_id=claim.run_id, ready_at=ready_at)
            if met.fetchone() == {"satisfied": True}:
                self._append_marks(cur, claim, row["ledger_sequence"], marks)
                return False
            parked = self._exec(cur, "park_run", run_id=claim.run_id, ready_at=ready_at).fetchone()
            assert parked is not None
            receipts = [*marks, port.Mark("parked")]
            self._append_marks(cur, claim, parked["ledger_sequence"], receipts)
            return True

        return self._transact(work)

    def finish(
        self,
        claim: port.Claim,
        entries: Sequence[port.JournalEntry],
        *,
        state: port.RunState,
        result: str | None = None,
        error: str | None = None,
        marks: Sequence[port.Mark] = (),
    ) -> None:
        """End the run in a terminal ``state`` (fenced); all but needs_attention end it for good."""
        if state not in port.TERMINAL_STATES:
            raise errors.InvalidInput(f"finish needs a terminal state, got {state!r}")
        entries = rows.checked_entries(claim.run_id, entries)
        ending = port.Mark("canceled" if state == "canceled" else "finished")
        receipts = [*rows.checked_marks(marks), ending]
        # The owner may always settle a canceled run, acknowledged or not.
        canceling = claim.canceling or state in ("canceled", "needs_attention")
        params = {"state": state, "result": result, "error": error, "receipts": len(receipts)}

        def work(cur: Cursor) -> None:
            row = self._fenced(cur, "finish", claim, canceling, **params)
            self._write_journal(cur, claim.run_id, entries)
            self._append_marks(cur, claim, row["ledger_sequence"], receipts)
            if state != "needs_attention":
                # A run that needs attention keeps its records until resolve ends it.
                self._end_runs(cur, [row])

        self._transact(work)

    # -- waits, outcomes, channels ----------------------------------------------

    def settle_wait(
        self, run_id: str, name: str, outcome: port.Outcome
    ) -> tuple[port.Outcome, bool]:
        """Create the wait's outcome record if none exists, and wake the run if it waits."""
        if outcome.outcome not in ("signaled", "timed_out", "canceled"):
            raise errors.InvalidInput(f"unknown outcome {outcome.outcome!r}")
        params = {
            "run_id": run_id,
            "name": name,
            "outcome": outcome.outcome,
            "signal_id": outcome.signal_id,
            "payload": outcome.payload,
            "payload_digest": outcome.payload_digest,
        }

        def work(cur: Cursor) -> tuple[port.Outcome, bool]:
            run = self._lock_live(cur, run_id)  # orders this delivery with a concurrent park
            created = self._exec(cur, "outcome_put", **params).fetchone()
            if created is None:
                stored = self._exec(cur, "outcome_get", run_id=run_id, name=name).fetchone()
                if stored is None:
                    raise errors.CorruptState(run_id, "outcome_missing", f"wait {name!r}")
                return rows.outcome(stored), False
            if run.state == "waiting":
                self._wake(cur, [run_id])
            return rows.outcome(created), True

        return self._transact(work)

    def outcomes(self, run_id: str) -> list[port.Outcome]:
        """Return every outcome record of the run."""
        found = self._transact(
            lambda cur: self._exec(cur, "outcomes", run_id=run_id).fetchall(), single=True
        )
        return [rows.outcome(r) for r in found]

    def waits(self, app: str, run_id: str | None = None) -> list[port.WaitRecord]:
        """Return the registered waits that have no outcome, oldest first."""
        query = "waits_of_app" if run_id is None else "waits_of_run"
        found = self._transact(
            lambda cur: self._exec(cur, query, app=app, run_id=run_id).fetchall(), single=True
        )
        return [rows.wait(r) for r in found]

    def wake(self, run_id: str) -> bool:
        """Make a waiting run queued; False if it was not waiting."""
        return bool(self._transact(lambda cur: self._wake(cur, [run_id])))

    def send(self, message: port.NewMessage) -> bool:
        """Store a channel message unless its key exists; wake the run if it waits on it."""
        params = vars(message)

        def work(cur: Cursor) -> bool:
            run = self._lock_live(cur, message.run_id)
            if self._exec(cur, "message_put", **params).fetchone() is None:
                return False
            self._exec(cur, "message_counted", run_id=message.run_id)
            if run.state == "waiting":
                waited = self._exec(cur, "channel_waited", **params).fetchone()
                if waited == {"waited": True}:
                    self._wake(cur, [message.run_id])
            return True

        return self._transact(work)

    def next_message(self, run_id: str, channel: str, after_sequence: int) -> port.Message | None:
        """Return the run's first message on ``channel`` after ``after_sequence``."""
        params = {"run_id": run_id, "channel": channel, "after_sequence": after_sequence}
        row = self._transact(
            lambda cur: self._exec(cur, "next_message", **params).fetchone(), single=True
        )
        return None if row is None else rows.message(row)

    # -- operators ------------------------------------------------------------

    def request_cancel(self, run_id: str) -> bool:
        """Cancel the run and every descendant, in one transaction."""

        def work(cur: Cursor) -> bool:
            if self._exec(cur, "lock_run", run_id=run_id).fetchone() is None:
                raise errors.RunNotFound(run_id)
            seen: set[str] = set()
            ended: list[Row] = []
            receipts: list[rows.Receipt] = []
            # A child committed while this walk waited on a lock is found by
            # the next walk; runs already marked here cannot create more.
            while fresh := sorted(
                {r["run_id"] for r in self._exec(cur, "run_tree", run_id=run_id)} - seen
            ):
                seen.update(fresh)
                for row in self._exec(cur, "lock_runs", run_ids=fresh).fetchall():
                    rows.run(row)  # refuse to cancel through a corrupt run
                self._exec(cur, "cancel_open_waits", run_ids=fresh)
                canceled = self._exec(cur, "cancel_now", run_ids=fresh).fetchall()
                requested = self._exec(cur, "cancel_request", run_ids=fresh).fetchall()
                ended += canceled
                receipts += [
                    rows.Receipt(r["run_id"], r["ledger_sequence"], kind, r["generation"], None)
                    for kind, found in (("canceled", canceled), ("cancel_requested", requested))
                    for r in found
                ]
            self._append(cur, receipts)
            self._end_runs(cur, ended)
            return bool(receipts)

        return self._transact(work)

    def resolve(
        self,
        run_id: str,
        generation: int,
        entry: port.JournalEntry,
        *,
        state: Literal["queued", "failed"],
        error: str | None,
        note: str,
    ) -> None:
        """Settle the ``started`` entry of a needs_attention run, then re-queue or fail it."""
        if state not in ("queued", "failed"):
            raise errors.InvalidInput(f"resolve re-queues or fails a run, not {state!r}")
        (entry,) = rows.checked_entries(run_id, [entry])

        def work(cur: Cursor) -> None:
            row = self._exec(cur, "lock_run", run_id=run_id).fetchone()
            if row is None:
                raise errors.RunNotFound(run_id)
            run = rows.run(row)
            if run.state != "needs_attention" or run.generation != generation:
                raise errors.NotResolvable(
                    f"run {run_id} is {run.state} at generation {run.generation}, "
                    f"not needs_attention at generation {generation}"
                )
            at = {"run_id": run_id, "position": entry.position}
            stored = self._exec(cur, "journal_entry_lock", **at).fetchone()
            if stored is None or stored["status"] != "started":
                raise errors.NotResolvable(f"run {run_id} has no started entry at {entry.position}")
            self._exec(cur, "resolve_entry", **{**vars(entry), **at})
            params = {"run_id": run_id, "generation": generation, "state": state, "error": error}
            resolved = self._exec(cur, "resolve_run", **params).fetchone()
            assert resolved is not None
            last = resolved["ledger_sequence"]
            receipt = rows.Receipt(
                run_id, last, "resolved", generation, None, entry.name, None, note
            )
            self._append(cur, [receipt])
            if state == "queued":
                self._notify(cur, [resolved["app"]])
            else:
                self._end_runs(cur, [resolved])

        self._transact(work)

    def sweep(self) -> int:
        """Time out expired waits, wake due runs and delete records of ended runs."""

        def work(cur: Cursor) -> int:
            expired = [r["run_id"] for r in self._exec(cur, "sweep_expired_runs")]
            timed_out = []
            if expired:
                timed_out = self._exec(cur, "sweep_expire_waits", run_ids=expired).fetchall()
            woken = self._wake(cur, sorted({r["run_id"] for r in timed_out}))
            woken += self._wake(cur, [r["run_id"] for r in self._exec(cur, "sweep_due_runs")])
            orphans = self._exec(cur, "sweep_orphans").fetchone()
            return len(timed_out) + len(woken) + (int(orphans["n"]) if orphans else 0)

        return self._transact(work)
