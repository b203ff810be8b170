"""The embedded store: one SQLite file shared by the threads and processes of a host.

Every write runs in a ``BEGIN IMMEDIATE`` transaction, so writers of
different processes queue on the database lock (up to the busy timeout)
instead of failing on a lock upgrade, and each sees a state no one else
changes before it commits. Writers of one process share transactions (group
commit, see ``_write`` in :mod:`perdure.store.sqlite.connection`). Reads run
outside transactions: in WAL mode they never block writers.

Most operations are written once, over named queries, in
:mod:`perdure.store.transitions`; this module holds what SQLite does its own
way. It is the PostgreSQL store's twin: the same helpers and the same named
queries (``sqlite/sql/queries.sql``, listed in ``docs/store.md``) in the same
order, so that a fix in one shows where it belongs in the other.
``wait_ready`` is woken by every process of this host that writes to the file
(:mod:`perdure.store.sqlite.wakeup`).
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from perdure import errors
from perdure.store import (
    appschema,
    census,
    chaining,
    claiming,
    control,
    ledger,
    live,
    liveport,
    overview,
    owners,
    planning,
    port,
    queueing,
    rows,
    scheduling,
    sqlfiles,
    surface,
    waiting,
    warmport,
)
from perdure.store.sqlite import connection, wakeup

Row = sqlite3.Row
Cursor = connection.Tx

# RETURNING arrived in 3.35.
_MIN_SQLITE = (3, 35, 0)


class _Poll:
    """A watch that wakes after a short pause: a watcher with no socket polls."""

    def wait(self, timeout: float) -> bool:
        time.sleep(max(0.0, min(timeout, 0.05)))
        return True


class SqliteStore(
    connection.Connections,
    chaining.ChainTransitions[Cursor],
    planning.PlanTransitions[Cursor],
    surface.SurfaceTransitions[Cursor],
    surface.RetentionTransitions[Cursor],
    scheduling.ScheduleTransitions[Cursor],
    queueing.QueueTransitions[Cursor],
    live.LiveTransitions[Cursor],
    control.ControlTransitions[Cursor],
    census.Census[Cursor],
    overview.Overview[Cursor],
    appschema.AppSchema[Cursor],
    owners.OwnerTransitions[Cursor],
    claiming.ClaimTransitions[Cursor],
    waiting.WaitTransitions[Cursor],
):
    """A :class:`port.Store` on one SQLite database file."""

    read = rows.Reader(rows.MICROSECONDS)

    def __init__(
        self,
        url: str,
        *,
        clock: port.Clock | None = None,
        ledger_limit: int = 256,
        create: bool = True,
    ) -> None:
        """Open (creating if missing, unless ``create`` is False) the file named by ``url``.

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
        super().__init__(url, clock=clock, create=create)
        self._ledger_limit = ledger_limit

    # -- plumbing -------------------------------------------------------------

    def _exec(self, cur: Cursor, query: str, **params: Any) -> connection.Result:
        """Execute a named query; ``now`` is always passed."""
        return cur.execute(query, params)

    def _end_runs(self, cur: Cursor, ended: Sequence[rows.Row]) -> None:
        # Most runs end with nothing to drop, close, settle or announce: one
        # read finds that, and the rules' six statements run only when it does not.
        if len(ended) == 1 and ended[0]["parent_id"] is None:
            found = self._exec(cur, "end_probe", run_id=ended[0]["run_id"]).fetchone()
            if found is not None and not found["busy"]:
                return
        super()._end_runs(cur, ended)

    def _batch(self, arrays: dict[str, list[Any]]) -> dict[str, Any]:
        # No arrays in SQLite: matching parallel JSON arrays by index would cost
        # a scan per row, so the columns travel zipped, one JSON array per row.
        return {"batch": list(zip(*arrays.values(), strict=True))}

    # SQLite has no arrays: a JSON batch read with json_each costs more to
    # encode and decode than the statements it saves, and a step writes one
    # or two rows. So the hot path writes one row per statement.
    def _put_journal(self, cur: Cursor, run_id: str, entries: Sequence[port.JournalEntry]) -> None:
        for entry in entries:
            written = self._exec(cur, "journal_put", run_id=run_id, **vars(entry))
            if written.rowcount != 1:
                raise rows.corrupt(
                    run_id,
                    "journal_position_taken",
                    f"position {entry.position} holds a recorded entry",
                )

    def _append(self, cur: Cursor, receipts: Sequence[ledger.Receipt]) -> None:
        due: dict[str, None] = {}
        for receipt in receipts:
            stored = self._exec(cur, "ledger_append", **vars(receipt)).fetchone()
            # A receipt past the bound is not stored, and then older ones are due too.
            if stored is None or stored["due"]:
                due[receipt.run_id] = None
        for run_id in due:
            self._exec(cur, "ledger_trim", run_id=run_id)

    def _notify(self, cur: Cursor, apps: Iterable[str]) -> None:
        cur.notify = True

    def _body_connection(self, cur: Cursor) -> Any:
        # BEGIN IMMEDIATE already holds the file's write lock: no other lock is needed.
        return cur.conn

    def _announce(self, cur: Cursor, run_ids: Iterable[str]) -> None:
        cur.announce = True

    def _tell_answer(self, cur: Cursor, run_id: str, update_id: str, response: str) -> None:
        told = wakeup.told(run_id, update_id, response)
        if told is not None:
            cur.told.append(told)

    @contextmanager
    def watch(self) -> Iterator[liveport.Watch]:
        """Listen for changes of live runs made by any process of this host."""
        try:
            channel = self._watchers.take()
        except OSError:
            # No socket to listen on (a full or read-only temporary
            # directory): the watcher polls instead.
            yield _Poll()
            return
        try:
            yield channel
        finally:
            self._watchers.give(channel)

    # -- lifecycle ------------------------------------------------------------

    def migrate(self) -> None:
        """Create or upgrade the schema; safe when several processes race.

        Raises:
            errors.SchemaTooNew: the stored schema is newer than this code.
        """
        migrations = sqlfiles.migrations("sqlite")
        latest = migrations[-1].version if migrations else 0

        def work(cur: Cursor) -> None:
            self._exec(cur, "migrate_prepare")
            row = self._exec(cur, "schema_version").fetchone()
            current = row["version"] if row else 0
            if not isinstance(current, int):
                raise errors.CorruptState(None, "perdure_schema.version", repr(current))
            if current > latest:
                raise errors.SchemaTooNew(
                    f"the SQLite store {self.path} has schema version {current}, but this "
                    f"perdure knows versions up to {latest}; upgrade perdure to open it"
                )
            for migration in [m for m in migrations if m.version > current]:
                for statement in connection.statements(migration.sql):
                    cur.conn.execute(statement)
                self._exec(cur, "record_migration", version=migration.version)

        self._transact(work)

    def now(self) -> datetime:
        """Return the store's current time."""
        return self._now()

    # -- claims ---------------------------------------------------------------

    def _claim(
        self,
        cur: Cursor,
        app: str,
        worker: str,
        workflows: Sequence[tuple[str, str]],
        ttl: float,
        limit: int,
        recover_until: datetime | None,
        known: Mapping[str, port.KnownJournal],
        dry_run: bool = False,
    ) -> list[port.Claimed]:
        wanted = json.dumps([[name, version] for name, version in workflows])
        claimed: list[port.Claimed] = []
        params = {
            "app": app,
            "workflows": wanted,
            "limit": limit,
            "recover_until": recover_until,
            "dry_run": dry_run,
        }
        for candidate in self._exec(cur, "claim", **params):
            cur.conn.execute("SAVEPOINT claim_once")
            try:
                claimed.append(self._claim_once(cur, candidate, worker, ttl, known))
            except errors.CorruptState as exc:
                # Claiming that run again would fail again and starve the others.
                cur.conn.execute("ROLLBACK TO claim_once")
                self._quarantine(cur, candidate["run_id"], exc)
            cur.conn.execute("RELEASE claim_once")
        return claimed

    def _wanted(self, workflows: Sequence[tuple[str, str]]) -> dict[str, Any]:
        return {"workflows": json.dumps([[name, version] for name, version in workflows])}

    def _claim_once(
        self,
        cur: Cursor,
        candidate: Row,
        worker: str,
        ttl: float,
        known: Mapping[str, port.KnownJournal],
        unchanged: list[port.JournalEntry] | None = None,
    ) -> port.Claimed:
        """Claim ``candidate``; ``unchanged``: its held journal, already proved current."""
        prior = self.read.claim_prior(candidate)
        run_id = candidate["run_id"]
        params = {"run_id": run_id, "worker": worker, "lease_ttl": ttl}
        row = self._exec(cur, "claim_one", **params).fetchone()
        assert row is not None  # the candidate was read under the same lock
        if unchanged is None and known:
            unchanged = self._unchanged(cur, known, run_id, prior, candidate["generation"])
        held = {run_id: unchanged} if unchanged is not None else {}
        found = [(self.read.run(row), prior == "running")]
        (claimed,) = self._claimed(cur, found, held, known=known)
        receipt = port.Mark("recovered" if prior == "running" else "claimed")
        run = claimed.run
        self._append_marks(cur, claimed.claim, run.ledger_sequence, [receipt], run.ledger_limit)
        return claimed

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
        def work(cur: Cursor) -> port.Claimed | None:
            params = {"app": app, "run_id": run_id, "generation": known.generation}
            found = self._exec(
                cur, "claim_warm", dry_run=dry_run, **params, **self._wanted(workflows)
            ).fetchone()
            if found is None:
                return None
            # Claimed by key only for the journal its worker holds (see warmport).
            prior, generation = self.read.claim_prior(found), found["generation"]
            unchanged = self._unchanged(cur, {run_id: known}, run_id, prior, generation)
            if unchanged is None:
                return None
            return self._claim_once(cur, found, worker, ttl, {run_id: known}, unchanged)

        return self._transact(work)

    def woken(self) -> warmport.Woken:
        """A wake-up on this host names no run: the worker claims the ordinary way."""
        return warmport.ANY

    # -- journal --------------------------------------------------------------

    def _record(
        self,
        claim: port.Claim,
        fence: str,
        entries: Sequence[port.JournalEntry],
        marks: Sequence[port.Mark],
    ) -> None:
        entries = rows.checked_entries(claim.run_id, entries)
        marks = ledger.checked_marks(marks)

        def work(cur: Cursor) -> None:
            row = self._fenced(cur, fence, claim, claim.canceling, receipts=len(marks))
            self._put_journal(cur, claim.run_id, entries)
            self._append_marks(cur, claim, row["ledger_sequence"], marks, row["ledger_limit"])

        self._transact(work)

    def _append_marks(
        self,
        cur: Cursor,
        claim: port.Claim,
        last: int,
        marks: Sequence[port.Mark],
        limit: object = None,
    ) -> None:
        if type(last) is not int or type(limit) is not int or limit < 1:
            # The bound was not read, or the row holds garbage: ledger_append
            # reads the bound itself and numbers nothing past a broken one.
            super()._append_marks(cur, claim, last, marks)
            return
        # The write just read the run's bound: plain inserts, and a trim only when due.
        numbered = ledger.numbered_rows(claim.run_id, last, claim.generation, claim.worker, marks)
        kept = [row for row in numbered if row["sequence"] > last - limit]
        if len(kept) == 2:  # a step's start and end: one statement
            first, second = kept
            self._exec(
                cur,
                "ledger_put_pair",
                **first,
                kind_2=second["kind"],
                step_2=second["step"],
                digest_2=second["digest"],
                note_2=second["note"],
            )
        else:
            for row in kept:
                self._exec(cur, "ledger_put", **row)
        if marks and last > limit:
            self._exec(cur, "ledger_cut", run_id=claim.run_id, upto=last - limit)

    def transaction_step(
        self,
        claim: port.Claim,
        entries: Sequence[port.JournalEntry],
        body: Callable[[Any], port.JournalEntry],
        marks: Sequence[port.Mark] = (),
    ) -> port.JournalEntry:
        """Run ``body(connection)`` in the transaction that records its entry (fenced first).

        ``body`` receives the :class:`sqlite3.Connection` inside an open
        transaction; it must neither commit nor roll back.
        """
        buffered = list(entries)
        marks = ledger.checked_marks(marks)

        def work(cur: Cursor) -> port.JournalEntry:
            row = self._fenced(cur, "fence_step", claim, claim.canceling, receipts=len(marks))
            entry = body(cur.conn)
            self._put_journal(
                cur, claim.run_id, rows.checked_entries(claim.run_id, [*buffered, entry])
            )
            self._append_marks(cur, claim, row["ledger_sequence"], marks)
            return entry

        return self._transact(work, retry=False)  # body is the caller's code: run it once

    # -- operators ------------------------------------------------------------

    def _sweep_orphans(self, cur: Cursor) -> int:
        return self._exec(cur, "sweep_orphans").rowcount
