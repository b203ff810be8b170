"""What the conformance tests share: the factory protocol, the records they build, helpers.

The functions run in other processes are module-level so that spawn can import them.
"""

from __future__ import annotations

import json
import multiprocessing
import queue
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar, Protocol

import pytest

from perdure import store as perdure_store
from perdure.store import liveport, port
from perdure.testing import clock as clocks

Opener = Callable[[str, port.Clock | None, int], port.Store]
"""Open a Store on the existing database at ``url`` with ``clock`` and ``ledger_limit``.

Must be a module-level function so that it can be sent to another process.
"""

APP = "conformance"
OTHER_APP = "conformance-other"
WORKER = "worker-a"
OTHER_WORKER = "worker-b"
TTL = 30.0
TIMEOUT = 10.0
"""Upper bound (seconds) on any barrier, join or queue wait: a hang fails, never blocks."""


def open_existing(url: str, clock: port.Clock | None, ledger_limit: int) -> port.Store:
    """Open the store at ``url`` through :func:`perdure.store.open_store`, without migrating."""
    return perdure_store.open_store(url, clock=clock, ledger_limit=ledger_limit, migrate=False)


@dataclass
class StoreHandle:
    """A store under test, and the means to open more Store objects on its database.

    ``store`` is the fresh, migrated store the tests use; ``url`` names its
    database (with any password, unlike ``store.url``); ``opener`` opens
    another Store object on it, in this process (:meth:`reopen`) or in another
    one (the suite sends ``opener`` and ``url`` to a spawned process).
    """

    store: port.Store
    url: str
    clock: port.Clock | None
    ledger_limit: int
    opener: Opener = open_existing
    _opened: list[port.Store] = field(default_factory=list, repr=False)

    def reopen(self) -> port.Store:
        """Open a second Store object on the same database, same clock and ledger limit.

        It is closed by :meth:`close`.
        """
        other = self.opener(self.url, self.clock, self.ledger_limit)
        self._opened.append(other)
        return other

    def close(self) -> None:
        """Close every Store object of this handle."""
        stores = [*self._opened, self.store]
        self._opened.clear()
        for each in stores:
            each.close()


class StoreFactory(Protocol):
    """Make a fresh, empty, migrated store for one test."""

    def __call__(self, *, clock: port.Clock | None, ledger_limit: int) -> StoreHandle: ...


def url_factory(url: str, *, opener: Opener = open_existing) -> StoreFactory:
    """Return a factory for the empty database at ``url``: it opens it with ``opener``, migrates.

    The database must be empty and used by one test only (e.g. a file in
    pytest's ``tmp_path``, or a database created for the test).
    """

    def make(*, clock: port.Clock | None, ledger_limit: int) -> StoreHandle:
        store = opener(url, clock, ledger_limit)
        try:
            store.migrate()
        except BaseException:
            store.close()
            raise
        return StoreHandle(
            store=store, url=url, clock=clock, ledger_limit=ledger_limit, opener=opener
        )

    return make


# -- records the tests build --------------------------------------------------


def new_run(
    *,
    app: str = APP,
    workflow: str | None = None,
    version: str = "1",
    key: str | None = None,
    parent_id: str | None = None,
    input: str = '{"n": 1}',
) -> port.NewRun:
    """Return a NewRun with a fresh id (and, unless named, a workflow of its own)."""
    return port.NewRun(
        run_id=str(uuid.uuid4()),
        app=app,
        workflow=workflow or f"wf-{uuid.uuid4().hex[:10]}",
        version=version,
        input=input,
        key=key,
        parent_id=parent_id,
    )


def entry(
    position: int, status: port.EntryStatus = "ok", *, name: str | None = None, kind: str = "step"
) -> port.JournalEntry:
    """Return a journal entry at ``position`` with a payload fitting ``status``."""
    return port.JournalEntry(
        position=position,
        kind=kind,
        name=name or f"step-{position}",
        status=status,
        output=json.dumps({"position": position}) if status == "ok" else None,
        error=json.dumps({"code": "boom", "message": "it broke"}) if status == "error" else None,
    )


