"""The worker: claims runs, executes them through Context + replay, parks, sweeps.

One claim loop thread, one heartbeat thread, a thread pool for executions
(``concurrency`` slots) and, when async workflows are registered, one event
loop thread that runs their coroutines. A claimed run executes from the top
of its code; replay returns recorded outcomes until the first unrecorded
position. Recovery after a crash is this same path: the next claim of a run
whose lease lapsed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import secrets
import signal
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any

from perdure import context, errors
from perdure import execution as execution_api
from perdure.store import port

log = logging.getLogger("perdure.worker")


# Defined with the execution that uses them; named here for the app and for callers.
WorkflowDef = execution_api.WorkflowDef
Registry = execution_api.Registry
Execution = execution_api.Execution


def validate_timing(lease_ttl: float, heartbeat: float) -> None:
    """Refuse a heartbeat that could let a live worker's lease lapse.

    Raises:
        errors.LeaseTimingInvalid: (a ``ValueError``) naming both values.
    """
    # A hair of tolerance, so that 0.1 * 3 counts as 0.3.
    if (
        lease_ttl <= 0
        or heartbeat <= 0
        or heartbeat >= lease_ttl
        or heartbeat * 3 > lease_ttl * (1 + 1e-9)
    ):
        raise errors.LeaseTimingInvalid(
            f"heartbeat={heartbeat} must be positive, below lease_ttl={lease_ttl} "
            f"and at most a third of it (<= {lease_ttl / 3:g})"
        )


def default_worker_id() -> str:
    """Return ``host-pid-random``: printable ASCII, no spaces, at most 128 characters."""
    host = re.sub(r"[^\x21-\x7e]", "_", socket.gethostname())[:80] or "host"
    return f"{host}-{os.getpid()}-{secrets.token_hex(3)}"


class Worker:
    """Serves one app's runs until stopped. Use ``app.worker(...)`` to make one."""

    def __init__(
        self,
        registry: Registry,
        store: port.Store,
        *,
        concurrency: int = 8,
        lease_ttl: float = 30.0,
        heartbeat: float = 5.0,
        poll_interval: float = 1.0,
        sweep_interval: float = 10.0,
        worker_id: str | None = None,
    ) -> None:
        validate_timing(lease_ttl, heartbeat)
        if concurrency < 1:
            raise errors.InvalidInput(f"concurrency must be at least 1, got {concurrency}")
        if poll_interval <= 0:
            raise errors.InvalidInput(f"poll_interval must be positive, got {poll_interval}")
        self.worker_id = worker_id or default_worker_id()
        if not port.WORKER_ID.match(self.worker_id):
            raise errors.InvalidInput(
                "a worker id is 1 to 128 printable ASCII characters without spaces"
            )
        self.registry = registry
        self.store = store
        self.concurrency = concurrency
        self.lease_ttl = lease_ttl
        self.heartbeat = heartbeat
        self.poll_interval = poll_interval
        self.sweep_interval = sweep_interval
        self._active: dict[str, Execution] = {}
        self._active_lock = threading.Lock()
        self._slot_freed = threading.Event()
        self._stop_event = threading.Event()
        self._halt = threading.Event()
        self._threads: list[threading.Thread] = []
        self._pool: ThreadPoolExecutor | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._next_wake: float | None = None
        self._started = False

    # -- lifecycle ------------------------------------------------------------

    @property
    def stopping(self) -> bool:
        return self._stop_event.is_set()

    def wait_stopping(self, timeout: float) -> bool:
        """Block up to ``timeout`` seconds or until the worker stops; return whether it does."""
        return self._stop_event.wait(timeout)

    def start(self) -> Worker:
        """Start serving in background threads; return self."""
        if self._started:
            return self
        self._started = True
        # Start listening for ready runs now, so no notification sent before the
        # first idle wait is missed.
        self.store.wait_ready(0)
        self._pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="perdure-run")
        self._loop = asyncio.new_event_loop()
        for target, name in (
            (self._loop.run_forever, "perdure-loop"),
            (self._claim_loop, "perdure-claim"),
            (self._heartbeat_loop, "perdure-heartbeat"),
        ):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        log.info("worker %s serving app %s", self.worker_id, self.registry.name)
        return self

    def stop(self, timeout: float | None = None) -> None:
        """Stop claiming; let in-flight runs finish their step or release them; wait."""
        self._stop_event.set()
        self._slot_freed.set()
        with contextlib.suppress(Exception):
            self.store.notify_ready()
        deadline = None if timeout is None else time.monotonic() + timeout

        def left() -> float | None:
            return None if deadline is None else max(0.0, deadline - time.monotonic())

        if len(self._threads) > 1:
            self._threads[1].join(left())  # the claim loop
        if self._pool is not None:
            self._pool.shutdown(wait=deadline is None, cancel_futures=True)
            while deadline is not None and self._active and time.monotonic() < deadline:
                self._slot_freed.wait(0.05)
                self._slot_freed.clear()
        # Runs still in flight past the deadline stop being renewed: their
        # leases lapse and another worker takes them over.
        self._halt.set()
        if len(self._threads) > 2:
            self._threads[2].join(self.heartbeat + 1)
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._active:
            log.warning(
                "worker %s stopped with %d runs in flight", self.worker_id, len(self._active)
            )
        log.info("worker %s stopped", self.worker_id)

    def run(self) -> None:
        """Serve until SIGINT or SIGTERM, then stop gracefully."""
        previous = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                previous[sig] = signal.signal(sig, lambda *_: self._stop_event.set())
        self.start()
        try:
            while not self._stop_event.wait(0.5):
                pass
        finally:
            self.stop(timeout=self.lease_ttl)
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def __enter__(self) -> Worker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop(timeout=self.lease_ttl)

    # -- claiming -------------------------------------------------------------

    def _claim_loop(self) -> None:
        last_sweep = 0.0
        while not self._stop_event.is_set():
            free = self.concurrency - len(self._active)
            if free <= 0:
                self._slot_freed.wait(self.poll_interval)
                self._slot_freed.clear()
                continue
            try:
                if time.monotonic() - last_sweep >= self.sweep_interval:
                    last_sweep = time.monotonic()
                    self.store.sweep()
                claimed = self.store.claim(
                    self.registry.name,
                    self.worker_id,
                    self.registry.workflow_versions(),
                    lease_ttl=self.lease_ttl,
                    limit=free,
                )
            except Exception as exc:
                log.warning("worker %s: claim failed: %s", self.worker_id, exc)
                self._stop_event.wait(self.poll_interval)
                continue
            for item in claimed:
                self._dispatch(item)
            if not claimed:
                self.store.wait_ready(self._idle_timeout())

    def _idle_timeout(self) -> float:
        timeout = self.poll_interval
        if self._next_wake is not None:
            left = self._next_wake - time.monotonic()
            if left <= 0:
                self._next_wake = None
                return 0.0
            timeout = min(timeout, left)
        return timeout

    def _note_wake(self, when: datetime | None) -> None:
        if when is None:
            return
        left = (when - self.store.now()).total_seconds()
        at = time.monotonic() + max(0.0, left)
        if self._next_wake is None or at < self._next_wake:
            self._next_wake = at
            self.store.notify_ready()

    def _dispatch(self, claimed: port.Claimed) -> None:
        execution = Execution(self, claimed)
        with self._active_lock:
            self._active[claimed.claim.run_id] = execution
        assert self._pool is not None
        try:
            self._pool.submit(self._execute, execution)
        except RuntimeError:
            self._forget(execution)

    def _forget(self, execution: Execution) -> None:
        with self._active_lock:
            self._active.pop(execution.claim.run_id, None)
        self._slot_freed.set()

    def _heartbeat_loop(self) -> None:
        while not self._halt.wait(self.heartbeat):
            for execution in list(self._active.values()):
                if execution.lost is not None:
                    continue
                try:
                    execution.renewed(self.store.renew(execution.claim, lease_ttl=self.lease_ttl))
                except errors.LeaseLost as lost:
                    log.info(
                        "run %s: lease renewal refused (%s)", execution.claim.run_id, lost.code
                    )
                    execution.lost = lost
                except Exception as exc:
                    log.warning("run %s: lease renewal failed: %s", execution.claim.run_id, exc)
            if self._stop_event.is_set() and not self._active:
                return

    # -- executing ------------------------------------------------------------

    def _execute(self, execution: Execution) -> None:
        try:
            self._note_wake(execution.run())
        except errors.StaleClaim:
            log.info("run %s: claim is stale; another worker owns it", execution.claim.run_id)
        except Exception:
            log.exception("run %s: unexpected engine error", execution.claim.run_id)
        finally:
            self._forget(execution)

    def invoke(
        self, wf: WorkflowDef, ctx: context.Context, args: list[Any], kwargs: dict[str, Any]
    ) -> Any:
        """Call the workflow function with ``ctx`` bound, on the loop if it is async."""
        if wf.is_async:
            assert self._loop is not None

            async def call() -> Any:
                token = ctx.bind()
                try:
                    return await wf.fn(ctx, *args, **kwargs)
                finally:
                    ctx.unbind(token)

            return asyncio.run_coroutine_threadsafe(call(), self._loop).result()
        token = ctx.bind()
        try:
            return wf.fn(ctx, *args, **kwargs)
        finally:
            ctx.unbind(token)
