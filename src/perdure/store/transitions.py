"""The port's transitions written once, over named queries, for every SQL adapter.

:class:`Transitions` builds most operations of :class:`port.Store` from an
adapter's named queries (``<adapter>/sql/queries.sql``, the same names on
every adapter, see ``docs/store.md``), one transaction each. An adapter
supplies what only it knows: how a query runs (``_exec``), how work becomes a
transaction (``_transact``), how ready runs are announced (``_notify``), how
its rows hold instants and flags (``read``), and the operations its backend
does its own way (migrate, create_run, create_children, claim, the journal
writes of a step, transaction_step, counting swept records). Claims
(:mod:`perdure.store.claiming`), deliveries to waiting runs
(:mod:`perdure.store.waiting`) and the port's sections are mixins over it.

Rows become records through :mod:`perdure.store.rows`; receipts are numbered
by :mod:`perdure.store.ledger`.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import datetime
from typing import Any, Generic, Literal, NoReturn, Protocol, TypeVar

from perdure import errors
from perdure.store import batches, ledger, planport, port, rows

C = TypeVar("C")
T = TypeVar("T")
Row = rows.Row


class Result(Protocol):
    """What a named query returns: a DB-API cursor, or a list of rows that behaves like one."""

    def fetchone(self) -> Any: ...

    def fetchall(self) -> Sequence[Any]: ...

    def __iter__(self) -> Iterator[Any]: ...


def seconds(value: float, what: str, *, positive: bool = False) -> float:
    """Return a duration in seconds, refusing a negative one (or zero, if ``positive``).

    Raises:
        errors.InvalidInput: the duration is out of range.
    """
    if value < 0 or (positive and value == 0):
        raise errors.InvalidInput(
            f"{what} must be {'above' if positive else 'at least'} 0, got {value}"
        )
    return float(value)


def _origin(row: Row) -> str | None:
    """Return the first run of the chain of an ended run's row (None outside any chain)."""
    try:
        origin = row["origin"]
    except (KeyError, IndexError):  # a RETURNING that does not name it
        return None
    return origin if isinstance(origin, str) else None