def signaled(
    run_id: str, name: str, at: datetime, *, signal_id: str = "sig-1", payload: str = '{"ok": 1}'
) -> port.Outcome:
    """Return a ``signaled`` outcome for the wait ``name`` of the run."""
    return port.Outcome(
        run_id=run_id,
        name=name,
        outcome="signaled",
        signal_id=signal_id,
        payload=payload,
        payload_digest=f"digest-of-{signal_id}",
        at=at,
    )


def start(store: port.Store, **kwargs: Any) -> port.Run:
    """Create a run (see :func:`new_run`) and return it."""
    run, created = store.create_run(new_run(**kwargs))
    assert created, "create_run without a key must create a run"
    return run


def claim_run(
    store: port.Store, run: port.Run, *, worker: str = WORKER, lease_ttl: float = TTL
) -> port.Claimed:
    """Claim exactly ``run`` (the only ready run of its workflow) or fail."""
    claimed = store.claim(run.app, worker, [(run.workflow, run.version)], lease_ttl=lease_ttl)
    assert [c.run.run_id for c in claimed] == [run.run_id], (
        f"expected to claim run {run.run_id}, got {[c.run.run_id for c in claimed]}"
    )
    return claimed[0]


def get(store: port.Store, run_id: str) -> port.Run:
    """Return the stored run or fail."""
    run = store.get_run(run_id)
    assert run is not None, f"run {run_id} is missing"
    return run


def kinds(store: port.Store, run_id: str) -> list[str]:
    """Return the kinds of the run's retained receipts, oldest first."""
    return [receipt.kind for receipt in store.history(run_id)]


def nonzero(counts: dict[str, int]) -> dict[str, int]:
    """Drop the states with no children (an adapter may list them or not)."""
    return {state: n for state, n in counts.items() if n}


def messages(store: port.Store, run_id: str, channel: str) -> list[port.Message]:
    """Return every stored message of the run's channel in delivery order."""
    found: list[port.Message] = []
    after = 0
    while (message := store.next_message(run_id, channel, after)) is not None:
        assert message.sequence > after, "next_message must move forward"
        found.append(message)
        after = message.sequence
    return found


def snapshot(store: port.Store, channels: Sequence[str] = ("inbox",)) -> dict[str, Any]:
    """Return every record the port can read for the suite's two apps."""
    runs = store.list_runs(APP, limit=1000) + store.list_runs(OTHER_APP, limit=1000)
    return {
        "runs": runs,
        "waits": store.waits(APP) + store.waits(OTHER_APP),
        "journals": {r.run_id: store.journal(r.run_id) for r in runs},
        "history": {r.run_id: store.history(r.run_id) for r in runs},
        "outcomes": {r.run_id: store.outcomes(r.run_id) for r in runs},
        "children": {r.run_id: nonzero(store.child_counts(r.run_id)) for r in runs},
        "messages": {
            (r.run_id, ch): messages(store, r.run_id, ch) for r in runs for ch in channels
        },
    }


def child_payload(outcome: port.Outcome) -> dict[str, Any]:
    """Decode a ``child:<id>`` outcome payload and check its keys."""
    assert outcome.payload is not None, "a child outcome carries a payload"
    payload = json.loads(outcome.payload)
    assert isinstance(payload, dict)
    assert set(payload) == {"run_id", "state", "result", "error"}, payload
    return payload


def same_json(embedded: Any, text: str | None) -> bool:
    """Tell whether a JSON text was embedded in a payload as a value or as its text."""
    if text is None:
        return embedded is None
    return bool(embedded == text or embedded == json.loads(text))


def run_threads(targets: Sequence[Callable[[], Any]]) -> list[Any]:
    """Run each target in its own thread, released together by a barrier; return results.

    Re-raises the first exception a target raised; fails if a thread hangs.
    """
    barrier = threading.Barrier(len(targets))
    results: list[Any] = [None] * len(targets)
    failures: list[BaseException] = []

    def work(index: int) -> None:
        try:
            barrier.wait(TIMEOUT)
            results[index] = targets[index]()
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(len(targets))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(TIMEOUT * 3)
    assert not any(t.is_alive() for t in threads), "a store call hung in a thread"
    if failures:
        raise failures[0]
    return results


