"""Conformance: deliver_update, next_update, answer_update, record_live, journal_after, watch."""

from __future__ import annotations

import dataclasses
import functools
import multiprocessing
import time
import uuid
from datetime import datetime, timedelta
from typing import Any

import pytest

from perdure import errors
from perdure.store import liveport, port
from perdure.testing import clock as clocks
from perdure.testing.conformance.harness import (
    TIMEOUT,
    Opener,
    StoreHandle,
    Suite,
    claim_run,
    entry,
    get,
    kinds,
    new_run,
    run_processes,
    run_threads,
    start,
)


def _live(store: port.Store) -> liveport.LiveStore:
    return liveport.require(store)


def _update(run_id: str, update_id: str = "u-1", name: str = "add", payload: str = "1") -> Any:
    return liveport.NewUpdate(run_id, update_id, name, payload)


def _watch_woken(store: port.Store, change: Any) -> tuple[bool, bool]:
    """Open a watch, check it is quiet, make ``change``, and return (quiet, woken)."""
    with _live(store).watch() as watch:
        quiet = not watch.wait(0.05)
        change()
        woken = watch.wait(TIMEOUT)
    return quiet, woken


def deliver_in_process(
    opener: Opener,
    url: str,
    start_at: datetime | None,
    ledger_limit: int,
    barrier: Any,
    results: Any,
    update: liveport.NewUpdate,
) -> None:
    """Deliver ``update`` from a spawned process once every process is ready."""
    try:
        store = _live(opener(url, clocks.FakeClock(start_at) if start_at else None, ledger_limit))
        try:
            barrier.wait(TIMEOUT)
            stored, created = store.deliver_update(update)
            results.put(("ok", stored.payload, created))
        finally:
            store.close()
    except BaseException as exc:
        results.put(("error", repr(exc), False))


def answer_in_process(
    opener: Opener, url: str, ledger_limit: int, ready: Any, claim: port.Claim, results: Any
) -> None:
    """Answer update ``u-1`` of the claimed run from a spawned process, once told to."""
    try:
        store = _live(opener(url, None, ledger_limit))
        try:
            if not ready.wait(TIMEOUT):
                raise TimeoutError("never told to answer")
            answered = store.answer_update(claim, [entry(1, kind="respond")], "u-1", '"yes"')
            results.put(("ok", answered, None))
        finally:
            store.close()
    except BaseException as exc:
        results.put(("error", repr(exc), None))