class Transitions(abc.ABC, Generic[C]):
    """The store operations shared by the SQL adapters; ``C`` is the adapter's cursor."""

    read: rows.Reader
    _ledger_limit: int

    # -- what the adapter supplies -----------------------------------------------

    @abc.abstractmethod
    def _exec(self, cur: C, query: str, **params: Any) -> Result:
        """Execute a named query; ``now`` is always passed."""

    @abc.abstractmethod
    def _transact(self, work: Callable[[C], T], *, retry: bool = True, single: bool = False) -> T:
        """Run ``work`` in one transaction (or, when ``single``, as one statement)."""

    @abc.abstractmethod
    def _notify(self, cur: C, apps: Iterable[str]) -> None:
        """Announce, once this transaction commits, that runs of ``apps`` became ready."""

    @abc.abstractmethod
    def _record(
        self,
        claim: port.Claim,
        fence: str,
        entries: Sequence[port.JournalEntry],
        marks: Sequence[port.Mark],
    ) -> None:
        """Write a step's entries and receipts behind ``fence`` (a fenced UPDATE query)."""

    @abc.abstractmethod
    def _batch(self, arrays: dict[str, list[Any]]) -> dict[str, Any]:
        """Return the query parameters of a batch given as parallel lists (``{param: list}``)."""

    @abc.abstractmethod
    def _sweep_orphans(self, cur: C) -> int:
        """Delete the waits, outcomes and messages of ended or missing runs; return how many."""

    # -- plumbing -------------------------------------------------------------------

    def _fenced(self, cur: C, query: str, claim: port.Claim, canceling: bool, **params: Any) -> Row:
        """Run a fenced UPDATE; raise StaleClaim or Canceled when it matches nothing."""
        ids = {"run_id": claim.run_id, "generation": claim.generation, "canceling": canceling}
        row: Row | None = self._exec(cur, query, **ids, **params).fetchone()
        if row is None:
            self._lost(cur, claim, canceling)
        return row

    def _lost(self, cur: C, claim: port.Claim, canceling: bool) -> NoReturn:
        found = self._exec(cur, "fence_state", run_id=claim.run_id).fetchone()
        if found is None or found["generation"] != claim.generation or canceling:
            raise errors.StaleClaim(claim.run_id)
        if found["cancel_requested"]:
            raise errors.Canceled(claim.run_id)
        if found["suspend_requested"] or found["state"] == "suspended":
            raise errors.Suspended(claim.run_id)
        raise errors.StaleClaim(claim.run_id)

    def _append(self, cur: C, receipts: Sequence[ledger.Receipt]) -> None:
        """Append numbered receipts; each run keeps as many as its own ``ledger_limit``."""
        if receipts:
            batch = self._batch(batches.arrays(receipts, batches.RECEIPT_ARRAYS))
            self._exec(cur, "ledger_append", **batch)

    def _append_marks(
        self,
        cur: C,
        claim: port.Claim,
        last: int,
        marks: Sequence[port.Mark],
        limit: object = None,
    ) -> None:
        """Append a claimed run's receipts, the last numbered ``last``.

        ``limit`` is the run's ``ledger_limit`` when the write just read it
        (an adapter may then store the receipts without reading it again).
        """
        receipts = ledger.numbered(claim.run_id, last, claim.generation, claim.worker, marks)
        self._append(cur, receipts)

    def _put_journal(self, cur: C, run_id: str, entries: Sequence[port.JournalEntry]) -> None:
        """Write entries, replacing a stored entry only while it is ``started``."""
        if not entries:
            return
        batch = self._batch(batches.arrays(entries, batches.ENTRY_ARRAYS))
        written = self._exec(cur, "journal_put", run_id=run_id, **batch).fetchall()
        taken = sorted({e.position for e in entries} - {row["position"] for row in written})
        if taken:
            raise rows.corrupt(
                run_id, "journal_position_taken", f"position {taken[0]} holds a recorded entry"
            )

    def _wake(self, cur: C, run_ids: Sequence[str]) -> list[str]:
        """Make the waiting ones of ``run_ids`` queued and announce them."""
        if not run_ids:
            return []
        return self._woken(cur, self._exec(cur, "wake", run_ids=list(run_ids)).fetchall())

    def _woken(self, cur: C, woken: Sequence[Row]) -> list[str]:
        """Append ``woken`` to runs just made queued (rows of a RETURNING) and announce them."""
        receipts = [
            ledger.Receipt(r["run_id"], r["ledger_sequence"], "woken", r["generation"], None)
            for r in woken
        ]
        self._append(cur, receipts)
        if woken:
            self._notify_woken(cur, woken)
        return [r["run_id"] for r in woken]

    def _notify_woken(self, cur: C, woken: Sequence[Row]) -> None:
        """Announce runs woken by name (rows with ``app`` and ``run_id``), on commit.

        An adapter whose wake-ups can carry the run's id names each run, so
        that the worker keeping it warm can claim it alone (:mod:`.warmport`).
        """
        self._notify(cur, (r["app"] for r in woken))

    def _created(self, cur: C, made: Sequence[Row]) -> None:
        """Give runs just created (rows of a RETURNING) their first receipt; announce them."""
        self._append(cur, [ledger.Receipt(r["run_id"], 1, "initialized", 0, None) for r in made])
        if made:
            self._notify(cur, (r["app"] for r in made))

    def _lock_live(self, cur: C, run_id: str) -> port.Run:
        """Lock the run's row; refuse a missing or ended run."""
        row = self._exec(cur, "lock_run", run_id=run_id).fetchone()
        if row is None:
            raise errors.RunNotFound(run_id)
        run = self.read.run(row)
        if run.state in port.TERMINAL_STATES:
            raise errors.RunFinished(run_id, run.state)
        return run

    def _current_locked(self, cur: C, run_id: str) -> str:
        """Lock the run's row and return its id; a store with chains follows them."""
        if self._exec(cur, "lock_run", run_id=run_id).fetchone() is None:
            raise errors.RunNotFound(run_id)
        return run_id

    def _end_runs(self, cur: C, ended: Sequence[Row]) -> None:
        """Apply the end-of-run rules to runs that just ended (rows of a RETURNING)."""
        if not ended:
            return
        self._exec(cur, "end_cleanup", run_ids=[r["run_id"] for r in ended])
        # Children started with parent_close="cancel" end with their parent.
        doomed = self._exec(cur, "children_to_close", run_ids=[r["run_id"] for r in ended])
        roots = [r["run_id"] for r in doomed.fetchall()]
        if roots:
            self._cancel_trees(cur, roots)
        children = [r for r in ended if r["parent_id"] is not None]
        if not children:
            return
        # Lock the parents before writing their outcomes, as every delivery does.
        self._exec(cur, "lock_runs", run_ids=sorted({r["parent_id"] for r in children}))
        # A chain of runs that continued as new is its parent's child under its first run id.
        ids = [_origin(r) or r["run_id"] for r in children]
        pairs = {
            "parent_ids": [r["parent_id"] for r in children],
            "names": [f"child:{i}" for i in ids],
        }
        payloads = [
            rows.child_payload(i, r["state"], r["result"], r["error"])
            for i, r in zip(ids, children, strict=True)
        ]
        outcomes = self._batch({**pairs, "payloads": payloads})
        self._exec(cur, "child_outcomes_put", **outcomes)
        self._woken(cur, self._exec(cur, "wake_parents", **self._batch(pairs)).fetchall())

    def _admit_plan(self, cur: C, run_id: str, plan: planport.PlanSpec) -> None:
        """Store a just-created plan run's tasks (the plans section overrides this)."""
        raise errors.InvalidInput("this store keeps no plan runs")

    def _cancel_plans(self, cur: C, asked: Sequence[Row]) -> list[Row]:
        """Settle the plan runs among runs just asked to cancel; return those it ended."""
        return []

    # -- runs -----------------------------------------------------------------------

    def create_run(
        self, new: port.NewRun, journal: Sequence[port.JournalEntry] = ()
    ) -> tuple[port.Run, bool]:
        """Create a queued run, or return the one stored under ``(app, key)``.

        A fork's copied ``journal`` is written with the run, only when created.
        """
        entries = rows.checked_entries(new.run_id, journal)

        def work(cur: C) -> tuple[port.Run, bool]:
            params = {k: v for k, v in vars(new).items() if k != "plan"}
            row = self._exec(
                cur, "create_run", ledger_limit=self._ledger_limit, **params
            ).fetchone()
            if row is not None:
                self._created(cur, [row])
                self._put_journal(cur, new.run_id, entries)
                if new.plan is not None:
                    self._admit_plan(cur, new.run_id, new.plan)
                    row = self._exec(cur, "run_by_id", run_id=new.run_id).fetchone()
                return self.read.run(row), True
            return self._stored_start(cur, new), False

        return self._transact(work)

    def _stored_start(self, cur: C, new: port.NewRun) -> port.Run:
        """The run a start that created nothing finds under its key; an id taken is refused."""
        found = None
        if new.key is not None:
            keys = self._batch(batches.arrays([new], batches.KEY_ARRAYS))
            found = self._exec(cur, "runs_by_key", **keys).fetchone()
        if found is None:
            raise errors.InvalidInput(f"run id {new.run_id!r} is already taken")
        return self.read.run(found)

    def create_children(self, claim: port.Claim, children: Sequence[port.NewRun]) -> list[port.Run]:
        """Create the claimed run's children in one statement (fenced)."""
        rows.check_children(claim.run_id, children)
        batch = self._batch(batches.arrays(children, batches.CHILD_ARRAYS))
        keys = self._batch(batches.arrays(children, batches.KEY_ARRAYS))

        def work(cur: C) -> list[port.Run]:
            self._fenced(cur, "fence_touch", claim, claim.canceling, receipts=0)
            if not children:
                return []
            created = self._exec(
                cur,
                "create_children",
                parent_id=claim.run_id,
                ledger_limit=self._ledger_limit,
                **batch,
            )
            made = created.fetchall()
            self._created(cur, made)
            plans = {c.run_id: c.plan for c in children if c.plan is not None}
            for r in made:
                plan = plans.get(r["run_id"])
                if plan is not None:
                    self._admit_plan(cur, r["run_id"], plan)
            found = self._exec(cur, "runs_by_key", **keys)
            children_rows = found.fetchall()
            if len(children_rows) != len(children):
                raise errors.StoreError(
                    f"run {claim.run_id}: a child was neither created nor found"
                )
            return [self.read.run(r) for r in children_rows]

        return self._transact(work)

    def get_run(self, run_id: str) -> port.Run | None:
        """Return the run, or None."""
        row = self._transact(
            lambda cur: self._exec(cur, "run_by_id", run_id=run_id).fetchone(), single=True
        )
        return None if row is None else self.read.run(row)

    def list_runs(
        self,
        app: str,
        *,
        state: str | None = None,
        workflow: str | None = None,
        limit: int = 100,
        dry_run: bool | None = None,
    ) -> list[port.Run]:
        """Return the app's runs, newest first."""
        params = {
            "app": app,
            "state": state,
            "workflow": workflow,
            "limit": max(0, limit),
            "dry_run": dry_run,
        }
        found = self._transact(
            lambda cur: self._exec(cur, "list_runs", **params).fetchall(), single=True
        )
        return [self.read.run(r) for r in found]

    def child_counts(self, run_id: str) -> dict[str, int]:
        """Return how many children of the run are in each state."""
        found = self._transact(
            lambda cur: self._exec(cur, "child_counts", run_id=run_id).fetchall(), single=True
        )
        for row in found:
            if row["state"] not in port.RUN_STATES:
                raise rows.corrupt(None, "run_state", f"a child of {run_id} is {row['state']!r}")
        return {row["state"]: int(row["n"]) for row in found}

    def journal(self, run_id: str) -> list[port.JournalEntry]:
        """Return the run's journal ordered by position."""
        found = self._transact(
            lambda cur: self._exec(cur, "journal", run_id=run_id).fetchall(), single=True
        )
        return [self.read.entry(r) for r in found]

    def history(self, run_id: str) -> list[port.LedgerEntry]:
        """Return the run's retained ledger, oldest first.

        Gaps and counts are judged by the engine's validation, which names them.
        """
        found = self._transact(
            lambda cur: self._exec(cur, "history", run_id=run_id).fetchall(), single=True
        )
        return [self.read.receipt(row) for row in found]

    # -- journal --------------------------------------------------------------------

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

    def park(
        self,
        claim: port.Claim,
        entries: Sequence[port.JournalEntry],
        waits: Sequence[port.WaitSpec],
        *,
        wake_at: datetime | None,
        marks: Sequence[port.Mark] = (),
    ) -> bool:
        """Write entries, register waits and make the run waiting unless a wait is already met.

        The waits are registered (replacing the run's earlier registrations)
        whether or not the run parks, so a signal that arrives after a
        registered deadline is still turned into ``timed_out``.
        """
        entries = rows.checked_entries(claim.run_id, entries)
        marks = ledger.checked_marks(marks)
        rows.check_wait_kinds(waits, claim.run_id)
        batch = self._batch(batches.arrays(waits, batches.WAIT_ARRAYS))
        ready_at = rows.ready_at(waits, wake_at)

        def work(cur: C) -> bool:
            row = self._fenced(cur, "fence_touch", claim, claim.canceling, receipts=len(marks))
            self._put_journal(cur, claim.run_id, entries)
            self._exec(cur, "park_waits", run_id=claim.run_id, app=row["app"], **batch)
            met = self._exec(cur, "park_satisfied", run_id=claim.run_id, ready_at=ready_at)
            satisfied = met.fetchone()
            assert satisfied is not None  # SELECT EXISTS returns one row
            if satisfied["satisfied"]:
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
        receipts, canceling = ending(claim, state, marks)
        params = {"state": state, "result": result, "error": error, "receipts": len(receipts)}

        def work(cur: C) -> None:
            row = self._fenced(cur, "finish", claim, canceling, **params)
            self._put_journal(cur, claim.run_id, entries)
            self._append_marks(cur, claim, row["ledger_sequence"], receipts, row["ledger_limit"])
            if state != "needs_attention":
                # A run that needs attention keeps its records until resolve ends it.
                self._end_runs(cur, [row])

        self._transact(work)

    # -- operators ------------------------------------------------------------------

    def request_cancel(self, run_id: str) -> bool:
        """Cancel the run and every descendant, in one transaction.

        Runs in needs_attention are flagged like running ones (their open
        waits settled as canceled) and keep their state: a later ``resolve``
        with an output ends them canceled. The walk goes through runs of any
        state to their descendants. Runs canceled at once lose their waits
        and outcomes to the end-of-run rules in this same transaction, so no
        ``canceled`` outcome is written for their open waits: it could never
        be read.
        """

        def work(cur: C) -> bool:
            # A run that continued as new is canceled through its chain's current run.
            return self._cancel_trees(cur, [self._current_locked(cur, run_id)])

        return self._transact(work)

    def _cancel_trees(self, cur: C, roots: Sequence[str]) -> bool:
        """Cancel the runs ``roots`` and all their descendants; return whether any changed."""
        seen: set[str] = set()
        ended: list[Row] = []
        receipts: list[ledger.Receipt] = []

        def tree() -> set[str]:
            return {r["run_id"] for root in roots for r in self._exec(cur, "run_tree", run_id=root)}

        # A child committed while this walk waited on a lock is found by
        # the next walk; runs already marked here cannot create more.
        while fresh := sorted(tree() - seen):
            seen.update(fresh)
            for row in self._exec(cur, "lock_runs", run_ids=fresh).fetchall():
                self.read.run(row)  # refuse to cancel through a corrupt run
            self._exec(cur, "cancel_open_waits", run_ids=fresh)
            canceled = self._exec(cur, "cancel_now", run_ids=fresh).fetchall()
            requested = self._exec(cur, "cancel_request", run_ids=fresh).fetchall()
            ended += canceled
            settled = self._cancel_plans(cur, requested)
            receipts += [
                ledger.Receipt(r["run_id"], r["ledger_sequence"], kind, r["generation"], None)
                for kind, found in (("canceled", canceled), ("cancel_requested", requested))
                for r in found
            ]
            # A plan run with no task running ended now (its receipt is appended).
            ended += settled
        self._append(cur, receipts)
        # Every cancel is stored before any parent outcome, so a parent
        # canceled in this call receives none.
        self._end_runs(cur, ended)
        return bool(receipts)

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
        """Settle the ``started`` entry of a needs_attention run, then re-queue or fail it.

        A run whose cancel was requested ends ``canceled`` instead of being re-queued.
        """
        if state not in ("queued", "failed"):
            raise errors.InvalidInput(f"resolve re-queues or fails a run, not {state!r}")
        (entry,) = rows.checked_entries(run_id, [entry])

        def work(cur: C) -> None:
            row = self._exec(cur, "lock_run", run_id=run_id).fetchone()
            if row is None:
                raise errors.RunNotFound(run_id)
            run = self.read.run(row)
            rows.check_resolvable(run, generation)
            at = {"run_id": run_id, "position": entry.position}
            stored = self._exec(cur, "journal_entry", **at).fetchone()
            rows.check_resolvable_entry(
                run_id, entry, None if stored is None else self.read.entry(stored)
            )
            self._exec(cur, "resolve_entry", **{**vars(entry), **at})
            # A cancel that reached the run while it needed attention ends it
            # here instead of letting it run on.
            final = "canceled" if run.cancel_requested and state == "queued" else state
            marks = [port.Mark("resolved", step=entry.name, note=note)]
            if final == "canceled":
                marks.append(port.Mark("canceled"))
            params = {
                "run_id": run_id,
                "generation": generation,
                "state": final,
                "error": error if final == "failed" else None,
                "receipts": len(marks),
            }
            resolved = self._exec(cur, "resolve_run", **params).fetchone()
            assert resolved is not None
            last = resolved["ledger_sequence"]
            self._append(cur, ledger.numbered(run_id, last, generation, None, marks))
            if final == "queued":
                self._notify(cur, [resolved["app"]])
            else:
                self._end_runs(cur, [resolved])

        self._transact(work)

    def sweep(self) -> int:
        """Time out expired waits, wake due runs and delete records of ended runs.

        Also pulls leases further ahead than their TTL back to now + TTL.
        """

        def work(cur: C) -> int:
            clamped = len(self._exec(cur, "sweep_clamp_leases").fetchall())
            expired = [r["run_id"] for r in self._exec(cur, "sweep_expired_runs")]
            timed_out: Sequence[Row] = []
            if expired:
                timed_out = self._exec(cur, "sweep_expire_waits", run_ids=expired).fetchall()
            woken = self._wake(cur, sorted({r["run_id"] for r in timed_out}))
            woken += self._wake(cur, [r["run_id"] for r in self._exec(cur, "sweep_due_runs")])
            orphans = self._sweep_orphans(cur)
            return clamped + len(timed_out) + len(woken) + orphans

        return self._transact(work)


def ending(
    claim: port.Claim, state: port.RunState, marks: Sequence[port.Mark]
) -> tuple[list[port.Mark], bool]:
    """Return the receipts of a run's end and whether its fence lets a cancel through.

    The receipts are ``marks`` and then ``finished`` (``canceled`` for a
    canceled run). The owner may always settle a canceled run, acknowledged
    or not, and one that needs attention.
    """
    end = port.Mark("canceled" if state == "canceled" else "finished")
    canceling = claim.canceling or state in ("canceled", "needs_attention")
    return [*ledger.checked_marks(marks), end], canceling
