"""The queues section's store operations and queue claims, written once over named queries.

:class:`QueueTransitions` adds :mod:`perdure.store.queueport` to an SQL
adapter: saving and listing queues, and :meth:`_claim_queued`, the part of a
claim that takes runs in queues under their limits (``docs/store.md``,
"Queues"). The claim of runs in no queue is the adapter's own ``_claim``,
which steps over runs in queues.

A limited queue is claimed under its row's lock (``queue_lock``: ``FOR
UPDATE`` on PostgreSQL; the write transaction's database lock on SQLite),
then its running runs and recent starts are counted and only what the limits
admit is claimed, all in the claim's transaction: two claims of one queue on
any hosts see each other's slots.
"""

from __future__ import annotations

import abc
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any, TypeVar

from perdure.store import claiming, ledger, port, queueport

C = TypeVar("C")

# A claim fetches this many more candidates than it may take, so that runs of
# one key (admitted once per claim) do not hide the others behind them.
_SPARE = 16
# An app with no queue is asked again after this long (seconds): claims of
# apps without queues then cost no query. Saving a queue here asks at once.
_NO_QUEUES_FOR = 1.0


class QueueTransitions(claiming.ClaimTransitions[C]):
    """Queue rows and queue claims, shared by the SQL adapters."""

    # App -> monotonic instant until which it is known to have no queue.
    _queueless: dict[str, float]

    @abc.abstractmethod
    def _wanted(self, workflows: Sequence[tuple[str, str]]) -> dict[str, Any]:
        """Return the query parameters that name the workflows a claim may take."""

    # -- queue rows -------------------------------------------------------------------

    def save_queues(
        self, app: str, specs: Sequence[queueport.QueueSpec]
    ) -> list[queueport.QueueRecord]:
        """Create or update the app's queues (see :class:`queueport.QueueStore`)."""
        for spec in specs:
            queueport.check_spec(spec)

        def work(cur: C) -> list[queueport.QueueRecord]:
            saved = []
            for spec in specs:
                row = self._exec(cur, "save_queue", app=app, **vars(spec)).fetchone()
                saved.append(self.read.queue(row))
            # New limits may admit runs that waited: idle workers claim again.
            self._notify(cur, [app])
            return saved

        if not specs:
            return []
        saved = self._transact(work)
        self._queues_known().pop(app, None)
        return saved

    def get_queue(self, app: str, name: str) -> queueport.QueueRecord | None:
        """Return the app's queue ``name``, or None."""
        row = self._transact(
            lambda cur: self._exec(cur, "queue_by_name", app=app, name=name).fetchone(),
            single=True,
        )
        return None if row is None else self.read.queue(row)

    def list_queues(self, app: str | None = None) -> list[queueport.QueueRecord]:
        """Return the queues of ``app`` (or of every app) with their counts."""
        found = self._transact(
            lambda cur: self._exec(cur, "list_queues", app=app).fetchall(), single=True
        )
        return [self.read.queue(r) for r in found]

    # -- claims -----------------------------------------------------------------------

    def _queues_known(self) -> dict[str, float]:
        known: dict[str, float] | None = getattr(self, "_queueless", None)
        if known is None:
            known = self._queueless = {}
        return known

    def _claim_queued(
        self,
        cur: C,
        app: str,
        worker: str,
        workflows: Sequence[tuple[str, str]],
        ttl: float,
        limit: int,
    ) -> list[port.Claimed]:
        """Claim up to ``limit`` runs of the app's queues, as their limits admit."""
        known = self._queues_known()
        if known.get(app, 0.0) > time.monotonic():
            return []
        queues = [self.read.queue(r) for r in self._exec(cur, "queues_of_app", app=app)]
        if not queues:
            known[app] = time.monotonic() + _NO_QUEUES_FOR
            return []
        wanted = self._wanted(workflows)
        picked: list[port.Run] = []
        # In name order, as every claim locks them: two claims never wait on
        # each other's queue rows in a cycle.
        for queue in queues:
            left = limit - len(picked)
            if left <= 0:
                break
            picked += self._admit(cur, app, queue, wanted, left)
        if not picked:
            return []
        params = {"run_ids": [r.run_id for r in picked], "worker": worker, "lease_ttl": ttl}
        order = {run.run_id: index for index, run in enumerate(picked)}
        found = self._exec(cur, "queue_claim", **params).fetchall()
        claimed = sorted((self.read.run(r) for r in found), key=lambda r: order[r.run_id])
        receipts = [
            receipt
            for run in claimed
            for receipt in ledger.numbered(
                run.run_id, run.ledger_sequence, run.generation, worker, [port.Mark("claimed")]
            )
        ]
        self._append(cur, receipts)
        return self._claimed(cur, [(run, False) for run in claimed])

    def _admit(
        self,
        cur: C,
        app: str,
        queue: queueport.QueueRecord,
        wanted: dict[str, Any],
        want: int,
    ) -> list[port.Run]:
        """Return up to ``want`` claimable runs of ``queue`` that its limits admit now."""
        ids = {"app": app, "queue": queue.name}
        if not queue.spec.limited:
            free = self._exec(cur, "queue_candidates", **ids, **wanted, busy=[], limit=want)
            return [self.read.run(r) for r in free.fetchall()]
        # A queue with nothing to claim is not locked: claims of busy workers
        # would otherwise queue up on its row for nothing.
        ready = self._exec(cur, "queue_ready", **ids).fetchone()
        if ready is None or not ready["ready"]:
            return []
        # Claims of this queue wait for each other here; what they claimed is
        # committed, and so counted below, when the lock is granted.
        locked = self._exec(cur, "queue_lock", app=app, name=queue.name).fetchone()
        if locked is None:
            return []
        queue = self.read.queue(locked)
        by_key: Counter[str | None] = Counter()
        for row in self._exec(cur, "queue_running", **ids):
            by_key[row["queue_key"]] = int(row["n"])
        room = want
        if queue.concurrency is not None:
            room = min(room, queue.concurrency - sum(by_key.values()))
        if room <= 0:
            return []
        starts = room
        if queue.rate_limit is not None:
            counted = self._exec(cur, "queue_starts", **ids).fetchone()
            starts = queue.rate_limit - (int(counted["n"]) if counted is not None else 0)
        busy: list[str] = []
        if queue.per_key is not None:
            busy = sorted(k for k, n in by_key.items() if k is not None and n >= queue.per_key)
        found = self._exec(
            cur, "queue_candidates", **ids, **wanted, busy=busy, limit=room + _SPARE
        ).fetchall()
        admitted: list[port.Run] = []
        for row in found:
            if len(admitted) >= room:
                break
            run = self.read.run(row)
            key = run.queue_key
            if queue.per_key is not None and key is not None and by_key[key] >= queue.per_key:
                continue
            # A rate counts starts: a run claimed before (resumed, retried) is not one.
            if run.generation == 0:
                if starts <= 0:
                    continue
                starts -= 1
            by_key[key] += 1
            admitted.append(run)
        return admitted