class LiveTests(Suite):
    """The conformance tests of the live-run section (``perdure.store.liveport``)."""

    # == deliver_update ====================================================

    def test_deliver_update_is_put_if_absent(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run = start(store)
        first, created = _live(store).deliver_update(_update(run.run_id, payload='{"a": 1}'))
        assert created is True
        assert first == liveport.UpdateRecord(
            run.run_id, "u-1", "add", 1, '{"a": 1}', "pending", None, clock.now(), None
        )
        clock.advance(1)
        again, created = _live(store).deliver_update(_update(run.run_id, payload='{"a": 2}'))
        assert (again, created) == (first, False)
        assert _live(store).get_update(run.run_id, "u-1") == first
        assert _live(store).get_update(run.run_id, "u-2") is None

    def test_a_delivery_with_its_app_finds_the_run_itself(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run = start(store)
        with pytest.raises(errors.RunNotFound):
            _live(store).deliver_update(dataclasses.replace(_update(run.run_id), app="other"))
        assert _live(store).get_update(run.run_id, "u-1") is None
        mine = dataclasses.replace(_update(run.run_id), app=run.app)
        assert _live(store).deliver_update(mine)[1] is True
        # Past its deadline, the run is refused (its sender settles it) and
        # nothing is stored; without the app, the delivery does not judge it.
        due = dataclasses.replace(new_run(), deadline=clock.now() + timedelta(seconds=5))
        late, _ = store.create_run(due)
        clock.advance(10)
        with pytest.raises(liveport.Overdue):
            _live(store).deliver_update(dataclasses.replace(_update(late.run_id), app=late.app))
        assert _live(store).get_update(late.run_id, "u-1") is None
        assert get(store, late.run_id).state == "queued"
        assert _live(store).deliver_update(_update(late.run_id))[1] is True
        ended = start(store)
        assert store.request_cancel(ended.run_id)  # never claimed: canceled at once
        assert get(store, ended.run_id).state == "canceled"
        with pytest.raises(errors.RunFinished):
            _live(store).deliver_update(dataclasses.replace(_update(ended.run_id), app=ended.app))
        # Another app's sender learns nothing of the run, ended or not.
        with pytest.raises(errors.RunNotFound):
            _live(store).deliver_update(dataclasses.replace(_update(ended.run_id), app="other"))
        assert _live(store).get_update(ended.run_id, "u-1") is None

    def test_update_ids_are_scoped_to_their_run(self, store: port.Store) -> None:
        one, two = start(store), start(store)
        assert _live(store).deliver_update(_update(one.run_id, payload="1"))[1] is True
        assert _live(store).deliver_update(_update(two.run_id, payload="2"))[1] is True
        assert [_live(store).get_update(r.run_id, "u-1") for r in (one, two)] != [None, None]
        assert _live(store).next_update(two.run_id, "add", 0) is not None

    def test_updates_keep_their_delivery_order_per_name(self, store: port.Store) -> None:
        run = start(store)
        live = _live(store)
        for update_id, name in [("a1", "a"), ("b1", "b"), ("a2", "a"), ("a3", "a")]:
            assert live.deliver_update(_update(run.run_id, update_id, name))[1]
        on_a, after = [], 0
        while (found := live.next_update(run.run_id, "a", after)) is not None:
            on_a.append(found)
            after = found.sequence
        on_b = live.next_update(run.run_id, "b", 0)
        assert on_b is not None
        assert [u.update_id for u in on_a] == ["a1", "a2", "a3"]
        assert on_a[0].sequence < on_b.sequence < on_a[1].sequence < on_a[2].sequence
        assert live.next_update(run.run_id, "a%", 0) is None
        assert live.next_update(run.run_id, "A", 0) is None

    def test_concurrent_deliveries_of_one_update_create_it_once(self, handle: StoreHandle) -> None:
        run = start(handle.store)
        stores = [handle.store] + [handle.reopen() for _ in range(self.thread_count - 1)]
        results = run_threads(
            [
                functools.partial(_live(s).deliver_update, _update(run.run_id, payload=str(i)))
                for i, s in enumerate(stores)
            ]
        )
        assert sum(created for _, created in results) == 1
        assert len({stored for stored, _ in results}) == 1

    def test_deliveries_from_processes_create_the_update_once(
        self, handle: StoreHandle, clock: clocks.FakeClock
    ) -> None:
        if not self.processes:
            pytest.skip("the adapter cannot be opened from another process")
        run = start(handle.store)
        common = (handle.opener, handle.url, clock.now(), handle.ledger_limit)
        found = run_processes(
            deliver_in_process,
            [(*common, _update(run.run_id, payload=str(i))) for i in range(3)],
        )
        assert sorted(created for _, created in found) == [False, False, True]
        stored = _live(handle.store).get_update(run.run_id, "u-1")
        assert stored is not None and {payload for payload, _ in found} == {stored.payload}

    def test_deliver_update_refusals_store_nothing(self, store: port.Store) -> None:
        with pytest.raises(errors.RunNotFound):
            _live(store).deliver_update(_update(str(uuid.uuid4())))
        run = start(store)
        store.finish(claim_run(store, run).claim, [], state="succeeded", result="1")
        with pytest.raises(errors.RunFinished) as finished:
            _live(store).deliver_update(_update(run.run_id))
        assert finished.value.state == "succeeded"
        assert _live(store).get_update(run.run_id, "u-1") is None
        with pytest.raises(errors.InvalidInput):
            _live(store).deliver_update(_update(start(store).run_id, update_id=""))

    # == waking and parking ================================================

    def test_delivery_wakes_a_run_parked_on_that_update_name(self, store: port.Store) -> None:
        run = start(store)
        claim = claim_run(store, run).claim
        assert store.park(claim, [], [port.WaitSpec("add", "update")], wake_at=None)
        _live(store).deliver_update(_update(run.run_id, name="other"))
        assert get(store, run.run_id).state == "waiting"
        _live(store).deliver_update(_update(run.run_id, "u-2", name="add"))
        after = get(store, run.run_id)
        assert after.state == "queued"
        assert [w.name for w in store.waits(run.app, run.run_id)] == ["add"]  # no outcome
        assert kinds(store, run.run_id)[-1] == "woken"
        assert after.ledger_sequence == len(kinds(store, run.run_id))

    def test_delivery_does_not_wake_a_run_parked_on_a_signal_of_that_name(
        self, store: port.Store
    ) -> None:
        run = start(store)
        claim = claim_run(store, run).claim
        assert store.park(claim, [], [port.WaitSpec("add", "signal")], wake_at=None)
        _live(store).deliver_update(_update(run.run_id, name="add"))
        assert get(store, run.run_id).state == "waiting"

    def test_an_update_delivered_before_park_keeps_the_run(self, store: port.Store) -> None:
        run = start(store)
        claim = claim_run(store, run).claim
        stored, _ = _live(store).deliver_update(_update(run.run_id))
        waits = [port.WaitSpec("add", "update", None, stored.sequence - 1)]
        assert store.park(claim, [entry(1)], waits, wake_at=None) is False
        assert get(store, run.run_id).state == "running"
        consumed = [port.WaitSpec("add", "update", None, stored.sequence)]
        assert store.park(claim, [], consumed, wake_at=None) is True

    def test_park_racing_delivery_never_loses_the_wake(self, handle: StoreHandle) -> None:
        store, other = handle.store, _live(handle.reopen())
        for i in range(8):
            run = start(store)
            claimed = claim_run(store, run)
            waits = [port.WaitSpec("add", "update")]
            parked, (_, created) = run_threads(
                [
                    functools.partial(store.park, claimed.claim, [], waits, wake_at=None),
                    functools.partial(other.deliver_update, _update(run.run_id, f"u-{i}")),
                ]
            )
            assert created is True
            after = get(store, run.run_id)
            assert after.state == ("queued" if parked else "running"), (parked, after.state)

    def test_sweep_leaves_an_update_wait_past_its_deadline_to_its_owner(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run = start(store)
        claim = claim_run(store, run).claim
        deadline = clock.now() + timedelta(seconds=5)
        assert store.park(claim, [], [port.WaitSpec("add", "update", deadline)], wake_at=None)
        clock.advance(10)
        store.sweep()
        assert get(store, run.run_id).state == "queued"
        assert store.outcomes(run.run_id) == []

    # == answer_update =====================================================

    def test_answer_update_answers_once_with_its_entries(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run = start(store)
        claim = claim_run(store, run).claim
        _live(store).deliver_update(_update(run.run_id))
        clock.advance(1)
        respond = entry(2, kind="respond", name="add")
        assert _live(store).answer_update(claim, [entry(1), respond], "u-1", '{"n": 1}') is True
        stored = _live(store).get_update(run.run_id, "u-1")
        assert stored is not None
        assert (stored.state, stored.response, stored.settled_at) == (
            "answered",
            '{"n": 1}',
            clock.now(),
        )
        assert store.journal(run.run_id) == [entry(1), respond]
        assert _live(store).answer_update(claim, [entry(3)], "u-1", '"again"') is False
        assert _live(store).answer_update(claim, [entry(4)], "nope", '"x"') is False
        after = _live(store).get_update(run.run_id, "u-1")
        assert after is not None and after.response == '{"n": 1}'
        assert [e.position for e in store.journal(run.run_id)] == [1, 2, 3, 4]

    # == list_updates =====================================================

    def test_list_updates_newest_first_in_every_state(self, store: port.Store) -> None:
        run, other = start(store), start(store)
        claim = claim_run(store, run).claim
        live = _live(store)
        for update_id, name in [("a1", "a"), ("b1", "b"), ("a2", "a")]:
            live.deliver_update(_update(run.run_id, update_id, name))
        live.deliver_update(_update(other.run_id, "x1", "a"))
        live.answer_update(claim, [], "a1", '"ok"')
        listed = live.list_updates(run.run_id)
        assert [(u.update_id, u.state) for u in listed] == [
            ("a2", "pending"),
            ("b1", "pending"),
            ("a1", "answered"),
        ]
        assert listed[-1].response == '"ok"'
        assert [u.update_id for u in live.list_updates(run.run_id, limit=2)] == ["a2", "b1"]
        assert live.list_updates(run.run_id, limit=0) == []
        assert live.list_updates("no-such-run") == []
        store.finish(claim, [], state="succeeded", result="1")
        after = live.list_updates(run.run_id)
        assert [(u.update_id, u.state) for u in after] == [
            ("a2", "abandoned"),
            ("b1", "abandoned"),
            ("a1", "answered"),
        ]

    # == the end of a run ==================================================

    @pytest.mark.parametrize("state", ["succeeded", "failed", "canceled"])
    def test_a_run_that_ends_abandons_its_pending_updates(
        self, store: port.Store, clock: clocks.FakeClock, state: port.RunState
    ) -> None:
        run = start(store)
        claim = claim_run(store, run).claim
        live = _live(store)
        live.deliver_update(_update(run.run_id, "answered"))
        live.deliver_update(_update(run.run_id, "pending"))
        live.answer_update(claim, [], "answered", '"ok"')
        clock.advance(1)
        error = None if state != "failed" else '{"code": "x"}'
        store.finish(
            claim, [], state=state, result="1" if state == "succeeded" else None, error=error
        )
        answered = live.get_update(run.run_id, "answered")
        pending = live.get_update(run.run_id, "pending")
        assert answered is not None and (answered.state, answered.response) == ("answered", '"ok"')
        assert pending is not None
        assert (pending.state, pending.response, pending.settled_at) == (
            "abandoned",
            None,
            clock.now(),
        )

    def test_needs_attention_keeps_pending_updates(self, store: port.Store) -> None:
        run = start(store)
        claim = claim_run(store, run).claim
        _live(store).deliver_update(_update(run.run_id))
        store.finish(claim, [], state="needs_attention", error='{"code": "x"}')
        stored = _live(store).get_update(run.run_id, "u-1")
        assert stored is not None and stored.state == "pending"

    def test_a_cancel_abandons_the_pending_updates_of_a_waiting_run(
        self, store: port.Store
    ) -> None:
        run = start(store)
        claim = claim_run(store, run).claim
        assert store.park(claim, [], [port.WaitSpec("other", "update")], wake_at=None)
        _live(store).deliver_update(_update(run.run_id))
        assert store.request_cancel(run.run_id) is True
        stored = _live(store).get_update(run.run_id, "u-1")
        assert stored is not None and stored.state == "abandoned"
        assert store.sweep() >= 0
        assert _live(store).get_update(run.run_id, "u-1") == stored  # the sweep keeps it

    # == record_live and journal_after =====================================

    def test_record_live_writes_entries_and_journal_after_reads_past_a_position(
        self, store: port.Store
    ) -> None:
        run = start(store)
        claim = claim_run(store, run).claim
        first = [entry(1), entry(2, kind="event", name="status")]
        _live(store).record_live(claim, first)
        _live(store).record_live(claim, [entry(3, kind="stream", name="progress")])
        assert store.journal(run.run_id) == [*first, entry(3, kind="stream", name="progress")]
        assert [e.position for e in _live(store).journal_after(run.run_id, 1)] == [2, 3]
        assert _live(store).journal_after(run.run_id, 3) == []
        assert [e.position for e in _live(store).journal_after(run.run_id, -5)] == [1, 2, 3]

    # == watch =============================================================

    def test_watch_times_out_when_nothing_changes(self, store: port.Store) -> None:
        with _live(store).watch() as watch:
            assert watch.wait(0.05) is False

    def test_watch_is_woken_by_changes_made_through_another_store_object(
        self, handle: StoreHandle
    ) -> None:
        other = _live(handle.reopen())
        run = start(handle.store)
        claim = claim_run(handle.store, run).claim
        # A delivery itself wakes the run, not watchers: nothing they wait for came.
        other.deliver_update(_update(run.run_id))
        changes = [
            lambda: other.answer_update(claim, [], "u-1", '"ok"'),
            lambda: other.record_live(claim, [entry(1, kind="event", name="k")]),
            lambda: other.finish(claim, [], state="succeeded", result="1"),
        ]
        for change in changes:
            assert _watch_woken(handle.store, change) == (True, True)

    def test_watch_is_woken_by_the_end_of_a_run_whose_last_write_sets_an_event(
        self, handle: StoreHandle
    ) -> None:
        # Readers of events stop at the run's end; the event written with the end counts.
        other = handle.reopen()
        run = start(handle.store)
        claim = claim_run(handle.store, run).claim
        last = [entry(1, kind="event", name="k")]

        def change() -> None:
            other.finish(claim, last, state="succeeded", result="1")

        assert _watch_woken(handle.store, change) == (True, True)
        assert handle.store.journal(run.run_id) == last

    def test_a_watch_that_is_told_answers_hears_a_short_one_as_committed(
        self, handle: StoreHandle
    ) -> None:
        run = start(handle.store)
        claim = claim_run(handle.store, run).claim
        for update_id in ("large", "escaped", "small"):
            _live(handle.store).deliver_update(_update(run.run_id, update_id, "ask"))
        large = '"' + "x" * 8000 + '"'
        # Short as stored, too long once escaped into the announcement's JSON.
        escaped = '"' + "\\\\" * 3000 + '"'
        with _live(handle.store).watch() as watch:
            if not isinstance(watch, liveport.ToldAnswers):
                pytest.skip("this store's watch is not told answers (its senders read them)")
            other = _live(handle.reopen())
            # The long ones first: once the short one is heard, so is all before it.
            for position, (update_id, response) in enumerate(
                [("large", large), ("escaped", escaped), ("small", '"yes"')], start=1
            ):
                answer = entry(position, kind="respond", name="ask")
                assert other.answer_update(claim, [answer], update_id, response)
            deadline = time.monotonic() + TIMEOUT
            while watch.answer(run.run_id, "small") is None:
                assert watch.wait(max(0.0, deadline - time.monotonic()))
            assert watch.answer(run.run_id, "small") == '"yes"'
            # Too long to tell: announced, not told (its sender reads it back).
            assert watch.answer(run.run_id, "large") is None
            assert watch.answer(run.run_id, "escaped") is None
            stored = _live(handle.store).get_update(run.run_id, "escaped")
            assert stored is not None and stored.response == escaped
            assert watch.answer(run.run_id, "unknown") is None

    def test_watch_is_woken_by_an_answer_from_another_process(self, handle: StoreHandle) -> None:
        if not (self.processes and self.shared):
            pytest.skip("only a shared store announces across processes")
        run = start(handle.store)
        claim = claim_run(handle.store, run).claim
        _live(handle.store).deliver_update(_update(run.run_id))
        context = multiprocessing.get_context("spawn")
        ready, results = context.Event(), context.Queue()
        args = (handle.opener, handle.url, handle.ledger_limit, ready, claim, results)
        answering = context.Process(target=answer_in_process, args=args, daemon=True)
        answering.start()
        try:
            quiet, woken = _watch_woken(handle.store, ready.set)
            status, detail, _ = results.get(timeout=TIMEOUT * 2)
        finally:
            answering.join(TIMEOUT)
            if answering.is_alive():
                answering.kill()
        assert (status, detail) == ("ok", True)
        assert (quiet, woken) == (True, True)
        stored = _live(handle.store).get_update(run.run_id, "u-1")
        assert stored is not None and stored.response == '"yes"'
