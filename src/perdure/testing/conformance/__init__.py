"""The Store conformance suite: one set of tests that every store adapter must pass.

The tests are written once against :mod:`perdure.store.port` (its docstrings are
the contract) and run through a *factory* per adapter. An adapter is done when
it passes. To run the suite against an adapter, subclass
:class:`StoreConformance` in a pytest module and give it a ``factory`` fixture
that returns a :class:`StoreFactory`::

    # tests/test_my_store.py
    import pytest

    from perdure.testing import conformance


    class TestMyStore(conformance.StoreConformance):
        @pytest.fixture
        def factory(self, tmp_path) -> conformance.StoreFactory:
            # An empty database per test; the factory opens and migrates it.
            return conformance.url_factory(f"mystore:///{tmp_path}/db", opener=my_opener)

``my_opener(url, clock, ledger_limit)`` is a module-level (picklable) function
that returns a :class:`~perdure.store.port.Store` on the database at ``url``;
the default, :func:`open_existing`, goes through
:func:`perdure.store.open_store` and so serves every adapter that function
names. Set ``processes = False`` on the subclass if the adapter cannot be opened
from another process (the multi-process tests are then skipped), and
``shared = True`` if other processes' writes must wake ``wait_ready`` (a
server database). Call ``pytest.register_assert_rewrite("perdure.testing.conformance")``
at the top of your ``conftest.py`` so that failures show the compared values.
See ``docs/conformance.md``.

What a factory must give: a *fresh, empty, migrated* store that reads time
from the ``clock`` it is given and keeps ``ledger_limit`` receipts per run,
wrapped in a :class:`StoreHandle` that can open more Store objects on the same
database (``reopen()``, used by the cross-connection tests) and in other
processes (``opener`` + ``url``). The suite calls the factory once per test.

The suite orders concurrent work with barriers, never with sleeps, and moves
time only through :class:`~perdure.testing.clock.FakeClock`. Every test
asserts exact states, counts and records, so a failing test names the broken
guarantee. Tests of :meth:`Store.transaction_step` write to a side table
through the connection the adapter hands to the body; override
:meth:`StoreConformance.side_write` and :meth:`StoreConformance.side_keys`
when that connection is not a DB-API connection with ``execute``.

Needs pytest (the ``dev`` extra).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import multiprocessing
import queue
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, ClassVar, Protocol
from urllib.parse import urlsplit

import pytest

from perdure import errors
from perdure import store as perdure_store
from perdure.store import port
from perdure.testing import clock as clocks

__all__ = [
    "Opener",
    "StoreConformance",
    "StoreFactory",
    "StoreHandle",
    "open_existing",
    "url_factory",
]

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


def _create_in_process(
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


def _claim_in_process(
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


def _create_runs_until_stopped(
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
}
"""Every write made for a claimed run, by name."""

_SETTLES_CANCELED = frozenset({"finish_canceled", "finish_needs_attention"})
_FINISHES: dict[str, port.RunState] = {
    "finish_succeeded": "succeeded",
    "finish_failed": "failed",
    "finish_canceled": "canceled",
    "finish_needs_attention": "needs_attention",
}


class StoreConformance:
    """The conformance tests; subclass it and provide a ``factory`` fixture.

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
        pytest.fail(f"{type(self).__name__} must define a `factory` fixture (see conformance.py)")

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

    # == store basics and time =============================================

    def test_now_is_the_injected_clock(self, store: port.Store, clock: clocks.FakeClock) -> None:
        assert store.now() == clock.now()
        clock.advance(90.5)
        assert store.now() == clock.now()

    def test_migrate_again_and_close_twice(self, handle: StoreHandle) -> None:
        run = start(handle.store)
        handle.store.migrate()
        other = handle.reopen()
        other.migrate()
        assert get(other, run.run_id) == get(handle.store, run.run_id)
        other.close()
        other.close()

    def test_url_has_no_password(self, handle: StoreHandle) -> None:
        assert isinstance(handle.store.url, str)
        password = urlsplit(handle.url).password
        if password:
            assert password not in handle.store.url

    def test_lease_and_ready_at_come_from_the_clock(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run = start(store)
        assert run.created_at == clock.now()
        assert run.updated_at == clock.now()
        clock.advance(3)
        claimed = claim_run(store, run, lease_ttl=12.5)
        assert claimed.claim.lease_expires_at == clock.now() + timedelta(seconds=12.5)
        assert claimed.run.lease_expires_at == clock.now() + timedelta(seconds=12.5)
        clock.advance(4)
        renewed = store.renew(claimed.claim, lease_ttl=20)
        assert renewed.lease_expires_at == clock.now() + timedelta(seconds=20)
        assert get(store, run.run_id).lease_expires_at == clock.now() + timedelta(seconds=20)
        store.release(renewed, delay=7.25, failed=False)
        assert get(store, run.run_id).ready_at == clock.now() + timedelta(seconds=7.25)

    # == create_run ========================================================

    def test_create_run_stores_a_queued_run(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        new = new_run(key="order-1", input='{"order": 1}')
        run, created = store.create_run(new)
        assert created is True
        assert (run.run_id, run.app, run.workflow, run.version) == (
            new.run_id,
            APP,
            new.workflow,
            "1",
        )
        assert (run.state, run.input, run.key, run.parent_id) == (
            "queued",
            '{"order": 1}',
            "order-1",
            None,
        )
        assert (run.result, run.error, run.worker, run.lease_expires_at) == (None, None, None, None)
        assert (run.generation, run.failures, run.cancel_requested) == (0, 0, False)
        assert run.ready_at is None or run.ready_at <= clock.now()
        assert run.ledger_sequence == 1
        assert get(store, run.run_id) == run
        assert store.journal(run.run_id) == []
        assert store.outcomes(run.run_id) == []

    def test_get_run_of_unknown_id_is_none(self, store: port.Store) -> None:
        assert store.get_run(str(uuid.uuid4())) is None

    def test_create_run_is_idempotent_by_app_and_key(self, store: port.Store) -> None:
        first, created = store.create_run(new_run(workflow="wf", key="k"))
        again, created_again = store.create_run(new_run(workflow="wf", key="k", input="2"))
        assert (created, created_again) == (True, False)
        assert again == first
        assert [r.run_id for r in store.list_runs(APP)] == [first.run_id]
        assert kinds(store, first.run_id) == ["initialized"]

    def test_runs_without_key_are_distinct(self, store: port.Store) -> None:
        one = start(store, workflow="wf")
        two = start(store, workflow="wf")
        assert one.run_id != two.run_id
        assert {r.run_id for r in store.list_runs(APP)} == {one.run_id, two.run_id}

    def test_same_key_in_two_apps_makes_two_runs(self, store: port.Store) -> None:
        mine, created = store.create_run(new_run(app=APP, key="shared"))
        theirs, created_theirs = store.create_run(new_run(app=OTHER_APP, key="shared"))
        assert (created, created_theirs) == (True, True)
        assert mine.run_id != theirs.run_id
        assert [r.run_id for r in store.list_runs(APP)] == [mine.run_id]
        assert [r.run_id for r in store.list_runs(OTHER_APP)] == [theirs.run_id]

    def test_concurrent_create_run_with_one_key_creates_one_run(self, handle: StoreHandle) -> None:
        stores = [handle.reopen() for _ in range(self.thread_count)]
        news = [new_run(workflow="wf", key="same") for _ in stores]
        results = run_threads(
            [functools.partial(s.create_run, n) for s, n in zip(stores, news, strict=True)]
        )
        assert sum(created for _, created in results) == 1
        assert len({run.run_id for run, _ in results}) == 1
        winner = next(run for run, created in results if created)
        assert winner.run_id in {n.run_id for n in news}
        assert [r.run_id for r in handle.store.list_runs(APP)] == [winner.run_id]
        assert kinds(handle.store, winner.run_id) == ["initialized"]

    def test_create_run_from_several_processes_creates_one_run(
        self, handle: StoreHandle, clock: clocks.FakeClock
    ) -> None:
        if not self.processes:
            pytest.skip("this adapter is not tested across processes")
        common = (handle.opener, handle.url, clock.now(), handle.ledger_limit)
        news = [new_run(workflow="wf", key="same") for _ in range(3)]
        results = run_processes(_create_in_process, [(*common, n) for n in news])
        assert sorted(created for _, created in results) == [False, False, True]
        assert len({run_id for run_id, _ in results}) == 1
        assert [r.run_id for r in handle.store.list_runs(APP)] == [results[0][0]]

    def test_list_runs_newest_first_with_filters(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        made = []
        for workflow in ("a", "b", "a"):
            made.append(start(store, workflow=workflow))
            clock.advance(1)
        start(store, app=OTHER_APP, workflow="a")
        ids = [r.run_id for r in made]
        assert [r.run_id for r in store.list_runs(APP)] == ids[::-1]
        assert [r.run_id for r in store.list_runs(APP, limit=2)] == [ids[2], ids[1]]
        assert [r.run_id for r in store.list_runs(APP, workflow="a")] == [ids[2], ids[0]]
        claim_run(store, made[1])
        assert [r.run_id for r in store.list_runs(APP, state="running")] == [ids[1]]
        assert [r.run_id for r in store.list_runs(APP, state="queued")] == [ids[2], ids[0]]
        assert store.list_runs(APP, state="succeeded") == []

    # == claim =============================================================

    def test_claim_takes_only_ready_runs_of_the_app_and_listed_workflows(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        target = start(store, workflow="wf", version="1")
        start(store, workflow="wf", version="2")
        start(store, workflow="other", version="1")
        start(store, app=OTHER_APP, workflow="wf", version="1")
        claimed = store.claim(APP, WORKER, [("wf", "1")], lease_ttl=TTL, limit=10)
        assert [c.run.run_id for c in claimed] == [target.run_id]
        got = claimed[0]
        assert got.claim == port.Claim(
            run_id=target.run_id,
            worker=WORKER,
            generation=1,
            lease_expires_at=clock.now() + timedelta(seconds=TTL),
        )
        assert (got.run.state, got.run.worker, got.run.generation) == ("running", WORKER, 1)
        assert got.run.lease_expires_at == got.claim.lease_expires_at
        assert (got.journal, got.outcomes, got.recovered) == ([], [], False)
        assert get(store, target.run_id) == got.run
        assert store.claim(APP, WORKER, [("wf", "1")], lease_ttl=TTL, limit=10) == []
        assert store.claim(APP, WORKER, [], lease_ttl=TTL, limit=10) == []

    def test_claim_respects_limit(self, store: port.Store) -> None:
        ids = {start(store, workflow="wf").run_id for _ in range(5)}
        first = store.claim(APP, WORKER, [("wf", "1")], lease_ttl=TTL, limit=3)
        second = store.claim(APP, WORKER, [("wf", "1")], lease_ttl=TTL, limit=3)
        assert (len(first), len(second)) == (3, 2)
        assert {c.run.run_id for c in first + second} == ids
        assert store.claim(APP, WORKER, [("wf", "1")], lease_ttl=TTL, limit=3) == []

    def test_claim_appends_claimed_receipt(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run = start(store)
        clock.advance(2)
        claim_run(store, run)
        history = store.history(run.run_id)
        assert [(r.sequence, r.kind) for r in history] == [(1, "initialized"), (2, "claimed")]
        assert (history[1].generation, history[1].worker, history[1].at) == (
            1,
            WORKER,
            clock.now(),
        )
        assert get(store, run.run_id).ledger_sequence == 2

    def test_concurrent_claims_take_each_run_once(self, handle: StoreHandle) -> None:
        ids = {start(handle.store, workflow="wf").run_id for _ in range(24)}
        stores = [handle.reopen() for _ in range(self.thread_count)]

        def drain(s: port.Store) -> list[tuple[str, int]]:
            got: list[tuple[str, int]] = []
            while claimed := s.claim(APP, WORKER, [("wf", "1")], lease_ttl=TTL, limit=2):
                got.extend((c.run.run_id, c.claim.generation) for c in claimed)
            return got

        results = run_threads([functools.partial(drain, s) for s in stores])
        taken = [pair for got in results for pair in got]
        assert sorted(run_id for run_id, _ in taken) == sorted(ids)
        assert {generation for _, generation in taken} == {1}
        assert {r.state for r in handle.store.list_runs(APP)} == {"running"}

    def test_claims_from_several_processes_take_each_run_once(
        self, handle: StoreHandle, clock: clocks.FakeClock
    ) -> None:
        if not self.processes:
            pytest.skip("this adapter is not tested across processes")
        ids = {start(handle.store, workflow="wf").run_id for _ in range(30)}
        common = (handle.opener, handle.url, clock.now(), handle.ledger_limit)
        results = run_processes(
            _claim_in_process,
            [(*common, APP, [("wf", "1")], f"proc-{i}") for i in range(3)],
        )
        taken = [pair for (got, _) in results for pair in got]
        assert sorted(run_id for run_id, _ in taken) == sorted(ids)
        assert {generation for _, generation in taken} == {1}

    def test_generation_grows_by_one_per_claim(self, store: port.Store) -> None:
        run = start(store)
        for expected in (1, 2, 3):
            claimed = claim_run(store, run)
            assert claimed.claim.generation == expected
            assert claimed.run.generation == expected
            store.release(claimed.claim, delay=0, failed=False)
        generations = [r.generation for r in store.history(run.run_id) if r.kind == "claimed"]
        assert generations == [1, 2, 3]

    def test_lapsed_lease_is_recovered_by_the_next_claim(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run = start(store)
        first = claim_run(store, run, lease_ttl=10)
        clock.advance(9)
        assert store.claim(APP, OTHER_WORKER, [(run.workflow, "1")], lease_ttl=TTL) == []
        clock.advance(2)
        again = claim_run(store, run, worker=OTHER_WORKER)
        assert again.recovered is True
        assert again.claim.generation == first.claim.generation + 1 == 2
        assert (again.run.state, again.run.worker, again.run.failures) == (
            "running",
            OTHER_WORKER,
            1,
        )
        assert again.claim.lease_expires_at == clock.now() + timedelta(seconds=TTL)
        assert kinds(store, run.run_id) == ["initialized", "claimed", "recovered"]
        recovered = store.history(run.run_id)[-1]
        assert (recovered.generation, recovered.worker) == (2, OTHER_WORKER)
        clock.advance(TTL + 1)
        third = claim_run(store, run)
        assert (third.recovered, third.run.failures, third.claim.generation) == (True, 2, 3)

    def test_queued_run_with_future_ready_at_waits_for_the_clock(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run = start(store)
        claimed = claim_run(store, run)
        store.release(claimed.claim, delay=60, failed=False)
        assert get(store, run.run_id).ready_at == clock.now() + timedelta(seconds=60)
        assert store.claim(APP, WORKER, [(run.workflow, "1")], lease_ttl=TTL) == []
        clock.advance(59)
        assert store.claim(APP, WORKER, [(run.workflow, "1")], lease_ttl=TTL) == []
        clock.advance(2)
        again = claim_run(store, run)
        assert (again.recovered, again.claim.generation) == (False, 2)

    def test_waiting_run_is_claimable_once_its_ready_at_passes(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run = start(store)
        claimed = claim_run(store, run)
        wake_at = clock.now() + timedelta(seconds=100)
        assert store.park(claimed.claim, [entry(1, kind="sleep")], [], wake_at=wake_at) is True
        assert store.claim(APP, WORKER, [(run.workflow, "1")], lease_ttl=TTL) == []
        clock.advance(101)
        again = claim_run(store, run)
        assert (again.recovered, again.claim.generation, again.run.failures) == (False, 2, 0)
        assert again.journal == [entry(1, kind="sleep")]
        assert kinds(store, run.run_id)[-1] == "claimed"

    def test_claimed_carries_journal_and_outcomes(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run = start(store)
        first = claim_run(store, run)
        entries = [entry(1), entry(2, name="approval", kind="wait")]
        assert store.park(first.claim, entries, [port.WaitSpec("approval", "signal")], wake_at=None)
        stored, created = store.settle_wait(
            run.run_id, "approval", signaled(run.run_id, "approval", clock.now())
        )
        assert created
        again = claim_run(store, run)
        assert again.journal == entries
        assert again.outcomes == [stored]
        assert again.run.state == "running"

    # == fencing ===========================================================

    def _stale_claim(self, store: port.Store, clock: clocks.FakeClock, how: str) -> port.Claim:
        run = start(store)
        claimed = claim_run(store, run)
        old = claimed.claim
        if how == "lease_lapsed_and_reclaimed":
            clock.advance(TTL + 1)
            claim_run(store, run, worker=OTHER_WORKER)
        elif how == "released_and_reclaimed":
            store.release(old, delay=0, failed=False)
            claim_run(store, run, worker=OTHER_WORKER)
        elif how == "released":
            store.release(old, delay=0, failed=False)
        elif how == "parked":
            assert store.park(old, [], [port.WaitSpec("other", "signal")], wake_at=None)
        elif how == "finished":
            store.finish(old, [], state="succeeded", result="0")
        elif how == "canceled_and_reclaimed":
            assert store.request_cancel(run.run_id) is True
            clock.advance(TTL + 1)
            again = claim_run(store, run, worker=OTHER_WORKER)
            assert again.run.cancel_requested is True
        else:  # pragma: no cover - a typo in the parametrization
            raise AssertionError(how)
        return old

    @pytest.mark.parametrize("write", sorted(FENCED_WRITES))
    @pytest.mark.parametrize(
        "how",
        [
            "lease_lapsed_and_reclaimed",
            "released_and_reclaimed",
            "released",
            "parked",
            "finished",
            "canceled_and_reclaimed",
        ],
    )
    def test_stale_claim_writes_nothing(
        self, store: port.Store, clock: clocks.FakeClock, how: str, write: str
    ) -> None:
        old = self._stale_claim(store, clock, how)
        before = snapshot(store)
        with pytest.raises(errors.StaleClaim):
            FENCED_WRITES[write](store, old)
        assert snapshot(store) == before

    @pytest.mark.parametrize("write", sorted(FENCED_WRITES))
    def test_cancel_requested_fences_writes(
        self, store: port.Store, clock: clocks.FakeClock, write: str
    ) -> None:
        run = start(store)
        claimed = claim_run(store, run)
        assert store.request_cancel(run.run_id) is True
        current = get(store, run.run_id)
        assert (current.state, current.cancel_requested) == ("running", True)
        before = snapshot(store)
        if write in _SETTLES_CANCELED:
            FENCED_WRITES[write](store, claimed.claim)
            ended = get(store, run.run_id)
            assert ended.state == _FINISHES[write]
            assert (ended.worker, ended.lease_expires_at) == (None, None)
            expected = "canceled" if write == "finish_canceled" else "finished"
            assert kinds(store, run.run_id)[-1] == expected
        else:
            with pytest.raises(errors.Canceled):
                FENCED_WRITES[write](store, claimed.claim)
            assert snapshot(store) == before

    @pytest.mark.parametrize("write", sorted(FENCED_WRITES))
    def test_canceling_claim_may_still_write(
        self, store: port.Store, clock: clocks.FakeClock, write: str
    ) -> None:
        run = start(store)
        claimed = claim_run(store, run)
        assert store.request_cancel(run.run_id) is True
        canceling = dataclasses.replace(claimed.claim, canceling=True)
        if write == "transaction_step":
            recorded = store.transaction_step(canceling, [], lambda _: entry(1))
            assert recorded == entry(1)
        else:
            FENCED_WRITES[write](store, canceling)
        after = get(store, run.run_id)
        if write in ("begin_effect", "finish_step", "transaction_step", "renew"):
            assert (after.state, after.generation) == ("running", 1)
        if write in ("begin_effect", "finish_step", "transaction_step"):
            assert [e.position for e in store.journal(run.run_id)] == [1]
        if write in _FINISHES:
            assert after.state == _FINISHES[write]

    def test_renew_tells_stale_from_canceled(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        stale = self._stale_claim(store, clock, "lease_lapsed_and_reclaimed")
        with pytest.raises(errors.StaleClaim) as raised:
            store.renew(stale, lease_ttl=TTL)
        assert not isinstance(raised.value, errors.Canceled)
        run = start(store)
        claimed = claim_run(store, run)
        store.request_cancel(run.run_id)
        with pytest.raises(errors.Canceled) as canceled:
            store.renew(claimed.claim, lease_ttl=TTL)
        assert not isinstance(canceled.value, errors.StaleClaim)
        assert canceled.value.run_id == run.run_id

    def test_renew_extends_the_lease_of_the_current_claim(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run = start(store)
        claimed = claim_run(store, run, lease_ttl=10)
        clock.advance(8)
        renewed = store.renew(claimed.claim, lease_ttl=10)
        assert renewed == dataclasses.replace(
            claimed.claim, lease_expires_at=clock.now() + timedelta(seconds=10)
        )
        clock.advance(8)
        assert store.claim(APP, OTHER_WORKER, [(run.workflow, "1")], lease_ttl=TTL) == []
        assert get(store, run.run_id).generation == 1

    # == release ===========================================================

    def test_release_requeues_and_counts_failures(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run = start(store)
        claimed = claim_run(store, run)
        store.release(claimed.claim, delay=0, failed=False)
        released = get(store, run.run_id)
        assert (released.state, released.failures, released.worker) == ("queued", 0, None)
        assert released.lease_expires_at is None
        assert kinds(store, run.run_id)[-1] == "released"

        claimed = claim_run(store, run)
        store.release(claimed.claim, delay=30, failed=True)
        backoff = get(store, run.run_id)
        assert (backoff.state, backoff.failures) == ("queued", 1)
        assert backoff.ready_at == clock.now() + timedelta(seconds=30)
        assert store.claim(APP, WORKER, [(run.workflow, "1")], lease_ttl=TTL) == []
        clock.advance(31)
        claimed = claim_run(store, run)
        assert claimed.run.failures == 1
        store.release(claimed.claim, delay=0, failed=True)
        assert get(store, run.run_id).failures == 2
        claimed = claim_run(store, run)
        store.finish_step(claimed.claim, [entry(1)])
        assert get(store, run.run_id).failures == 0

    def test_finish_step_resets_failures_after_recovery(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run = start(store)
        claim_run(store, run, lease_ttl=5)
        clock.advance(6)
        recovered = claim_run(store, run)
        assert recovered.run.failures == 1
        store.finish_step(recovered.claim, [entry(1)])
        assert get(store, run.run_id).failures == 0

    def test_release_appends_marks(self, store: port.Store) -> None:
        run = start(store)
        claimed = claim_run(store, run)
        store.release(
            claimed.claim, delay=0, failed=True, marks=[port.Mark("step_failed", step="s")]
        )
        history = store.history(run.run_id)
        assert [r.sequence for r in history] == [1, 2, 3, 4]
        assert sorted(r.kind for r in history[2:]) == ["released", "step_failed"]

    # == journal ===========================================================

    def test_journal_orders_entries_by_position(self, store: port.Store) -> None:
        run = start(store)
        claim = claim_run(store, run).claim
        third = dataclasses.replace(entry(3, "error"), attempt=3)
        store.finish_step(claim, [entry(2), entry(1)])
        store.finish_step(claim, [third])
        assert store.journal(run.run_id) == [entry(1), entry(2), third]

    def test_begin_effect_then_finish_step_replaces_the_started_entry(
        self, store: port.Store
    ) -> None:
        run = start(store)
        claim = claim_run(store, run).claim
        store.begin_effect(claim, [entry(1), entry(2, "started", name="charge")])
        assert store.journal(run.run_id) == [entry(1), entry(2, "started", name="charge")]
        store.begin_effect(claim, [entry(2, "started", name="charge")])
        assert store.journal(run.run_id) == [entry(1), entry(2, "started", name="charge")]
        done = dataclasses.replace(entry(2, name="charge"), attempt=2)
        store.finish_step(claim, [done, entry(3)])
        assert store.journal(run.run_id) == [entry(1), done, entry(3)]

    @pytest.mark.parametrize("operation", ["begin_effect", "finish_step", "transaction_step"])
    @pytest.mark.parametrize("existing", ["ok", "error"])
    def test_recorded_entry_is_never_replaced(
        self, store: port.Store, operation: str, existing: port.EntryStatus
    ) -> None:
        run = start(store)
        claim = claim_run(store, run).claim
        store.finish_step(claim, [entry(1, existing)])
        before = snapshot(store)
        replacement = [entry(2), entry(1, "started" if operation == "begin_effect" else "ok")]
        with pytest.raises(errors.CorruptState):
            if operation == "begin_effect":
                store.begin_effect(claim, replacement)
            elif operation == "finish_step":
                store.finish_step(claim, replacement)
            else:
                store.transaction_step(claim, [entry(2)], lambda _: entry(1))
        assert snapshot(store) == before

    def test_journal_writes_append_marks(self, store: port.Store, clock: clocks.FakeClock) -> None:
        run = start(store)
        claim = claim_run(store, run).claim
        clock.advance(1)
        store.begin_effect(
            claim,
            [entry(1, "started", name="charge")],
            marks=[port.Mark("effect_started", step="charge", digest="d-1", note="n")],
        )
        store.finish_step(claim, [entry(1, name="charge")], marks=[port.Mark("step_completed")])
        history = store.history(run.run_id)
        assert [(r.sequence, r.kind) for r in history] == [
            (1, "initialized"),
            (2, "claimed"),
            (3, "effect_started"),
            (4, "step_completed"),
        ]
        effect = history[2]
        assert (effect.step, effect.digest, effect.note) == ("charge", "d-1", "n")
        assert (effect.generation, effect.worker, effect.at) == (1, WORKER, clock.now())
        assert (history[3].step, history[3].digest, history[3].note) == (None, None, None)

    # == transaction_step ==================================================

    def test_transaction_step_commits_body_writes_with_the_entry(self, store: port.Store) -> None:
        run = start(store)
        claim = claim_run(store, run).claim
        calls: list[str] = []

        def body(connection: Any) -> port.JournalEntry:
            calls.append("body")
            self.side_write(connection, "k1")
            return entry(2, name="tx")

        recorded = store.transaction_step(claim, [entry(1)], body)
        assert recorded == entry(2, name="tx")
        assert calls == ["body"]
        assert store.journal(run.run_id) == [entry(1), entry(2, name="tx")]
        assert self._read_side(store, claim, 3) == ["k1"]

    def test_transaction_step_body_that_raises_stores_nothing(self, store: port.Store) -> None:
        run = start(store)
        claim = claim_run(store, run).claim
        store.finish_step(claim, [entry(1)])
        before = snapshot(store)

        class BodyFailed(Exception):
            pass

        failure = BodyFailed("no")

        def body(connection: Any) -> port.JournalEntry:
            self.side_write(connection, "k1")
            raise failure

        with pytest.raises(BodyFailed) as raised:
            store.transaction_step(claim, [entry(2)], body)
        assert raised.value is failure
        assert snapshot(store) == before
        assert self._read_side(store, claim, 2) == []
        assert [e.position for e in store.journal(run.run_id)] == [1, 2]

    # == park and wake =====================================================

    def test_park_registers_waits_and_makes_the_run_waiting(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run = start(store)
        claim = claim_run(store, run).claim
        clock.advance(1)
        deadline = clock.now() + timedelta(seconds=50)
        waits = [port.WaitSpec("approval", "signal", deadline), port.WaitSpec("inbox", "channel")]
        parked = store.park(claim, [entry(1)], waits, wake_at=clock.now() + timedelta(seconds=100))
        assert parked is True
        after = get(store, run.run_id)
        assert (after.state, after.worker, after.lease_expires_at) == ("waiting", None, None)
        assert after.ready_at == deadline
        assert store.journal(run.run_id) == [entry(1)]
        assert set(store.waits(APP, run.run_id)) == {
            port.WaitRecord(run.run_id, APP, "approval", "signal", deadline, clock.now()),
            port.WaitRecord(run.run_id, APP, "inbox", "channel", None, clock.now()),
        }
        assert kinds(store, run.run_id)[-1] == "parked"

    def test_park_without_deadline_has_no_ready_at(self, store: port.Store) -> None:
        run = start(store)
        claim = claim_run(store, run).claim
        assert store.park(claim, [], [port.WaitSpec("go", "signal")], wake_at=None) is True
        assert get(store, run.run_id).ready_at is None

    def test_wake_is_conditional_on_waiting(self, store: port.Store) -> None:
        run = start(store)
        assert store.wake(run.run_id) is False
        claim = claim_run(store, run).claim
        assert store.wake(run.run_id) is False
        assert get(store, run.run_id).state == "running"
        assert store.park(claim, [], [port.WaitSpec("go", "signal")], wake_at=None) is True
        assert store.wake(run.run_id) is True
        assert get(store, run.run_id).state == "queued"
        assert store.wake(run.run_id) is False
        again = claim_run(store, run)
        assert again.claim.generation == 2
        store.finish(again.claim, [], state="succeeded", result="1")
        assert store.wake(run.run_id) is False
        assert get(store, run.run_id).state == "succeeded"

    def _assert_not_parked(
        self, store: port.Store, claimed: port.Claimed, entries: list[port.JournalEntry]
    ) -> None:
        run_id = claimed.run.run_id
        after = get(store, run_id)
        assert (after.state, after.generation, after.worker) == ("running", 1, WORKER)
        assert store.journal(run_id) == entries
        assert "parked" not in kinds(store, run_id)
        store.renew(claimed.claim, lease_ttl=TTL)
        store.finish_step(claimed.claim, [entry(len(entries) + 1)])

    def test_outcome_recorded_before_park_keeps_the_run(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run = start(store)
        claimed = claim_run(store, run)
        stored, created = store.settle_wait(
            run.run_id, "approval", signaled(run.run_id, "approval", clock.now())
        )
        assert created
        assert get(store, run.run_id).state == "running"
        entries = [entry(1, kind="wait", name="approval")]
        parked = store.park(
            claimed.claim, entries, [port.WaitSpec("approval", "signal")], wake_at=None
        )
        assert parked is False
        self._assert_not_parked(store, claimed, entries)
        assert store.outcomes(run.run_id) == [stored]

    def test_message_sent_before_park_keeps_the_run(self, store: port.Store) -> None:
        run = start(store)
        claimed = claim_run(store, run)
        assert store.send(port.NewMessage(run.run_id, "inbox", "m1", '"hi"')) is True
        first = store.next_message(run.run_id, "inbox", 0)
        assert first is not None
        waits = [port.WaitSpec("inbox", "channel", after_sequence=0)]
        entries = [entry(1, kind="receive", name="inbox")]
        assert store.park(claimed.claim, entries, waits, wake_at=None) is False
        self._assert_not_parked(store, claimed, entries)
        consumed = [port.WaitSpec("inbox", "channel", after_sequence=first.sequence)]
        assert store.park(claimed.claim, [], consumed, wake_at=None) is True
        assert get(store, run.run_id).state == "waiting"

    @pytest.mark.parametrize("due", ["wake_at_now", "wake_at_past", "deadline_past"])
    def test_due_instant_at_park_keeps_the_run(
        self, store: port.Store, clock: clocks.FakeClock, due: str
    ) -> None:
        run = start(store)
        claimed = claim_run(store, run)
        clock.advance(10)
        now = clock.now()
        entries = [entry(1, kind="sleep")]
        if due == "deadline_past":
            waits = [port.WaitSpec("approval", "signal", deadline=now - timedelta(seconds=1))]
            parked = store.park(claimed.claim, entries, waits, wake_at=None)
        else:
            wake_at = now if due == "wake_at_now" else now - timedelta(seconds=5)
            parked = store.park(claimed.claim, entries, [], wake_at=wake_at)
        assert parked is False
        self._assert_not_parked(store, claimed, entries)

    def test_finished_child_before_park_keeps_the_run(self, store: port.Store) -> None:
        parent = start(store)
        claimed = claim_run(store, parent)
        [child] = store.create_children(claimed.claim, [new_run(key="c", parent_id=parent.run_id)])
        child_claim = claim_run(store, child).claim
        store.finish(child_claim, [], state="succeeded", result='"done"')
        name = f"child:{child.run_id}"
        entries = [entry(1, kind="child", name=name)]
        parked = store.park(claimed.claim, entries, [port.WaitSpec(name, "child")], wake_at=None)
        assert parked is False
        self._assert_not_parked(store, claimed, entries)

    def test_settle_wait_after_park_wakes_the_run(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run = start(store)
        claim = claim_run(store, run).claim
        assert store.park(claim, [], [port.WaitSpec("approval", "signal")], wake_at=None)
        clock.advance(1)
        stored, created = store.settle_wait(
            run.run_id, "approval", signaled(run.run_id, "approval", clock.now())
        )
        assert created
        assert stored == signaled(run.run_id, "approval", clock.now())
        woken = get(store, run.run_id)
        assert woken.state == "queued"
        assert kinds(store, run.run_id)[-2:] == ["parked", "woken"]
        assert store.waits(APP, run.run_id) == []
        assert store.journal(run.run_id) == []

    def test_send_after_park_wakes_a_run_waiting_on_that_channel(self, store: port.Store) -> None:
        run = start(store)
        claim = claim_run(store, run).claim
        waits = [port.WaitSpec("a", "channel")]
        assert store.park(claim, [], waits, wake_at=None) is True
        assert store.send(port.NewMessage(run.run_id, "ab", "m1", "1")) is True
        assert store.send(port.NewMessage(run.run_id, "other", "m1", "1")) is True
        assert get(store, run.run_id).state == "waiting"
        assert store.send(port.NewMessage(run.run_id, "a", "m1", "2")) is True
        assert get(store, run.run_id).state == "queued"
        assert store.journal(run.run_id) == []

    def test_park_racing_settle_wait_never_loses_the_wake(
        self, handle: StoreHandle, clock: clocks.FakeClock
    ) -> None:
        store, other = handle.store, handle.reopen()
        for _ in range(8):
            run = start(store)
            claimed = claim_run(store, run)
            waits = [port.WaitSpec("go", "signal")]
            outcome = signaled(run.run_id, "go", clock.now())
            parked, (_, created) = run_threads(
                [
                    functools.partial(store.park, claimed.claim, [], waits, wake_at=None),
                    functools.partial(other.settle_wait, run.run_id, "go", outcome),
                ]
            )
            assert created is True
            after = get(store, run.run_id)
            assert after.state == ("queued" if parked else "running"), (parked, after.state)

    def test_park_racing_send_never_loses_the_wake(self, handle: StoreHandle) -> None:
        store, other = handle.store, handle.reopen()
        for _ in range(8):
            run = start(store)
            claimed = claim_run(store, run)
            waits = [port.WaitSpec("inbox", "channel")]
            message = port.NewMessage(run.run_id, "inbox", "m", "1")
            parked, sent = run_threads(
                [
                    functools.partial(store.park, claimed.claim, [], waits, wake_at=None),
                    functools.partial(other.send, message),
                ]
            )
            assert sent is True
            after = get(store, run.run_id)
            assert after.state == ("queued" if parked else "running"), (parked, after.state)

    # == settle_wait =======================================================

    def test_settle_wait_is_put_if_absent(self, store: port.Store, clock: clocks.FakeClock) -> None:
        run = start(store)
        first = signaled(run.run_id, "approval", clock.now(), signal_id="s1", payload="1")
        stored, created = store.settle_wait(run.run_id, "approval", first)
        assert (stored, created) == (first, True)
        clock.advance(1)
        later = signaled(run.run_id, "approval", clock.now(), signal_id="s2", payload="2")
        assert store.settle_wait(run.run_id, "approval", later) == (first, False)
        timeout = dataclasses.replace(later, outcome="timed_out", signal_id=None, payload=None)
        assert store.settle_wait(run.run_id, "approval", timeout) == (first, False)
        assert store.outcomes(run.run_id) == [first]
        assert get(store, run.run_id).state == "queued"
        assert store.journal(run.run_id) == []

    def test_concurrent_settle_wait_has_exactly_one_winner(
        self, handle: StoreHandle, clock: clocks.FakeClock
    ) -> None:
        store = handle.store
        run = start(store)
        claim = claim_run(store, run).claim
        assert store.park(claim, [], [port.WaitSpec("approval", "signal")], wake_at=None)
        kinds_cycle: list[port.OutcomeKind] = ["signaled", "timed_out", "canceled"]
        candidates = []
        for i in range(self.thread_count):
            kind = kinds_cycle[i % 3]
            candidates.append(
                port.Outcome(
                    run_id=run.run_id,
                    name="approval",
                    outcome=kind,
                    signal_id=f"sig-{i}" if kind == "signaled" else None,
                    payload=json.dumps({"i": i}) if kind == "signaled" else None,
                    payload_digest=f"d-{i}" if kind == "signaled" else None,
                    at=clock.now(),
                )
            )
        stores = [handle.reopen() for _ in candidates]
        results = run_threads(
            [
                functools.partial(s.settle_wait, run.run_id, "approval", o)
                for s, o in zip(stores, candidates, strict=True)
            ]
        )
        assert sum(created for _, created in results) == 1
        winner = next(stored for stored, created in results if created)
        assert winner in candidates
        assert all(stored == winner for stored, _ in results)
        assert store.outcomes(run.run_id) == [winner]
        assert get(store, run.run_id).state == "queued"
        assert kinds(store, run.run_id).count("woken") == 1

    def test_signal_after_deadline_is_stored_as_timed_out(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run = start(store)
        claim = claim_run(store, run).claim
        deadline = clock.now() + timedelta(seconds=10)
        waits = [port.WaitSpec("approval", "signal", deadline)]
        assert store.park(claim, [], waits, wake_at=None) is True
        clock.advance(11)
        stored, created = store.settle_wait(
            run.run_id, "approval", signaled(run.run_id, "approval", clock.now())
        )
        assert created is True
        assert (stored.run_id, stored.name, stored.outcome) == (run.run_id, "approval", "timed_out")
        assert stored.payload is None
        assert store.outcomes(run.run_id) == [stored]
        assert get(store, run.run_id).state == "queued"
        late = signaled(run.run_id, "approval", clock.now(), signal_id="s2")
        assert store.settle_wait(run.run_id, "approval", late) == (stored, False)

    def test_signal_before_deadline_is_stored_as_sent(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run = start(store)
        claim = claim_run(store, run).claim
        deadline = clock.now() + timedelta(seconds=10)
        assert store.park(claim, [], [port.WaitSpec("approval", "signal", deadline)], wake_at=None)
        clock.advance(9)
        sent = signaled(run.run_id, "approval", clock.now())
        assert store.settle_wait(run.run_id, "approval", sent) == (sent, True)

    def test_settle_wait_refusals(self, store: port.Store, clock: clocks.FakeClock) -> None:
        missing = str(uuid.uuid4())
        with pytest.raises(errors.RunNotFound) as not_found:
            store.settle_wait(missing, "w", signaled(missing, "w", clock.now()))
        assert not_found.value.run_id == missing
        run = start(store)
        claim = claim_run(store, run).claim
        store.finish(claim, [], state="succeeded", result="1")
        before = snapshot(store)
        with pytest.raises(errors.RunFinished) as finished:
            store.settle_wait(run.run_id, "w", signaled(run.run_id, "w", clock.now()))
        assert (finished.value.run_id, finished.value.state) == (run.run_id, "succeeded")
        assert snapshot(store) == before

    def test_settle_wait_on_running_run_does_not_wake_it(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run = start(store)
        claimed = claim_run(store, run)
        outcome = signaled(run.run_id, "later", clock.now())
        assert store.settle_wait(run.run_id, "later", outcome) == (outcome, True)
        after = get(store, run.run_id)
        assert (after.state, after.generation, after.worker) == ("running", 1, WORKER)
        assert "woken" not in kinds(store, run.run_id)
        store.renew(claimed.claim, lease_ttl=TTL)

    # == send and channels =================================================

    def test_send_deduplicates_by_run_channel_and_key(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run = start(store)
        other = start(store)
        assert store.send(port.NewMessage(run.run_id, "inbox", "k", "1")) is True
        assert store.send(port.NewMessage(run.run_id, "inbox", "k", "2")) is False
        assert store.send(port.NewMessage(run.run_id, "outbox", "k", "3")) is True
        assert store.send(port.NewMessage(other.run_id, "inbox", "k", "4")) is True
        [stored] = messages(store, run.run_id, "inbox")
        assert (stored.run_id, stored.channel, stored.key, stored.payload, stored.at) == (
            run.run_id,
            "inbox",
            "k",
            "1",
            clock.now(),
        )
        assert [m.payload for m in messages(store, run.run_id, "outbox")] == ["3"]
        assert [m.payload for m in messages(store, other.run_id, "inbox")] == ["4"]

    def test_messages_keep_their_send_order(self, store: port.Store) -> None:
        run = start(store)
        for channel, key in [("a", "1"), ("b", "1"), ("a", "2"), ("a", "3")]:
            assert store.send(port.NewMessage(run.run_id, channel, key, f'"{channel}{key}"'))
        on_a = messages(store, run.run_id, "a")
        on_b = messages(store, run.run_id, "b")
        assert [m.key for m in on_a] == ["1", "2", "3"]
        assert on_a[0].sequence < on_b[0].sequence < on_a[1].sequence < on_a[2].sequence
        assert store.next_message(run.run_id, "a", on_a[0].sequence) == on_a[1]
        assert store.next_message(run.run_id, "a", on_a[0].sequence + 1) == on_a[1]
        assert store.next_message(run.run_id, "a", on_a[2].sequence) is None

    def test_channel_names_match_exactly(self, store: port.Store) -> None:
        run = start(store)
        for channel in ("ab", "a%", "A", "a_"):
            assert store.send(port.NewMessage(run.run_id, channel, "k", f'"{channel}"'))
        assert store.next_message(run.run_id, "a", 0) is None
        assert [m.payload for m in messages(store, run.run_id, "a%")] == ['"a%"']
        assert [m.payload for m in messages(store, run.run_id, "a_")] == ['"a_"']

    def test_send_refusals(self, store: port.Store) -> None:
        missing = str(uuid.uuid4())
        with pytest.raises(errors.RunNotFound):
            store.send(port.NewMessage(missing, "inbox", "k", "1"))
        run = start(store)
        claim = claim_run(store, run).claim
        store.finish(claim, [], state="failed", error='{"code": "x"}')
        with pytest.raises(errors.RunFinished) as finished:
            store.send(port.NewMessage(run.run_id, "inbox", "k", "1"))
        assert finished.value.state == "failed"
        assert store.next_message(run.run_id, "inbox", 0) is None

    # == waits() ===========================================================

    def test_waits_lists_open_waits_by_app_and_run(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        first, second = start(store), start(store)
        elsewhere = start(store, app=OTHER_APP)
        records = []
        for run, name in ((first, "a"), (second, "b"), (elsewhere, "c")):
            claim = claim_run(store, run).claim
            deadline = clock.now() + timedelta(hours=1)
            assert store.park(claim, [], [port.WaitSpec(name, "signal", deadline)], wake_at=None)
            records.append(
                port.WaitRecord(run.run_id, run.app, name, "signal", deadline, clock.now())
            )
            clock.advance(1)
        assert store.waits(APP) == records[:2]
        assert store.waits(APP, second.run_id) == [records[1]]
        assert store.waits(APP, elsewhere.run_id) == []
        assert store.waits(OTHER_APP) == [records[2]]
        store.settle_wait(first.run_id, "a", signaled(first.run_id, "a", clock.now()))
        assert store.waits(APP) == [records[1]]

    # == end of a run ======================================================

    def test_finish_stores_the_end_and_removes_run_records(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run = start(store)
        claim = claim_run(store, run).claim
        waits = [port.WaitSpec("a", "signal"), port.WaitSpec("b", "signal")]
        assert store.park(claim, [entry(1)], waits, wake_at=None)
        store.settle_wait(run.run_id, "a", signaled(run.run_id, "a", clock.now()))
        assert store.send(port.NewMessage(run.run_id, "inbox", "m", "1"))
        claim = claim_run(store, run).claim
        clock.advance(1)
        store.finish(claim, [entry(2)], state="succeeded", result='{"total": 3}')
        ended = get(store, run.run_id)
        assert (ended.state, ended.result, ended.error) == ("succeeded", '{"total": 3}', None)
        assert (ended.worker, ended.lease_expires_at, ended.updated_at) == (None, None, clock.now())
        assert store.journal(run.run_id) == [entry(1), entry(2)]
        assert store.waits(APP, run.run_id) == []
        assert store.outcomes(run.run_id) == []
        assert store.next_message(run.run_id, "inbox", 0) is None
        assert kinds(store, run.run_id)[-1] == "finished"
        assert store.claim(APP, WORKER, [(run.workflow, "1")], lease_ttl=TTL) == []

    def test_finish_with_error(self, store: port.Store) -> None:
        run = start(store)
        claim = claim_run(store, run).claim
        store.finish(claim, [], state="failed", error='{"code": "workflow_failed"}')
        ended = get(store, run.run_id)
        assert (ended.state, ended.result, ended.error) == (
            "failed",
            None,
            '{"code": "workflow_failed"}',
        )

    def test_create_children_is_idempotent_and_fenced(self, store: port.Store) -> None:
        parent = start(store)
        claim = claim_run(store, parent).claim
        wanted = [
            new_run(key=f"child-{i}", parent_id=parent.run_id, workflow="kid") for i in range(5)
        ]
        children = store.create_children(claim, wanted)
        assert [c.run_id for c in children] == [n.run_id for n in wanted]
        for child, new in zip(children, wanted, strict=True):
            assert (child.state, child.parent_id, child.key, child.app) == (
                "queued",
                parent.run_id,
                new.key,
                APP,
            )
            assert get(store, child.run_id) == child
            assert kinds(store, child.run_id) == ["initialized"]
        replay = [dataclasses.replace(n, run_id=str(uuid.uuid4())) for n in wanted]
        replay.append(new_run(key="child-5", parent_id=parent.run_id, workflow="kid"))
        again = store.create_children(claim, replay)
        assert [c.run_id for c in again[:5]] == [c.run_id for c in children]
        assert again[:5] == [get(store, c.run_id) for c in children]
        assert again[5].run_id == replay[5].run_id
        assert len(store.list_runs(APP, workflow="kid")) == 6
        assert nonzero(store.child_counts(parent.run_id)) == {"queued": 6}
        assert nonzero(store.child_counts(again[0].run_id)) == {}

    def test_child_counts_follow_child_states(self, store: port.Store) -> None:
        parent = start(store)
        claim = claim_run(store, parent).claim
        wanted = [new_run(key=f"c{i}", parent_id=parent.run_id) for i in range(3)]
        kids = store.create_children(claim, wanted)
        running = claim_run(store, kids[0]).claim
        done = claim_run(store, kids[1]).claim
        store.finish(done, [], state="succeeded", result="1")
        assert nonzero(store.child_counts(parent.run_id)) == {
            "queued": 1,
            "running": 1,
            "succeeded": 1,
        }
        store.finish(running, [], state="failed", error='"x"')
        assert nonzero(store.child_counts(parent.run_id)) == {
            "queued": 1,
            "failed": 1,
            "succeeded": 1,
        }

    @pytest.mark.parametrize("end", ["succeeded", "failed", "canceled_by_owner", "request_cancel"])
    def test_child_end_settles_and_wakes_the_waiting_parent(
        self, store: port.Store, clock: clocks.FakeClock, end: str
    ) -> None:
        parent = start(store)
        claim = claim_run(store, parent).claim
        [child] = store.create_children(claim, [new_run(key="c", parent_id=parent.run_id)])
        name = f"child:{child.run_id}"
        waits = [port.WaitSpec(name, "child")]
        assert store.park(claim, [entry(1, kind="child", name=name)], waits, wake_at=None)
        assert store.waits(APP, parent.run_id)[0].kind == "child"
        result, error, state = None, None, "canceled"
        if end == "request_cancel":
            assert store.request_cancel(child.run_id) is True
        else:
            child_claim = claim_run(store, child).claim
            if end == "succeeded":
                result, state = '{"total": 7}', "succeeded"
                store.finish(child_claim, [], state="succeeded", result=result)
            elif end == "failed":
                error, state = '{"code": "boom"}', "failed"
                store.finish(child_claim, [], state="failed", error=error)
            else:
                store.finish(child_claim, [], state="canceled")
        [outcome] = store.outcomes(parent.run_id)
        assert (outcome.run_id, outcome.name) == (parent.run_id, name)
        payload = child_payload(outcome)
        assert (payload["run_id"], payload["state"]) == (child.run_id, state)
        assert same_json(payload["result"], result), payload
        assert same_json(payload["error"], error), payload
        assert get(store, parent.run_id).state == "queued"
        assert store.waits(APP, parent.run_id) == []
        again = claim_run(store, parent)
        assert again.outcomes == [outcome]

    def test_child_end_while_parent_runs_leaves_the_parent_running(self, store: port.Store) -> None:
        parent = start(store)
        claimed = claim_run(store, parent)
        [child] = store.create_children(claimed.claim, [new_run(key="c", parent_id=parent.run_id)])
        store.finish(claim_run(store, child).claim, [], state="succeeded", result="1")
        [outcome] = store.outcomes(parent.run_id)
        assert outcome.name == f"child:{child.run_id}"
        assert get(store, parent.run_id).state == "running"
        store.renew(claimed.claim, lease_ttl=TTL)

    # == request_cancel ====================================================

    def test_request_cancel_walks_the_tree(self, store: port.Store) -> None:
        root = start(store)
        root_claim = claim_run(store, root).claim
        queued, waiting = store.create_children(
            root_claim,
            [new_run(key="a", parent_id=root.run_id), new_run(key="b", parent_id=root.run_id)],
        )
        waiting_claim = claim_run(store, waiting).claim
        [running] = store.create_children(
            waiting_claim, [new_run(key="c", parent_id=waiting.run_id)]
        )
        assert store.park(waiting_claim, [], [port.WaitSpec("s", "signal")], wake_at=None)
        running_claim = claim_run(store, running).claim

        assert store.request_cancel(root.run_id) is True
        states = {
            r.run_id: (r.state, r.cancel_requested)
            for r in (get(store, x.run_id) for x in (root, queued, waiting, running))
        }
        assert states[root.run_id] == ("running", True)
        assert states[queued.run_id][0] == "canceled"
        assert states[waiting.run_id][0] == "canceled"
        assert states[running.run_id] == ("running", True)
        assert store.waits(APP, waiting.run_id) == []
        assert store.outcomes(waiting.run_id) == []
        settled = {o.name: child_payload(o)["state"] for o in store.outcomes(root.run_id)}
        assert settled == {
            f"child:{queued.run_id}": "canceled",
            f"child:{waiting.run_id}": "canceled",
        }
        assert nonzero(store.child_counts(root.run_id)) == {"canceled": 2}
        for run_id in (root.run_id, queued.run_id, waiting.run_id, running.run_id):
            sequences = [r.sequence for r in store.history(run_id)]
            assert sequences == list(range(1, len(sequences) + 1))

        assert store.request_cancel(root.run_id) is False
        with pytest.raises(errors.Canceled):
            store.finish_step(running_claim, [entry(1)])
        store.finish(running_claim, [], state="canceled")
        assert get(store, running.run_id).state == "canceled"
        with pytest.raises(errors.Canceled):
            store.renew(root_claim, lease_ttl=TTL)

    def test_request_cancel_of_a_queued_run(self, store: port.Store) -> None:
        run = start(store)
        assert store.request_cancel(run.run_id) is True
        canceled = get(store, run.run_id)
        assert (canceled.state, canceled.worker) == ("canceled", None)
        assert store.claim(APP, WORKER, [(run.workflow, "1")], lease_ttl=TTL) == []
        assert store.request_cancel(run.run_id) is False

    def test_request_cancel_refusals(self, store: port.Store) -> None:
        missing = str(uuid.uuid4())
        with pytest.raises(errors.RunNotFound):
            store.request_cancel(missing)
        run = start(store)
        store.finish(claim_run(store, run).claim, [], state="succeeded", result="1")
        before = snapshot(store)
        assert store.request_cancel(run.run_id) is False
        assert snapshot(store) == before

    # == resolve ===========================================================

    def _needs_attention(self, store: port.Store) -> tuple[port.Run, port.Claim]:
        run = start(store)
        claim = claim_run(store, run).claim
        store.begin_effect(claim, [entry(1), entry(2, "started", name="charge")])
        store.finish(claim, [], state="needs_attention", error='{"code": "effect_outcome_unknown"}')
        stopped = get(store, run.run_id)
        assert (stopped.state, stopped.generation) == ("needs_attention", 1)
        return stopped, claim

    def test_resolve_requeues(self, store: port.Store, clock: clocks.FakeClock) -> None:
        run, _ = self._needs_attention(store)
        settled = entry(2, name="charge")
        clock.advance(5)
        store.resolve(run.run_id, 1, settled, state="queued", error=None, note="charge confirmed")
        after = get(store, run.run_id)
        assert (after.state, after.failures) == ("queued", 0)
        assert store.journal(run.run_id) == [entry(1), settled]
        receipt = store.history(run.run_id)[-1]
        assert (receipt.kind, receipt.note, receipt.at) == (
            "resolved",
            "charge confirmed",
            clock.now(),
        )
        again = claim_run(store, run)
        assert (again.claim.generation, again.journal) == (2, [entry(1), settled])

    def _child_waited_on(self, store: port.Store) -> tuple[port.Run, port.Run]:
        """Return a parent parked on its only child, and the child."""
        parent = start(store)
        claim = claim_run(store, parent).claim
        [child] = store.create_children(claim, [new_run(key="c", parent_id=parent.run_id)])
        waits = [port.WaitSpec(f"child:{child.run_id}", "child")]
        assert store.park(claim, [], waits, wake_at=None) is True
        return parent, child

    def test_needs_attention_keeps_the_run_records(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        parent, child = self._child_waited_on(store)
        claim = claim_run(store, child).claim
        x, _ = store.settle_wait(child.run_id, "x", signaled(child.run_id, "x", clock.now()))
        assert store.send(port.NewMessage(child.run_id, "inbox", "m", "1")) is True
        waits = [port.WaitSpec("y", "signal"), port.WaitSpec("z", "signal")]
        assert store.park(claim, [], waits, wake_at=None) is True
        y, _ = store.settle_wait(child.run_id, "y", signaled(child.run_id, "y", clock.now()))
        claim = claim_run(store, child).claim
        store.begin_effect(claim, [entry(1, "started")])
        store.finish(claim, [], state="needs_attention", error='{"code": "effect_outcome_unknown"}')
        assert get(store, child.run_id).state == "needs_attention"
        assert [w.name for w in store.waits(APP, child.run_id)] == ["z"]
        assert sorted(store.outcomes(child.run_id), key=lambda o: o.name) == [x, y]
        assert [m.key for m in messages(store, child.run_id, "inbox")] == ["m"]
        assert store.outcomes(parent.run_id) == []
        assert get(store, parent.run_id).state == "waiting"

    def test_resolve_fails_the_run(self, store: port.Store) -> None:
        parent, child = self._child_waited_on(store)
        claim = claim_run(store, child).claim
        store.begin_effect(claim, [entry(1, "started")])
        store.finish(claim, [], state="needs_attention", error='{"code": "effect_outcome_unknown"}')
        assert store.outcomes(parent.run_id) == []
        error = '{"code": "resolved_failed"}'
        failed = entry(1, "error")
        store.resolve(child.run_id, 1, failed, state="failed", error=error, note="refunded")
        after = get(store, child.run_id)
        assert (after.state, after.error) == ("failed", error)
        assert store.journal(child.run_id) == [failed]
        assert kinds(store, child.run_id)[-1] == "resolved"
        [outcome] = store.outcomes(parent.run_id)
        assert outcome.name == f"child:{child.run_id}"
        payload = child_payload(outcome)
        assert (payload["run_id"], payload["state"]) == (child.run_id, "failed")
        assert same_json(payload["error"], error), payload
        assert get(store, parent.run_id).state == "queued"

    def test_resolve_requeues_a_child_without_settling_the_parent(self, store: port.Store) -> None:
        parent, child = self._child_waited_on(store)
        claim = claim_run(store, child).claim
        store.begin_effect(claim, [entry(1, "started")])
        store.finish(claim, [], state="needs_attention", error='{"code": "effect_outcome_unknown"}')
        store.resolve(child.run_id, 1, entry(1), state="queued", error=None, note="it happened")
        assert get(store, child.run_id).state == "queued"
        assert store.outcomes(parent.run_id) == []
        assert get(store, parent.run_id).state == "waiting"

    @pytest.mark.parametrize(
        "why", ["not_needs_attention", "wrong_generation", "entry_ok", "no_entry"]
    )
    def test_resolve_refusals(self, store: port.Store, why: str) -> None:
        if why == "not_needs_attention":
            run = start(store)
            claim = claim_run(store, run).claim
            store.begin_effect(claim, [entry(1, "started")])
            generation, target = 1, entry(1)
        else:
            run, _ = self._needs_attention(store)
            generation, target = 1, entry(2, name="charge")
            if why == "wrong_generation":
                generation = 2
            elif why == "entry_ok":
                target = dataclasses.replace(entry(1), output='"other"')
            elif why == "no_entry":
                target = entry(3)
        before = snapshot(store)
        with pytest.raises(errors.NotResolvable):
            store.resolve(run.run_id, generation, target, state="queued", error=None, note="x")
        assert snapshot(store) == before

    # == ledger ============================================================

    def test_ledger_starts_at_initialized(self, store: port.Store, clock: clocks.FakeClock) -> None:
        run = start(store)
        assert store.history(run.run_id) == [
            port.LedgerEntry(
                run_id=run.run_id,
                sequence=1,
                kind="initialized",
                at=clock.now(),
                generation=0,
                worker=None,
                step=None,
                digest=None,
                note=None,
            )
        ]

    def test_ledger_records_each_transition(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run = start(store)
        expected_at = [clock.now()]

        def tick() -> None:
            expected_at.append(clock.advance(1))

        tick()
        claim = claim_run(store, run).claim
        tick()
        store.begin_effect(
            claim, [entry(1, "started")], marks=[port.Mark("effect_started", step="step-1")]
        )
        tick()
        store.finish_step(claim, [entry(1)], marks=[port.Mark("step_completed", step="step-1")])
        tick()
        assert store.park(claim, [], [port.WaitSpec("go", "signal")], wake_at=None)
        tick()
        store.settle_wait(run.run_id, "go", signaled(run.run_id, "go", clock.now()))
        tick()
        claim = claim_run(store, run).claim
        tick()
        store.release(claim, delay=0, failed=False)
        tick()
        claim = claim_run(store, run).claim
        tick()
        store.finish(claim, [], state="succeeded", result="1", marks=[])
        history = store.history(run.run_id)
        assert [r.kind for r in history] == [
            "initialized",
            "claimed",
            "effect_started",
            "step_completed",
            "parked",
            "woken",
            "claimed",
            "released",
            "claimed",
            "finished",
        ]
        assert [r.sequence for r in history] == list(range(1, 11))
        assert [r.at for r in history] == expected_at
        assert {r.run_id for r in history} == {run.run_id}
        assert [r.generation for r in history if r.kind == "claimed"] == [1, 2, 3]
        assert history[2].step == "step-1"
        assert get(store, run.run_id).ledger_sequence == 10

    @pytest.mark.parametrize("ledger_limit", [5])
    def test_ledger_keeps_the_newest_receipts(self, store: port.Store, ledger_limit: int) -> None:
        run = start(store)

        def check(total: int) -> None:
            kept = min(total, ledger_limit)
            history = store.history(run.run_id)
            assert [r.sequence for r in history] == list(range(total - kept + 1, total + 1))
            assert get(store, run.run_id).ledger_sequence == total

        check(1)
        claim = claim_run(store, run).claim
        check(2)
        for position in range(1, 9):
            store.finish_step(
                claim, [entry(position)], marks=[port.Mark("step_completed", step=str(position))]
            )
            check(2 + position)
        store.finish_step(
            claim, [entry(9)], marks=[port.Mark("step_started"), port.Mark("step_completed")]
        )
        check(12)
        history = store.history(run.run_id)
        assert [r.step for r in history[:3]] == ["6", "7", "8"]

    # == sweep =============================================================

    def test_sweep_times_out_expired_waits(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run = start(store)
        calm = start(store)
        claim = claim_run(store, run).claim
        calm_claim = claim_run(store, calm).claim
        deadline = clock.now() + timedelta(seconds=10)
        assert store.park(claim, [], [port.WaitSpec("approval", "signal", deadline)], wake_at=None)
        far = clock.now() + timedelta(hours=1)
        assert store.park(calm_claim, [], [port.WaitSpec("approval", "signal", far)], wake_at=None)
        assert store.sweep() == 0
        assert get(store, run.run_id).state == "waiting"
        clock.advance(11)
        assert store.sweep() >= 1
        [outcome] = store.outcomes(run.run_id)
        assert (outcome.name, outcome.outcome, outcome.payload, outcome.signal_id) == (
            "approval",
            "timed_out",
            None,
            None,
        )
        assert get(store, run.run_id).state == "queued"
        assert store.waits(APP, run.run_id) == []
        assert get(store, calm.run_id).state == "waiting"
        assert store.outcomes(calm.run_id) == []
        assert store.sweep() == 0
        assert store.journal(run.run_id) == []

    def test_sweep_requeues_waiting_runs_whose_time_came(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run = start(store)
        claim = claim_run(store, run).claim
        wake_at = clock.now() + timedelta(seconds=30)
        assert store.park(claim, [entry(1, kind="sleep")], [], wake_at=wake_at)
        assert store.sweep() == 0
        clock.advance(31)
        assert store.sweep() >= 1
        assert get(store, run.run_id).state == "queued"
        assert store.sweep() == 0

    def test_sweep_leaves_no_records_of_ended_runs(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run = start(store)
        claim = claim_run(store, run).claim
        assert store.send(port.NewMessage(run.run_id, "inbox", "m", "1"))
        store.settle_wait(run.run_id, "x", signaled(run.run_id, "x", clock.now()))
        store.finish(claim, [], state="succeeded", result="1")
        store.sweep()
        assert store.sweep() == 0
        assert store.outcomes(run.run_id) == []
        assert store.waits(APP) == []
        assert store.next_message(run.run_id, "inbox", 0) is None

    # == wait_ready / notify_ready =========================================

    def _wakes_waiter(self, waiter: port.Store, poke: Callable[[], object]) -> None:
        """Assert that ``waiter.wait_ready`` returns True promptly after ``poke``."""
        entered = threading.Event()
        done = threading.Event()
        outcome: list[bool] = []

        def wait() -> None:
            entered.set()
            outcome.append(waiter.wait_ready(5.0))
            done.set()

        thread = threading.Thread(target=wait, daemon=True)
        began = time.monotonic()
        thread.start()
        assert entered.wait(TIMEOUT)
        # The waiter may not be blocked yet when the first poke lands; poking
        # again each half second bounds that race without ordering by sleep.
        for _ in range(8):
            poke()
            if done.wait(0.5):
                break
        thread.join(TIMEOUT)
        assert outcome == [True], "wait_ready timed out although it was notified"
        assert time.monotonic() - began < 5.0

    def test_notify_ready_wakes_a_waiter_on_the_same_store(self, store: port.Store) -> None:
        self._wakes_waiter(store, store.notify_ready)

    def test_notify_ready_from_another_store_object(self, handle: StoreHandle) -> None:
        other = handle.reopen()
        self._wakes_waiter(handle.store, other.notify_ready)

    def test_create_run_from_another_store_object_wakes_a_waiter(self, handle: StoreHandle) -> None:
        other = handle.reopen()
        self._wakes_waiter(handle.store, lambda: other.create_run(new_run()))

    def test_create_run_in_another_process_wakes_a_waiter(
        self, handle: StoreHandle, clock: clocks.FakeClock
    ) -> None:
        if not (self.processes and self.shared):
            pytest.skip("only a shared store notifies across processes")
        context = multiprocessing.get_context("spawn")
        ready, stop, results = context.Event(), context.Event(), context.Queue()
        entered = threading.Event()
        woken: list[bool] = []

        def wait() -> None:
            entered.set()
            woken.append(handle.store.wait_ready(8.0))
            stop.set()

        waiter = threading.Thread(target=wait, daemon=True)
        waiter.start()
        assert entered.wait(TIMEOUT)
        args = (handle.opener, handle.url, clock.now(), handle.ledger_limit, ready, stop, results)
        poker = context.Process(target=_create_runs_until_stopped, args=args, daemon=True)
        poker.start()
        try:
            waiter.join(TIMEOUT * 2)
            stop.set()
            status, detail, _ = results.get(timeout=TIMEOUT * 2)
        finally:
            poker.join(TIMEOUT)
            if poker.is_alive():
                poker.kill()
        assert status == "ok", detail
        assert woken == [True], "wait_ready was not woken by a run created in another process"

    def test_wait_ready_returns_by_its_timeout(self, store: port.Store) -> None:
        began = time.monotonic()
        result = store.wait_ready(0.05)
        assert isinstance(result, bool)
        assert time.monotonic() - began < 2.0
