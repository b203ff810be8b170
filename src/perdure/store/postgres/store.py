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
:mod:`perdure.store.postgres.connection`. Most operations are written once,
over named queries, in :mod:`perdure.store.transitions`; this module holds
what PostgreSQL does its own way. It is the SQLite store's twin: the same
helpers and the same named queries (``postgres/sql/queries.sql``, listed in
``docs/store.md``) in the same order.
"""

from __future__ import annotations

import contextvars
import json
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import psycopg
import psycopg.errors

from perdure import errors
from perdure.store import (
    appschema,
    batches,
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
    transitions,
    waiting,
)
from perdure.store.postgres import bridge, connection, listener, warmclaims

log = logging.getLogger("perdure.store.postgres")

Row = connection.Row
Cursor = connection.Cursor

_Q = sqlfiles.queries("postgres")
_PLANNED_EACH_TIME = frozenset({"queue_ready", "queue_candidates", "queue_running", "queue_starts"})

# A transaction that wakes more runs than this announces their apps only.
_NAMED_WAKES = 8

_CLAIM_ALONE: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "perdure_claim_alone", default=False
)
"""Set while a claim runs alone in a transaction that claim_begin opened."""


class _BodyRaised(Exception):
    """Carries what a ``transaction_step`` body raised past the error translation."""

    def __init__(self, original: BaseException) -> None:
        super().__init__(str(original))
        self.original = original


class PostgresStore(
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
    warmclaims.WarmClaimTransitions,
    claiming.ClaimTransitions[Cursor],
    waiting.WaitTransitions[Cursor],
):
    """The port on PostgreSQL (see the module docstring)."""

    read = rows.Reader(rows.NATIVE)

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
        self._live = listener.Listener(
            lambda: psycopg.connect(self._conninfo, autocommit=True, **self._kwargs),
            _Q["listen_live"],
        )

    # -- plumbing -------------------------------------------------------------

    def _carried_update(self, run_id: str, text: str) -> liveport.UpdateRecord | None:
        """Read the update a delivery's wake-up carried (``perdure.deliver_update``)."""
        try:
            fields = json.loads(text)
            row = {
                "run_id": run_id,
                "update_id": fields["update_id"],
                "name": fields["name"],
                "sequence": fields["sequence"],
                "payload": fields["payload"],
                "state": "pending",
                "response": None,
                "at": datetime.fromisoformat(fields["at"]),
                "settled_at": None,
            }
            return self.read.update(row)
        except (ValueError, TypeError, KeyError, errors.CorruptState):
            # Not what a delivery sends: the run reads its update as usual.
            return None

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
        # The queue queries are planned afresh each time: a generic plan chosen
        # while the runs table was small stays slow once a backlog builds up,
        # and they run only for apps with queues. The claim itself is prepared
        # (planning it costs more than running it); its ranges each name their
        # index's own order, so any plan of it walks those indexes.
        prepare = False if query in _PLANNED_EACH_TIME else None
        return cur.execute(_Q[query], {"now": self._now(), **params}, prepare=prepare)

    def _batch(self, arrays: dict[str, list[Any]]) -> dict[str, Any]:
        return arrays

    def _notify(self, cur: Cursor, apps: Iterable[str]) -> None:
        self._exec(cur, "notify", apps=sorted(set(apps)))

    def _notify_woken(self, cur: Cursor, woken: Sequence[transitions.Row]) -> None:
        if len(woken) > _NAMED_WAKES:
            # Many at once (a broadcast, a tree canceled): one per app, as any
            # other announcement, so listeners are not woken once per run.
            self._notify(cur, (r["app"] for r in woken))
            return
        named = sorted({(r["app"], r["run_id"]) for r in woken})
        self._exec(cur, "notify_woken", apps=[a for a, _ in named], run_ids=[r for _, r in named])

    def _created(self, cur: Cursor, made: Sequence[rows.Row]) -> None:
        # create_run and create_children write the receipts and notify themselves.
        return

    def _created_claimed(self, cur: Cursor, run_id: str, worker: str) -> None:
        # create_claimed writes both receipts itself.
        return

    def _start_transact(
        self, work: Callable[[Cursor], tuple[port.Run, port.Claimed | None]]
    ) -> tuple[port.Run, port.Claimed | None]:
        # One statement, committed alone: one round trip. The read of a run
        # found under its key, when the insert stored nothing, is a second.
        return self._transact(work, single=True)

    def _body_connection(self, cur: Cursor) -> Any:
        return cur.connection

    def _lock_app_schema(self, cur: Cursor, app: str) -> None:
        self._exec(cur, "app_migrations_lock", app=app)

    def _announce(self, cur: Cursor, run_ids: Iterable[str]) -> None:
        self._exec(cur, "announce", run_ids=sorted(set(run_ids)))

    @contextmanager
    def watch(self) -> Iterator[liveport.Watch]:
        """Listen for changes of live runs made by any process on any host."""
        with self._live.watch() as watch:
            yield watch

    # -- lifecycle ------------------------------------------------------------

    def close(self, timeout: float = 5.0) -> None:
        """Stop watching live runs and release connections. Idempotent."""
        self._live.close()
        super().close(timeout)

    def migrate(self) -> None:
        """Create or upgrade the schema under an advisory lock; safe when processes race.

        Raises:
            errors.SchemaTooNew: the stored schema is newer than this code.
        """
        migrations = sqlfiles.migrations("postgres")
        latest = migrations[-1].version if migrations else 0

        def work(cur: Cursor) -> None:
            cur.execute(_Q["migrate_prepare"])
            row = cur.execute(_Q["schema_version"]).fetchone()
            current = int(row["version"]) if row else 0
            if current > latest:
                raise errors.SchemaTooNew(
                    f"the store's schema is version {current} but this perdure knows up to "
                    f"{latest}; upgrade perdure"
                )
            for migration in [m for m in migrations if m.version > current]:
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
        return self.read.instant(row, "now")

    def notify_ready(self) -> None:
        """Wake every ``wait_ready`` caller of this store, here and on other hosts."""
        with self._wake_cond:
            self._wakes += 1
            self._woken_other = True
            self._wake_cond.notify_all()
        try:
            self._transact(lambda cur: self._notify(cur, [""]))
        except errors.StoreError as exc:
            # Waiters elsewhere still poll; the local ones are awake already.
            log.warning("cannot notify through the store %s: %s", self.url, exc)

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
        params: dict[str, Any] = {
            "app": app,
            "worker": worker,
            "workflows": [w for w, _ in workflows],
            "versions": [v for _, v in workflows],
            "lease_ttl": ttl,
            "limit": limit,
            "recover_until": recover_until,
            "dry_run": dry_run,
        }
        exclude: list[str] = []
        alone = _CLAIM_ALONE.get()
        opened = alone  # claim_begin opened the savepoint with the transaction
        while True:
            # No parameters: psycopg sends the statements of each in one round trip.
            if not opened:
                cur.execute(_Q["claim_open"])
            opened = False
            try:
                claimed = self._claim_once(cur, known, exclude=exclude, **params)
            except errors.CorruptState as exc:
                # Claiming that run again would fail again and starve the others.
                if exc.run_id is None or exc.run_id in exclude:
                    raise
                log.error("claim sets run %s aside: %s", exc.run_id, exc)
                cur.execute(_Q["claim_undo"])
                exclude.append(exc.run_id)
                self._quarantine(cur, exc.run_id, exc)
                continue
            if not alone:
                cur.execute(_Q["claim_close"])
            return claimed

    def _claim_transact(
        self, app: str, work: Callable[[Cursor], list[port.Claimed]]
    ) -> list[port.Claimed]:
        """Run a claim's ``work``; for an app known to have no queues, in two round trips fewer.

        Such a claim is alone in its transaction: claim_begin opens it with
        the claim's savepoint and plan setting, and the COMMIT that follows
        the claim ends both. (A claim that may meet queues opens and closes
        them around the claim, as the queue queries follow it.)
        """
        if bridge.bridged() or self._queues_known().get(app, 0.0) <= time.monotonic():
            return self._transact(work)

        def alone(cur: Cursor) -> list[port.Claimed]:
            token = _CLAIM_ALONE.set(True)
            try:
                return work(cur)
            finally:
                _CLAIM_ALONE.reset(token)

        return self._transact(alone, begin=_Q["claim_begin"])

    def _claim_queued(
        self,
        cur: Cursor,
        app: str,
        worker: str,
        workflows: Sequence[tuple[str, str]],
        ttl: float,
        limit: int,
    ) -> list[port.Claimed]:
        # A claim alone in its transaction was judged to have no queues to look at.
        if _CLAIM_ALONE.get():
            return []
        return super()._claim_queued(cur, app, worker, workflows, ttl, limit)

    def _wanted(self, workflows: Sequence[tuple[str, str]]) -> dict[str, Any]:
        return {"workflows": [w for w, _ in workflows], "versions": [v for _, v in workflows]}

    def _claim_once(
        self, cur: Cursor, known: Mapping[str, port.KnownJournal], **params: Any
    ) -> list[port.Claimed]:
        claimed = self._exec(cur, "claim", **params).fetchall()
        if not claimed:
            return []
        for row in claimed:
            # The claim overwrote these columns: judge the values it found.
            prior = row["prior_generation"]
            if not isinstance(prior, int) or prior < 0:
                raise rows.corrupt(row["run_id"], "run_generation", f"generation {prior!r}")
            worker = row["prior_worker"]
            if worker is not None and (
                not isinstance(worker, str) or not port.WORKER_ID.match(worker)
            ):
                raise rows.corrupt(row["run_id"], "run_worker_id", f"worker {worker!r}")
        found = [(self.read.run(row), row["prior_state"] == "running") for row in claimed]
        held: dict[str, list[port.JournalEntry]] = {}
        bare: set[str] = set()
        for row in claimed:
            run_id = row["run_id"]
            if row["prior_generation"] == 0 and row["prior_worker"] is None:
                # Never claimed: what the claim saw of its journal is all there
                # is (written with the run, or never). An outcome delivered
                # since is found when the run waits, as if it came just after.
                if not row["has_journal"]:
                    held[run_id] = []
                if not row["has_outcomes"]:
                    bare.add(run_id)
                continue
            prior = (row["prior_state"], row["prior_generation"])
            unchanged = self._unchanged(cur, known, run_id, *prior) if known else None
            if unchanged is not None:
                held[run_id] = unchanged
        return self._claimed(cur, found, held, bare, known)

    # -- journal --------------------------------------------------------------

    def _record(
        self,
        claim: port.Claim,
        fence: str,
        entries: Sequence[port.JournalEntry],
        marks: Sequence[port.Mark],
    ) -> None:
        row = self._write_alone("record_step", claim, entries, marks, reset=fence == "fence_step")
        if row is None:
            self._transact(lambda cur: self._lost(cur, claim, claim.canceling))

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
        """End the run; one statement when it has no parent and no child closing with it."""
        if state in port.TERMINAL_STATES:
            receipts, canceling = transitions.ending(claim, state, marks)
            row = self._write_alone(
                "finish_alone",
                claim,
                entries,
                receipts,
                state=state,
                result=result,
                error=error,
                canceling=canceling,
                # A run that needs attention keeps its records until resolve ends it.
                ending=state != "needs_attention",
            )
            if row is not None:
                return
        # A child run, a run with children that close with it, or a fence that
        # refused: the transaction path writes the rest or says why.
        super().finish(claim, entries, state=state, result=result, error=error, marks=marks)

    def deliver_update(self, update: liveport.NewUpdate) -> tuple[liveport.UpdateRecord, bool]:
        """Store the update unless its id exists; wake the run if it is parked on that name.

        One round trip: a function takes the run's lock, then delivers. A
        delivery whose connection was lost is sent again: a second delivery
        of the id finds the first, if it happened, and changes nothing.
        """
        if not update.update_id or not update.name:
            raise errors.InvalidInput("an update needs a name and an update id")
        params = {**vars(update), "terminal": sorted(port.TERMINAL_STATES)}
        row = self._transact(
            lambda cur: self._exec(cur, "update_deliver", **params).fetchone(),
            single=True,
            idempotent=True,
        )
        if row is None:
            raise errors.RunNotFound(update.run_id)
        refused = row["refused"]
        if refused == "overdue":
            raise liveport.Overdue(update.run_id)
        if refused is not None:
            raise errors.RunFinished(update.run_id, refused)
        return self.read.update(row), bool(row["fresh"])

    def answer_update(
        self,
        claim: port.Claim,
        entries: Sequence[port.JournalEntry],
        update_id: str,
        response: str,
        marks: Sequence[port.Mark] = (),
    ) -> bool:
        """Write entries and answer the pending update, in one statement (fenced)."""
        row = self._write_alone(
            "answer_alone", claim, entries, marks, update_id=update_id, response=response
        )
        if row is None:
            self._transact(lambda cur: self._lost(cur, claim, claim.canceling))
        return bool(row is not None and row["answered"])

    def answer_ahead(
        self,
        claim: port.Claim,
        entries: Sequence[port.JournalEntry],
        update_id: str,
        response: str,
        marks: Sequence[port.Mark] = (),
    ) -> bool:
        """Answer under ``claim`` once it commits (warmport.AnswersAhead); False: not written."""
        # The same statement: it waits for a claim in progress on the run's row.
        row = self._write_alone(
            "answer_alone", claim, entries, marks, update_id=update_id, response=response
        )
        return row is not None

    def _write_alone(
        self,
        query: str,
        claim: port.Claim,
        entries: Sequence[port.JournalEntry],
        marks: Sequence[port.Mark],
        **extra: Any,
    ) -> Row | None:
        """Write entries and receipts in one fenced statement; None if it matched nothing."""
        params = self._alone_params(claim, entries, marks, **extra)
        with self._position_taken(claim.run_id):
            row: Row | None = self._transact(
                lambda cur: self._exec(cur, query, **params).fetchone(), single=True
            )
        return row

    def _alone_params(
        self,
        claim: port.Claim,
        entries: Sequence[port.JournalEntry],
        marks: Sequence[port.Mark],
        **extra: Any,
    ) -> dict[str, Any]:
        """The parameters of a fenced one-statement write (``record_step``, ``answer_alone``...)."""
        entries = rows.checked_entries(claim.run_id, entries)
        marks = ledger.checked_marks(marks)
        return {
            "run_id": claim.run_id,
            "generation": claim.generation,
            "worker": claim.worker,
            "canceling": claim.canceling,
            "receipts": len(marks),
            "entries": len(entries),
            **batches.arrays(entries, batches.ENTRY_ARRAYS),
            "mark_kinds": [m.kind for m in marks],
            "mark_steps": [m.step for m in marks],
            "mark_digests": [m.digest for m in marks],
            "mark_notes": [m.note for m in marks],
            **extra,
        }

    @contextmanager
    def _position_taken(self, run_id: str) -> Iterator[None]:
        """Report a journal position that holds a recorded entry (the write's guard) as corrupt."""
        try:
            yield
        except errors.StoreError as exc:
            if isinstance(exc.__cause__, psycopg.errors.RaiseException):
                raise rows.corrupt(
                    run_id, "journal_position_taken", "a position holds a recorded entry"
                ) from None
            raise

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
        marks = ledger.checked_marks(marks)

        def work(cur: Cursor) -> port.JournalEntry:
            row = self._fenced(cur, "fence_step", claim, claim.canceling, receipts=len(marks))
            try:
                entry = body(cur.connection)
            except BaseException as exc:
                raise _BodyRaised(exc) from exc
            self._put_journal(
                cur, claim.run_id, rows.checked_entries(claim.run_id, [*buffered, entry])
            )
            self._append_marks(cur, claim, row["ledger_sequence"], marks)
            return entry

        try:
            return self._transact(work, retry=False)  # body is the caller's code: run it once
        except _BodyRaised as raised:
            raise raised.original from None

    # -- operators ------------------------------------------------------------

    def _sweep_orphans(self, cur: Cursor) -> int:
        found = self._exec(cur, "sweep_orphans").fetchone()
        return int(found["n"]) if found else 0