# -- work done in other processes (module-level so that spawn can import it) ---


def _process_clock(start: datetime | None) -> port.Clock | None:
    return clocks.FakeClock(start) if start is not None else None


def create_in_process(
    opener: Opener,
    url: str,
    start: datetime | None,
    ledger_limit: int,
    barrier: Any,
    results: Any,
    new: port.NewRun,
) -> None:
    try:
        store = opener(url, _process_clock(start), ledger_limit)
        try:
            barrier.wait(TIMEOUT)
            run, created = store.create_run(new)
            results.put(("ok", run.run_id, created))
        finally:
            store.close()
    except BaseException as exc:
        results.put(("error", repr(exc), False))


def claim_in_process(
    opener: Opener,
    url: str,
    start: datetime | None,
    ledger_limit: int,
    barrier: Any,
    results: Any,
    app: str,
    workflows: list[tuple[str, str]],
    worker: str,
) -> None:
    try:
        store = opener(url, _process_clock(start), ledger_limit)
        try:
            barrier.wait(TIMEOUT)
            got: list[tuple[str, int]] = []
            while claimed := store.claim(app, worker, workflows, lease_ttl=300.0):
                got.extend((c.run.run_id, c.claim.generation) for c in claimed)
            results.put(("ok", got, None))
        finally:
            store.close()
    except BaseException as exc:
        results.put(("error", repr(exc), None))


def create_runs_until_stopped(
    opener: Opener,
    url: str,
    start: datetime | None,
    ledger_limit: int,
    ready: Any,
    stop: Any,
    results: Any,
) -> None:
    try:
        store = opener(url, _process_clock(start), ledger_limit)
        try:
            ready.set()
            created = 0
            # Poke until the waiter reports; bounded, so a lost wake-up fails the test.
            while created < 10 and not stop.is_set():
                store.create_run(new_run())
                created += 1
                stop.wait(0.5)
            results.put(("ok", created, None))
        finally:
            store.close()
    except BaseException as exc:
        results.put(("error", repr(exc), None))


def run_processes(target: Callable[..., None], args: Sequence[tuple[Any, ...]]) -> list[Any]:
    """Run ``target(*common, barrier, results, *each)`` in spawned processes; return results.

    Each ``args`` item is the argument tuple of one process, without the
    barrier and result queue, which are inserted after its first four items.
    """
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(len(args))
    results = context.Queue()
    processes = [
        context.Process(target=target, args=(*each[:4], barrier, results, *each[4:]), daemon=True)
        for each in args
    ]
    for process in processes:
        process.start()
    collected: list[Any] = []
    try:
        for _ in processes:
            try:
                collected.append(results.get(timeout=TIMEOUT * 6))
            except queue.Empty:
                pytest.fail("a store process reported nothing (crashed or hung)")
    finally:
        for process in processes:
            process.join(TIMEOUT)
            if process.is_alive():
                process.kill()
    errors_seen = [r[1] for r in collected if r[0] == "error"]
    assert not errors_seen, f"store calls failed in a process: {errors_seen}"
    return [r[1:] for r in collected]


# -- the fenced writes, each applied with one claim ------------------------------


class _BodyMustNotRun(AssertionError):
    pass


def _refuse_body(connection: Any) -> port.JournalEntry:
    raise _BodyMustNotRun("transaction_step ran its body although the fence refused the claim")


FENCED_WRITES: dict[str, Callable[[port.Store, port.Claim], object]] = {
    "renew": lambda s, c: s.renew(c, lease_ttl=TTL),
    "release": lambda s, c: s.release(c, delay=0, failed=False),
    "release_failed": lambda s, c: s.release(c, delay=5, failed=True),
    "begin_effect": lambda s, c: s.begin_effect(c, [entry(1, "started")]),
    "finish_step": lambda s, c: s.finish_step(c, [entry(1)]),
    "transaction_step": lambda s, c: s.transaction_step(c, [entry(1)], _refuse_body),
    "park": lambda s, c: s.park(c, [entry(1)], [port.WaitSpec("go", "signal")], wake_at=None),
    "finish_succeeded": lambda s, c: s.finish(c, [entry(1)], state="succeeded", result="1"),
    "finish_failed": lambda s, c: s.finish(c, [], state="failed", error='{"code": "x"}'),
    "finish_canceled": lambda s, c: s.finish(c, [], state="canceled"),
    "finish_needs_attention": lambda s, c: s.finish(
        c, [], state="needs_attention", error='{"code": "effect_outcome_unknown"}'
    ),
    "create_children": lambda s, c: s.create_children(
        c, [new_run(key="child-1", parent_id=c.run_id)]
    ),
    "answer_update": lambda s, c: liveport.require(s).answer_update(
        c, [entry(1, kind="respond")], "u-1", "1"
    ),
    "record_live": lambda s, c: liveport.require(s).record_live(
        c, [entry(1, kind="event", name="k")]
    ),
}
"""Every write made for a claimed run, by name."""

