"""Conformance: Opening, migrating and closing a store; its clock; waking waiters."""

from __future__ import annotations

import multiprocessing
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from urllib.parse import urlsplit

import pytest

from perdure.store import port
from perdure.testing import clock as clocks
from perdure.testing.conformance.harness import (
    TIMEOUT,
    StoreHandle,
    Suite,
    claim_run,
    create_runs_until_stopped,
    get,
    new_run,
    start,
)


class LifecycleTests(Suite):
    """The conformance tests of opening and closing a store, its clock, waking waiters."""

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
        poker = context.Process(target=create_runs_until_stopped, args=args, daemon=True)
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
