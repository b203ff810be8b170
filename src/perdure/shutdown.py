"""Stopping a worker: gracefully, at once, or on a signal; and what it leaves in flight.

:class:`Shutdown` is a part of :class:`~perdure.worker.Worker` (a base class
of it). A graceful stop claims nothing more and lets the runs in flight record
their current step, their leases still renewed, for as long as it is given
(``grace`` seconds on a signal). Whatever is still in flight then is handed
back at once and named in the log, with any ``once`` effect whose outcome is
now unknown.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from perdure import errors, keeper
from perdure import execution as execution_api
from perdure import ownership as ownership_api
from perdure import registry as registry_api
from perdure import tasks as tasks_api
from perdure import telemetry as telemetry_api
from perdure.store import planport, port

log = logging.getLogger("perdure.worker")


class Shutdown:
    """How a Worker stops."""

    # What the Worker supplies.
    worker_id: str
    registry: registry_api.Registry
    store: port.Store
    telemetry: telemetry_api.Telemetry
    grace: float
    heartbeat: float
    _owner: ownership_api.AppOwner
    _keeper: keeper.Keeper | None
    _active: dict[str, execution_api.Execution | tasks_api.TaskExecution]
    _active_lock: threading.Lock
    _slot_freed: threading.Event
    _stop_event: threading.Event
    _at_once: threading.Event
    _halt: threading.Event
    _signals: int
    _threads: list[threading.Thread]
    _pool: ThreadPoolExecutor | None
    _loop: asyncio.AbstractEventLoop | None
    _reserved: int

    if TYPE_CHECKING:

        def start(self) -> Shutdown: ...

        def _cool_all(self) -> None: ...

        def _withdraw_starts(self) -> None: ...

        def _abandon_task(self, execution: tasks_api.TaskExecution) -> None: ...

        def _forget(self, execution: execution_api.Execution | tasks_api.TaskExecution) -> None: ...

    def stop(self, timeout: float | None = None) -> bool:
        """Stop claiming; let in-flight runs record their current step, then release them.

        Leases stay renewed while in-flight steps finish. Waits up to
        ``timeout`` seconds (``None``: as long as it takes) or until
        :meth:`stop_now`; runs still in flight then are released at once and
        named in the log, with any ``once`` effect whose outcome is now
        unknown. Returns True when no run was left in flight.
        """
        self._stop_event.set()
        self._withdraw_starts()
        self._slot_freed.set()
        self._cool_all()
        with contextlib.suppress(Exception):
            self.store.notify_ready()
        deadline = None if timeout is None else time.monotonic() + timeout

        def left() -> float | None:
            return None if deadline is None else max(0.0, deadline - time.monotonic())

        if len(self._threads) > 1:
            self._threads[1].join(left())  # the claim loop
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        # A run being created for a slot held here is handed over (and back) first.
        while (self._active or self._reserved) and not self._at_once.is_set():
            if self._signals > 1:
                log.warning("worker %s: signaled again: stopping at once", self.worker_id)
                break
            wait = left()
            if wait == 0.0:
                break
            self._slot_freed.wait(0.05 if wait is None else min(wait, 0.05))
            self._slot_freed.clear()
        abandoned = self._abandon()
        self.telemetry.unwatch(self.registry.name)
        self._halt.set()
        if len(self._threads) > 2:
            self._threads[2].join(self.heartbeat + 1)
        if self._keeper is not None:
            self._keeper.close()
        self._owner.release()
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._loop.stop)
            # A loop left open is finalized at interpreter exit, after its
            # sockets, and complains. One still running an abandoned run's
            # coroutine is left alone: that coroutine may never yield.
            if not abandoned:
                self._threads[0].join(5.0)
                if not self._threads[0].is_alive():
                    self._loop.close()
        log.info("worker %s stopped", self.worker_id)
        return not abandoned

    def stop_now(self) -> None:
        """Make a running or pending :meth:`stop` give up waiting for in-flight steps."""
        self._at_once.set()
        self._stop_event.set()
        self._slot_freed.set()

    def _unstarted(self, execution: execution_api.Execution | tasks_api.TaskExecution) -> None:
        """Hand back a claim whose execution a stop cancelled or refused before it began."""
        # Nothing of it ran, so the run or task is ready again at once, and
        # the stop need not wait out its grace for an execution that never comes.
        with contextlib.suppress(Exception, errors.LeaseLost):
            if isinstance(execution, tasks_api.TaskExecution):
                if isinstance(self.store, planport.PlanStore):
                    self.store.release_task(execution.claim)
            else:
                self.store.release(execution.claim, delay=0, failed=False)
        log.info("worker %s: handed %s back unstarted", self.worker_id, execution.key)
        self._forget(execution)

    def _abandon(self) -> list[str]:
        """Release the runs still in flight; return their ids."""
        with self._active_lock:
            left = list(self._active.values())
        for execution in left:
            if isinstance(execution, tasks_api.TaskExecution):
                self._abandon_task(execution)
                continue
            claim = execution.claim
            effect = execution.unsettled_effect()
            if effect is not None:
                execution.log.warning(
                    "left in flight by worker %s during the once step %s: its outcome is "
                    "unknown, so the run will need attention (effect_outcome_unknown)",
                    self.worker_id,
                    effect,
                    step=effect,
                )
            else:
                execution.log.warning(
                    "left in flight by worker %s; its current step did not record an "
                    "outcome and will run again",
                    self.worker_id,
                )
            if execution.lost is None:
                # Hand it over now rather than after the lease lapses; a claim
                # already fenced off (StaleClaim is an Interrupt) has nothing to hand.
                with contextlib.suppress(Exception, errors.LeaseLost):
                    self.store.release(claim, delay=0, failed=False)
        return [execution.key for execution in left]

    def run(self) -> bool:
        """Serve until SIGINT or SIGTERM, then stop gracefully (see :meth:`stop`).

        The first signal stops claiming and gives in-flight steps up to
        ``grace`` seconds to record their outcomes; a second one stops at
        once. Returns True when no run was left in flight.
        """
        previous = {}

        def handle(signum: int, frame: object) -> None:
            # Only a counter: the handler runs between two bytecodes of the
            # main thread, which may hold the very lock an Event.set() or a
            # log write would take.
            self._signals += 1

        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                previous[sig] = signal.signal(sig, handle)
        self.start()
        try:
            while not self._signals and not self._stop_event.is_set():
                time.sleep(0.1)
            if self._signals:
                log.info(
                    "worker %s: stopping: finishing in-flight steps (up to %gs; "
                    "signal again to stop at once)",
                    self.worker_id,
                    self.grace,
                )
        finally:
            clean = self.stop(timeout=self.grace)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return clean
