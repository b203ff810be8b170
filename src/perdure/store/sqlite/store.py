"""The embedded store: one SQLite file shared by the threads and processes of a host.

Every write runs in a ``BEGIN IMMEDIATE`` transaction, so writers of
different processes queue on the database lock (up to the busy timeout)
instead of failing on a lock upgrade, and each sees a state no one else
changes before it commits. Writers of one process share transactions (group
commit, see ``_write`` in :mod:`perdure.store.sqlite.connection`). Reads run
outside transactions: in WAL mode they never block writers.

The SQL lives in ``sqlite/sql/queries.sql`` and is referred to by name; rows
become records in :mod:`perdure.store.sqlite.rows`, which refuses what it
cannot read. ``wait_ready`` is woken by every process of this host that
writes to the file (:mod:`perdure.store.sqlite.wakeup`).
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from typing import Any, Literal

from perdure import errors
from perdure.store import port, sqlfiles
from perdure.store.sqlite import connection, rows, wakeup

# RETURNING arrived in 3.35.
_MIN_SQLITE = (3, 35, 0)


def _statements(script: str) -> Iterator[str]:
    """Split a migration into statements (``executescript`` would commit first)."""
    pending = ""
    for line in script.splitlines(keepends=True):
        pending += line
        if sqlite3.complete_statement(pending):
            yield pending.strip()
            pending = ""
    leftover = [ln for ln in pending.splitlines() if ln.strip() and not ln.strip().startswith("--")]
    if leftover:
        raise ValueError(f"a migration ends with an incomplete statement: {leftover[0]!r}")


def _micros(seconds: float, what: str, *, positive: bool = False) -> int:
    if seconds < 0 or (positive and seconds == 0):
        raise errors.InvalidInput(f"{what} must be {'above' if positive else 'at least'} 0")
    return round(seconds * 1_000_000)


def _json_value(run_id: str, what: str, text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        raise errors.InvalidPayload(f"the {what} of run {run_id} is not JSON") from None


class SqliteStore(connection.Connections):
    """A :class:`port.Store` on one SQLite database file."""

    def __init__(
        self,
        url: str,
        *,
        clock: port.Clock | None = None,
        ledger_limit: int = 256,
    ) -> None:
        """Open (creating if missing) the database file named by ``url``.

        Raises:
            errors.InvalidStoreURL: the URL names no file.
            errors.StoreUnavailable: the file cannot be created or opened.
        """
        if ledger_limit < 1:
            raise errors.InvalidInput(f"ledger_limit must be at least 1, got {ledger_limit}")
        if sqlite3.sqlite_version_info < _MIN_SQLITE:
            raise errors.StoreUnavailable(
                f"the embedded store needs SQLite 3.35 or later; this Python has "
                f"{sqlite3.sqlite_version}."
            )
        super().__init__(url, clock=clock, ledger_limit=ledger_limit)
        self._wakeup = wakeup.Channel(self.path)

    # -- store ------------------------------------------------------------

    def migrate(self) -> None:
        """Create or upgrade the schema; safe when several processes race.

        Raises:
            errors.SchemaTooNew: the stored schema is newer than this code.
        """
        known = sqlfiles.migrations("sqlite")
        with self._write() as tx:
            tx.run("create_schema_table")
            current = tx.rows("schema_version")[0][0]
            if not isinstance(current, int):
                raise errors.CorruptState(None, "perdure_schema.version", repr(current))
            if current > len(known):
                raise errors.SchemaTooNew(
                    f"the SQLite store {self.path} has schema version {current}, but this "
                    f"perdure knows versions up to {len(known)}; upgrade perdure to open it"
                )
            for migration in known[current:]:
                for statement in _statements(migration.sql):
                    tx.conn.execute(statement)
                tx.run("record_migration", version=migration.version)

    def close(self) -> None:
        """Close every idle connection now and busy ones when they return. Idempotent."""
        self._close_connections()
        self._wakeup.close()

    def now(self) -> datetime:
        """Return the store's current time."""
        return self._clock.now()

    def wait_ready(self, timeout: float) -> bool:
        """Block until a run may have become ready on this file, or ``timeout`` passes.

        Any process on this host that writes to the file wakes the waiters
        (see :mod:`perdure.store.sqlite.wakeup`); others are found by polling.
        """
        return self._wakeup.wait(timeout)

    def notify_ready(self) -> None:
        """Wake every ``wait_ready`` caller on this file, in every process of this host."""
        self._wakeup.notify()

    # -- runs -------------------------------------------------------------

    def create_run(
        self, new: port.NewRun, journal: Sequence[port.JournalEntry] = ()
    ) -> tuple[port.Run, bool]:
        """Create a queued run, or return the existing one with the same ``(app, key)``."""
        with self._write() as tx:
            row, created = self._create(tx, new)
            if created:
                self._put_entries(tx, new.run_id, journal)
            run = rows.run(row)
        if created:
            self.notify_ready()
        return run, created

    def create_children(self, claim: port.Claim, children: Sequence[port.NewRun]) -> list[port.Run]:
        """Create child runs of the claimed run in one transaction (fenced)."""
        for child in children:
            if child.key is None:
                raise errors.InvalidInput(f"child run {child.run_id} needs a key")
            if child.parent_id not in (None, claim.run_id):
                raise errors.InvalidInput(
                    f"child run {child.run_id} names parent {child.parent_id}, "
                    f"not the claimed run {claim.run_id}"
                )
        with self._write() as tx:
            self._claimed(tx, claim, "fence_touch", (), ())
            made = [
                self._create(tx, dataclasses.replace(child, parent_id=claim.run_id))
                for child in children
            ]
            found = [rows.run(row) for row, _ in made]
        if any(created for _, created in made):
            self.notify_ready()
        return found

    def _create(self, tx: connection._Tx, new: port.NewRun) -> tuple[sqlite3.Row, bool]:
        created = tx.run("create_run", **vars(new)) == 1
        if created:
            tx.append(new.run_id, 1, [port.Mark("initialized")], 0, None)
            row = tx.one("run_by_id", run_id=new.run_id)
        elif new.key is not None:
            row = tx.one("run_by_key", app=new.app, key=new.key)
        else:
            row = None
        if row is None:
            raise errors.InvalidInput(f"run id {new.run_id!r} is already taken")
        return row, created

    def get_run(self, run_id: str) -> port.Run | None:
        """Return the run, or None."""
        return next((rows.run(row) for row in self._fetch("run_by_id", run_id=run_id)), None)

    def list_runs(
        self,
        app: str,
        *,
        state: str | None = None,
        workflow: str | None = None,
        limit: int = 100,
    ) -> list[port.Run]:
        """Return the app's runs, newest first."""
        found = self._fetch("list_runs", app=app, state=state, workflow=workflow, limit=limit)
        return [rows.run(row) for row in found]

    def child_counts(self, run_id: str) -> dict[str, int]:
        """Return how many children of the run are in each state (states with none are absent)."""
        counts: dict[str, int] = {}
        for row in self._fetch("child_counts", run_id=run_id):
            if row["state"] not in port.RUN_STATES:
                raise errors.CorruptState(
                    None, "runs.state", f"a child of {run_id} has state {row['state']!r}"
                )
            counts[row["state"]] = row["n"]
        return counts

    def journal(self, run_id: str) -> list[port.JournalEntry]:
        """Return the run's journal ordered by position."""
        return [rows.entry(row) for row in self._fetch("journal", run_id=run_id)]

    def history(self, run_id: str) -> list[port.LedgerEntry]:
        """Return the run's retained ledger, oldest first."""
        return [
            rows.receipt(row) for row in self._fetch("history", run_id=run_id, limit=self._limit)
        ]

    # -- claims -----------------------------------------------------------

    def claim(
        self,
        app: str,
        worker: str,
        workflows: Sequence[tuple[str, str]],
        *,
        lease_ttl: float,
        limit: int = 1,
    ) -> list[port.Claimed]:
        """Claim up to ``limit`` ready runs of ``app`` whose (workflow, version) is listed."""
        ttl = _micros(lease_ttl, "lease_ttl", positive=True)
        if limit < 1 or not workflows:
            return []
        wanted = json.dumps([[name, version] for name, version in workflows])
        claimed: list[port.Claimed] = []
        with self._write() as tx:
            lease = tx.now + ttl
            for candidate in tx.rows("claim_candidates", app=app, workflows=wanted, limit=limit):
                tx.conn.execute("SAVEPOINT claim_one")
                try:
                    claimed.append(self._claim_one(tx, candidate, worker, lease))
                except errors.CorruptState as exc:
                    tx.conn.execute("ROLLBACK TO claim_one")
                    error = {"code": exc.code, "message": str(exc), "invariant": exc.invariant}
                    self._quarantine(tx, candidate, error)
                tx.conn.execute("RELEASE claim_one")
        return claimed

    def _quarantine(
        self, tx: connection._Tx, candidate: sqlite3.Row, error: dict[str, Any]
    ) -> None:
        row = tx.one("quarantine", run_id=candidate["run_id"], error=json.dumps(error))
        sequence = row["ledger_sequence"] if row is not None else None
        if isinstance(sequence, int) and sequence > 0:
            generation = candidate["generation"]
            note = f"set aside: {error['invariant']}"
            tx.append(
                candidate["run_id"],
                sequence,
                [port.Mark("finished", note=note)],
                generation if isinstance(generation, int) and generation >= 0 else 0,
                None,
            )

    def _claim_one(
        self, tx: connection._Tx, candidate: sqlite3.Row, worker: str, lease: int
    ) -> port.Claimed:
        recovered = rows.run(candidate).state == "running"
        row = tx.one("claim_run", run_id=candidate["run_id"], worker=worker, lease_expires_at=lease)
        assert row is not None  # the candidate was read under the same lock
        run = rows.run(row)
        journal = [rows.entry(r) for r in tx.rows("journal", run_id=run.run_id)]
        outcomes = [rows.outcome(r) for r in tx.rows("outcomes", run_id=run.run_id)]
        receipt = port.Mark("recovered" if recovered else "claimed")
        tx.append(run.run_id, run.ledger_sequence, [receipt], run.generation, worker)
        claim = port.Claim(run.run_id, worker, run.generation, rows.from_us(lease))
        return port.Claimed(claim, run, journal, outcomes, recovered)

    def renew(self, claim: port.Claim, *, lease_ttl: float) -> port.Claim:
        """Extend the lease to now + ``lease_ttl`` (fenced)."""
        ttl = _micros(lease_ttl, "lease_ttl", positive=True)
        with self._write() as tx:
            lease = tx.now + ttl
            self._claimed(tx, claim, "renew", (), (), lease_expires_at=lease)
        return dataclasses.replace(claim, lease_expires_at=rows.from_us(lease))

    def release(
        self, claim: port.Claim, *, delay: float, failed: bool, marks: Sequence[port.Mark] = ()
    ) -> None:
        """Give the run back as ``queued``, claimable after ``delay`` seconds (fenced)."""
        wait = _micros(delay, "delay")
        receipts = [*marks, port.Mark("released")]
        with self._write() as tx:
            ready_at = tx.now + wait
            self._claimed(tx, claim, "release", (), receipts, ready_at=ready_at, failed=int(failed))
        self.notify_ready()

    def _claimed(
        self,
        tx: connection._Tx,
        claim: port.Claim,
        query: str,
        entries: Sequence[port.JournalEntry],
        receipts: Sequence[port.Mark],
        *,
        canceling: bool | None = None,
        **params: Any,
    ) -> sqlite3.Row:
        """Run the fenced write ``query``, then store ``entries`` and ``receipts``.

        Raises:
            errors.StaleClaim: the write matched nothing because another claim owns the run.
            errors.Canceled: it matched nothing because the run's cancel was requested.
        """
        row = tx.one(
            query,
            run_id=claim.run_id,
            generation=claim.generation,
            canceling=int(claim.canceling if canceling is None else canceling),
            receipts=len(receipts),
            **params,
        )
        if row is None:
            held = tx.one("fence_state", run_id=claim.run_id)
            if held is None:
                raise errors.StaleClaim(claim.run_id, f"run {claim.run_id} no longer exists")
            if held["generation"] != claim.generation or held["state"] != "running":
                raise errors.StaleClaim(
                    claim.run_id,
                    f"run {claim.run_id} is {held['state']} at generation "
                    f"{held['generation']}; this claim holds generation {claim.generation}",
                )
            raise errors.Canceled(claim.run_id, f"run {claim.run_id} was asked to cancel")
        self._put_entries(tx, claim.run_id, entries)
        tx.append(claim.run_id, row["ledger_sequence"], receipts, claim.generation, claim.worker)
        return row

    # -- journal ----------------------------------------------------------

    def begin_effect(
        self,
        claim: port.Claim,
        entries: Sequence[port.JournalEntry],
        marks: Sequence[port.Mark] = (),
    ) -> None:
        """Record that a ``once`` effect starts (fenced)."""
        with self._write() as tx:
            self._claimed(tx, claim, "fence_touch", entries, marks)

    def finish_step(
        self,
        claim: port.Claim,
        entries: Sequence[port.JournalEntry],
        marks: Sequence[port.Mark] = (),
    ) -> None:
        """Record step outcomes and reset ``failures`` (fenced)."""
        with self._write() as tx:
            self._claimed(tx, claim, "fence_step", entries, marks)

    def transaction_step(
        self,
        claim: port.Claim,
        entries: Sequence[port.JournalEntry],
        body: Callable[[Any], port.JournalEntry],
        marks: Sequence[port.Mark] = (),
    ) -> port.JournalEntry:
        """Run ``body(connection)`` inside the transaction that records its entry.

        ``body`` receives the :class:`sqlite3.Connection` inside an open
        transaction; it must neither commit nor roll back.
        """
        with self._write() as tx:
            self._claimed(tx, claim, "fence_step", entries, marks)
            recorded = body(tx.conn)
            self._put_entries(tx, claim.run_id, [recorded])
        return recorded

    def _put_entries(
        self, tx: connection._Tx, run_id: str, entries: Sequence[port.JournalEntry]
    ) -> None:
        for item in entries:
            rows.check_entry(item)
            if tx.run("journal_put", run_id=run_id, **vars(item)) == 0:
                held = tx.one("journal_entry", run_id=run_id, position=item.position)
                status = "an unreadable" if held is None else f"a {held['status']!r}"
                raise errors.CorruptState(
                    run_id,
                    "journal_position_taken",
                    f"position {item.position} already holds {status} entry",
                )

    def park(
        self,
        claim: port.Claim,
        entries: Sequence[port.JournalEntry],
        waits: Sequence[port.WaitSpec],
        *,
        wake_at: datetime | None,
        marks: Sequence[port.Mark] = (),
    ) -> bool:
        """Write ``entries``, register ``waits`` and make the run ``waiting`` unless one is met.

        The waits are registered (replacing the run's earlier registrations)
        whether or not the run parks, so a signal that arrives after a
        registered deadline is still turned into ``timed_out``.
        """
        instants = [w.deadline for w in waits if w.deadline is not None]
        if wake_at is not None:
            instants.append(wake_at)
        ready_at = min(rows.to_us(when) for when in instants) if instants else None
        for spec in waits:
            rows.check_wait_kind(spec.kind)
        with self._write() as tx:
            app = self._claimed(tx, claim, "fence_touch", entries, marks)["app"]
            for spec in waits:
                tx.run(
                    "wait_register",
                    run_id=claim.run_id,
                    name=spec.name,
                    app=app,
                    kind=spec.kind,
                    deadline=rows.opt_us(spec.deadline),
                    after_sequence=spec.after_sequence,
                )
            names = json.dumps([spec.name for spec in waits])
            tx.run("waits_drop_others", run_id=claim.run_id, names=names)
            satisfied = tx.one("park_satisfied", run_id=claim.run_id)
            due = ready_at is not None and ready_at <= tx.now
            parks = not (due or (satisfied is not None and satisfied[0]))
            if parks:
                parked = tx.one("park_run", run_id=claim.run_id, ready_at=ready_at)
                assert parked is not None  # the fence just matched this row
                receipt = [port.Mark("parked")]
                tx.append(
                    claim.run_id, parked["ledger_sequence"], receipt, claim.generation, claim.worker
                )
        return parks

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
        """End the run in a terminal ``state`` (fenced) and run the end-of-run rules."""
        if state not in port.TERMINAL_STATES:
            raise errors.InvalidInput(f"finish needs a terminal state, got {state!r}")
        receipts = [*marks, port.Mark("canceled" if state == "canceled" else "finished")]
        settles_cancel = claim.canceling or state in ("canceled", "needs_attention")
        with self._write() as tx:
            row = self._claimed(
                tx,
                claim,
                "finish",
                entries,
                receipts,
                canceling=settles_cancel,
                state=state,
                result=result,
                error=error,
            )
            # needs_attention may still be resolved back to queued: the run keeps
            # its records and its parent keeps waiting until it really ends.
            woke = state != "needs_attention" and self._end(
                tx, claim.run_id, row["parent_id"], state, result, error
            )
        if woke:
            self.notify_ready()

    def _end(
        self,
        tx: connection._Tx,
        run_id: str,
        parent_id: str | None,
        state: str,
        result: str | None,
        error: str | None,
    ) -> bool:
        """Apply the end-of-run rules; return whether the parent was woken."""
        for query in ("end_waits", "end_outcomes", "end_messages"):
            tx.run(query, run_id=run_id)
        if parent_id is None:
            return False
        payload = {
            "run_id": run_id,
            "state": state,
            "result": _json_value(run_id, "result", result),
            "error": _json_value(run_id, "error", error),
        }
        name = f"child:{run_id}"
        if not tx.run(
            "child_outcome_put", parent_id=parent_id, name=name, payload=json.dumps(payload)
        ):
            return False
        return self._wake(tx, parent_id, "wake_on_wait", name=name)

    def _wake(self, tx: connection._Tx, run_id: str, query: str = "wake", **params: Any) -> bool:
        row = tx.one(query, run_id=run_id, **params)
        if row is None:
            return False
        tx.append(run_id, row["ledger_sequence"], [port.Mark("woken")], row["generation"], None)
        return True

    # -- waits, outcomes, channels ----------------------------------------

    def _live(self, tx: connection._Tx, run_id: str) -> port.Run:
        row = tx.one("run_by_id", run_id=run_id)
        if row is None:
            raise errors.RunNotFound(run_id)
        run = rows.run(row)
        if run.state in port.TERMINAL_STATES:
            raise errors.RunFinished(run_id, run.state)
        return run

    def settle_wait(
        self, run_id: str, name: str, outcome: port.Outcome
    ) -> tuple[port.Outcome, bool]:
        """Create the wait's outcome record if none exists (put-if-absent).

        The record is stored under ``run_id`` and ``name`` at the store's
        time; ``outcome.run_id``, ``outcome.name`` and ``outcome.at`` are not used.
        """
        rows.check_outcome_kind(outcome.outcome)
        kind = outcome.outcome
        put = {k: getattr(outcome, k) for k in ("signal_id", "payload", "payload_digest")}
        with self._write() as tx:
            self._live(tx, run_id)
            if kind == "signaled":
                held = tx.one("wait_get", run_id=run_id, name=name)
                deadline = None if held is None else rows.wait(held).deadline
                if deadline is not None and rows.to_us(deadline) <= tx.now:
                    kind, put = "timed_out", dict.fromkeys(put)
            created = tx.run("outcome_put", **put, run_id=run_id, name=name, outcome=kind) == 1
            stored = tx.one("outcome_get", run_id=run_id, name=name)
            assert stored is not None  # just put, under the same lock
            settled = rows.outcome(stored)
            woke = created and self._wake(tx, run_id)
        if woke:
            self.notify_ready()
        return settled, created

    def outcomes(self, run_id: str) -> list[port.Outcome]:
        """Return every outcome record of the run."""
        return [rows.outcome(row) for row in self._fetch("outcomes", run_id=run_id)]

    def waits(self, app: str, run_id: str | None = None) -> list[port.WaitRecord]:
        """Return the registered waits that have no outcome, oldest first."""
        if run_id is None:
            found = self._fetch("waits_of_app", app=app)
        else:
            found = self._fetch("waits_of_run", app=app, run_id=run_id)
        return [rows.wait(row) for row in found]

    def wake(self, run_id: str) -> bool:
        """Make a ``waiting`` run ``queued``; False if it was not waiting."""
        with self._write() as tx:
            woke = self._wake(tx, run_id)
        if woke:
            self.notify_ready()
        return woke

    def send(self, message: port.NewMessage) -> bool:
        """Store a channel message unless ``(run_id, channel, key)`` exists; wake a waiting run."""
        with self._write() as tx:
            self._live(tx, message.run_id)
            stored = tx.run("message_put", **vars(message)) == 1
            woke = False
            if stored:
                tx.run("message_counted", run_id=message.run_id)
                woke = self._wake(tx, message.run_id, "wake_on_channel", channel=message.channel)
        if woke:
            self.notify_ready()
        return stored

    def next_message(self, run_id: str, channel: str, after_sequence: int) -> port.Message | None:
        """Return the run's first message on ``channel`` with a greater sequence."""
        found = self._fetch(
            "next_message", run_id=run_id, channel=channel, after_sequence=after_sequence
        )
        return rows.message(found[0]) if found else None

    # -- operators --------------------------------------------------------

    def request_cancel(self, run_id: str) -> bool:
        """Cancel the run and every descendant; return True if anything changed.

        Runs canceled at once lose their waits and outcomes to the end-of-run
        rules in this same transaction, so no ``canceled`` outcome is written
        for their open waits: it could never be read.
        """
        with self._write() as tx:
            tree = [rows.run(row) for row in tx.rows("run_tree", run_id=run_id)]
            if not any(run.run_id == run_id for run in tree):
                raise errors.RunNotFound(run_id)
            ended: list[port.Run] = []
            requested = False
            for run in tree:
                if run.state in ("queued", "waiting"):
                    query, receipt = "cancel_now", "canceled"
                    ended.append(run)
                elif run.state == "running" and not run.cancel_requested:
                    query, receipt = "cancel_request", "cancel_requested"
                    requested = True
                    tx.run("cancel_open_waits", run_id=run.run_id)
                else:
                    continue
                row = tx.one(query, run_id=run.run_id)
                assert row is not None  # read under the same lock
                tx.append(
                    run.run_id, row["ledger_sequence"], [port.Mark(receipt)], run.generation, None
                )
            # Every cancel is stored before any parent outcome, so a parent
            # canceled in this call receives none.
            woke = False
            for run in ended:
                woke = self._end(tx, run.run_id, run.parent_id, "canceled", None, None) or woke
        if woke:
            self.notify_ready()
        return requested or bool(ended)

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
        """Settle the ambiguous entry of a ``needs_attention`` run.

        Raises:
            errors.RunNotFound: no such run.
            errors.NotResolvable: the run is not in ``needs_attention`` at
                ``generation``, or its entry at ``entry.position`` is not a
                ``started`` entry named ``entry.name``.
        """
        if state not in ("queued", "failed"):
            raise errors.InvalidInput(f"resolve re-queues or fails a run, not {state!r}")
        rows.check_entry(entry)
        with self._write() as tx:
            row = tx.one("run_by_id", run_id=run_id)
            if row is None:
                raise errors.RunNotFound(run_id)
            run = rows.run(row)
            if run.state != "needs_attention" or run.generation != generation:
                raise errors.NotResolvable(
                    f"run {run_id} is {run.state} at generation {run.generation}, "
                    f"not needs_attention at generation {generation}"
                )
            held = tx.one("journal_entry", run_id=run_id, position=entry.position)
            current = None if held is None else rows.entry(held)
            if current is None or current.status != "started" or current.name != entry.name:
                raise errors.NotResolvable(
                    f"run {run_id} has no started entry {entry.name!r} at position {entry.position}"
                )
            tx.run("resolve_entry", run_id=run_id, **vars(entry))
            failed = state == "failed"
            row = tx.one(
                "resolve_run",
                run_id=run_id,
                generation=generation,
                state=state,
                error=error if failed else None,
            )
            assert row is not None  # checked above under the same lock
            receipt = port.Mark("resolved", step=entry.name, note=note)
            tx.append(run_id, row["ledger_sequence"], [receipt], generation, None)
            woke = failed and self._end(tx, run_id, row["parent_id"], "failed", None, error)
        if not failed or woke:
            self.notify_ready()

    def sweep(self) -> int:
        """Time out expired waits, re-queue due waiting runs, drop records of ended runs."""
        with self._write() as tx:
            changed = tx.run("sweep_expire_waits")
            woken = tx.rows("sweep_wake_due")
            for row in woken:
                receipt = [port.Mark("woken")]
                tx.append(row["run_id"], row["ledger_sequence"], receipt, row["generation"], None)
            for query in ("sweep_orphan_waits", "sweep_orphan_outcomes", "sweep_orphan_messages"):
                changed += tx.run(query)
        if woken:
            self.notify_ready()
        return changed + len(woken)