SETTLES_CANCELED = frozenset({"finish_canceled", "finish_needs_attention"})
FINISHES: dict[str, port.RunState] = {
    "finish_succeeded": "succeeded",
    "finish_failed": "failed",
    "finish_canceled": "canceled",
    "finish_needs_attention": "needs_attention",
}


class Suite:
    """The fixtures and knobs every section of the suite uses; see ``StoreConformance``.

    Fixtures a subclass may override: ``factory`` (required), ``clock`` (a
    :class:`~perdure.testing.clock.FakeClock`), ``ledger_limit`` (1000).
    """

    processes: ClassVar[bool] = True
    """Run the multi-process tests (the adapter can be opened from a spawned process)."""

    shared: ClassVar[bool] = False
    """The store is shared by processes, so ``wait_ready`` wakes on other processes' work."""

    thread_count: ClassVar[int] = 6
    """How many threads (each with its own Store object) race in the concurrency tests."""

    # -- fixtures ---------------------------------------------------------

    @pytest.fixture
    def factory(self) -> StoreFactory:
        """Return the adapter's factory; subclasses must override this fixture."""
        pytest.fail(
            f"{type(self).__name__} must define a `factory` fixture (see docs/conformance.md)"
        )

    @pytest.fixture
    def clock(self) -> clocks.FakeClock:
        """Return the clock the store reads time from."""
        return clocks.FakeClock()

    @pytest.fixture
    def ledger_limit(self) -> int:
        """Return how many receipts the store keeps per run."""
        return 1000

    @pytest.fixture
    def handle(
        self, factory: StoreFactory, clock: clocks.FakeClock, ledger_limit: int
    ) -> Iterator[StoreHandle]:
        """Return a fresh store from the factory; close it afterwards."""
        made = factory(clock=clock, ledger_limit=ledger_limit)
        try:
            yield made
        finally:
            made.close()

    @pytest.fixture
    def store(self, handle: StoreHandle) -> port.Store:
        """Return the store under test."""
        return handle.store

    # -- side-table helpers for transaction_step --------------------------

    def side_write(self, connection: Any, key: str) -> None:
        """Insert ``key`` into the side table through the adapter's connection."""
        mark = "?" if type(connection).__module__.startswith("sqlite3") else "%s"
        connection.execute("CREATE TABLE IF NOT EXISTS conf_side (k TEXT PRIMARY KEY)")
        connection.execute(f"INSERT INTO conf_side (k) VALUES ({mark})", (key,))

    def side_keys(self, connection: Any) -> list[str]:
        """Return the side table's keys, read through the adapter's connection."""
        connection.execute("CREATE TABLE IF NOT EXISTS conf_side (k TEXT PRIMARY KEY)")
        rows = connection.execute("SELECT k FROM conf_side ORDER BY k").fetchall()
        return [str(row[0]) for row in rows]

    def _read_side(self, store: port.Store, claim: port.Claim, position: int) -> list[str]:
        """Read the side table in a transaction_step that records the keys at ``position``."""

        def body(connection: Any) -> port.JournalEntry:
            keys = self.side_keys(connection)
            return port.JournalEntry(position, "step", "read-side", "ok", json.dumps(keys))

        recorded = store.transaction_step(claim, [], body)
        assert recorded.output is not None
        keys = json.loads(recorded.output)
        assert isinstance(keys, list)
        return [str(k) for k in keys]
