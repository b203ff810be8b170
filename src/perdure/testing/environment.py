"""A test environment in two lines: a throwaway store, an in-process worker, a fake clock.

::

    from perdure.testing import Environment

    with Environment(app) as env:
        handle = env.start(checkout, "o-1")
        env.run_until_idle()              # every run that can move, moves; then it returns
        env.app.signal(handle.run_id, "approval", True)
        env.advance(timedelta(days=1))    # the clock jumps; due sleeps and timeouts run now
        assert handle.result(timeout=0) == {...}

The environment points the app at its own store (a temporary SQLite file by
default, or the PostgreSQL database named by ``store=``) on a
:class:`~perdure.testing.clock.FakeClock`, for the time of the ``with`` block.
Runs execute in the calling thread, one after another, through the same
:class:`~perdure.execution.Execution` a worker uses: replay, fences, effects
and parks behave as in production, and nothing depends on a poll interval.
Real time passes only in the pauses between a step's retries.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
import threading
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from types import TracebackType
from typing import Any

from perdure import app as app_api
from perdure import client as client_api
from perdure import context, execution, registry, schedules, telemetry
from perdure.store import controlport, open_store, port, scheduleport
from perdure.testing import clock as clocks

# Long enough that a lease never lapses while a run executes in the calling
# thread, even if a step moves the fake clock.
_LEASE_TTL = 24 * 3600.0
_MAX_EXECUTIONS = 10_000


@contextlib.contextmanager
def temporary_store(**options: Any) -> Iterator[port.Store]:
    """Yield a fresh, migrated embedded store in a temporary folder, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="perdure-") as folder:
        store = open_store(f"sqlite:///{Path(folder) / 'perdure.db'}", **options)
        try:
            yield store
        finally:
            store.close()


class _Host:
    """What an Execution needs from the worker that drives it (``perdure.host.Host``)."""

    def __init__(self, env: Environment, store: port.Store) -> None:
        self.env = env
        self.registry: registry.Registry = env.app
        self.store = store
        self.telemetry: telemetry.Telemetry = env.app.telemetry

    @property
    def stopping(self) -> bool:
        return False

    def wait_stopping(self, timeout: float) -> bool:
        threading.Event().wait(timeout)  # the pause between a step's retries
        return False

    def invoke(
        self,
        wf: registry.WorkflowDef,
        ctx: context.Context,
        args: list[Any],
        kwargs: dict[str, Any],
    ) -> Any:
        """Call the workflow function with ``ctx`` bound; ``async`` ones on a loop thread."""
        if wf.is_async:

            async def call() -> Any:
                token = ctx.bind()
                try:
                    return await wf.fn(ctx, *args, **kwargs)
                finally:
                    ctx.unbind(token)

            return asyncio.run_coroutine_threadsafe(call(), self.env._event_loop()).result()
        token = ctx.bind()
        try:
            return wf.fn(ctx, *args, **kwargs)
        finally:
            ctx.unbind(token)


class Busy(RuntimeError):
    """``run_until_idle`` ran more executions than its bound: a run that never rests."""


class Environment:
    """A throwaway store, an in-process worker and a fake clock for one app.

    Args:
        app: the app under test; inside the ``with`` block it uses the
            environment's store (its own store is left untouched).
        store: the URL of a store to use instead of a temporary SQLite file:
            an empty PostgreSQL database, or a SQLite file that outlives the
            environment (the environment neither empties nor removes it).
        start: the fake clock's first instant (default 2030-01-01 UTC); without
            it, an app built with a ``FakeClock`` keeps its own.
    """

    def __init__(
        self, app: app_api.App, *, store: str | None = None, start: datetime | None = None
    ) -> None:
        self.app = app
        # An app built on a FakeClock keeps it, so the test's clock and the store's agree.
        own = app.clock
        self.clock = (
            own if isinstance(own, clocks.FakeClock) and start is None else clocks.FakeClock(start)
        )
        self.worker_id = f"perdure-env-{os.getpid()}"
        self._url = store
        self._schedules_saved: list[scheduleport.ScheduleSpec] = []
        self._stack: contextlib.ExitStack | None = None
        self._store: port.Store | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None

    # -- lifecycle ----------------------------------------------------------------

    def __enter__(self) -> Environment:
        self.open()
        return self

    def open(self) -> Environment:
        """Open the store and point the app at it; ``with`` and first use do it. Idempotent."""
        if self._store is not None:
            return self
        stack = contextlib.ExitStack()
        try:
            if self._url is None:
                store = stack.enter_context(temporary_store(clock=self.clock))
            else:
                store = open_store(self._url, clock=self.clock)
                stack.callback(store.close)
            stack.enter_context(self.app.using(store))
            self.app.migrate()  # the tables the app's transaction steps write
        except BaseException:
            stack.close()
            raise
        self._stack, self._store = stack, store
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Give the app its own store back and remove the temporary one. Idempotent.

        A later use opens a fresh, empty environment store again.
        """
        stack, self._stack, self._store = self._stack, None, None
        self._schedules_saved = []
        if stack is not None:
            stack.close()
        loop, self._loop = self._loop, None
        if loop is not None:
            loop.call_soon_threadsafe(loop.stop)
            if self._loop_thread is not None:
                self._loop_thread.join(5.0)
            if not loop.is_running():
                loop.close()

    @property
    def store(self) -> port.Store:
        """The environment's store, opened on first use (see :meth:`open`)."""
        if self._store is None:
            self.open()
        assert self._store is not None
        return self._store

    # -- driving runs -------------------------------------------------------------

    def start(self, workflow: Any, /, *args: Any, **kwargs: Any) -> client_api.RunHandle[Any]:
        """Start a run (``app.start``); it executes at the next :meth:`run_until_idle`."""
        self.open()  # before the app would open its own store
        return self.app.start(workflow, *args, **kwargs)

    def run_until_idle(
        self, *, max_executions: int = _MAX_EXECUTIONS, dry_run: bool = False
    ) -> int:
        """Execute runs until none can be claimed now; return how many executions ran.

        ``dry_run=True`` executes the dry runs instead (and only them), as
        ``app.worker(dry_run=True)`` does.

        A run rests when it ends, waits for a signal, a message or a child
        that has not come, sleeps until a later instant, or backs off after a
        failure; each execution takes a run from one rest to the next.

        Raises:
            Busy: ``max_executions`` executions (default 10,000) and still
                runs to claim: a run that never rests for long.
        """
        store = self.store
        ran = 0
        self._tick(store)
        # As a worker's sweep does: runs past their deadline are canceled.
        if isinstance(store, controlport.ControlStore):
            store.expire_deadlines(app=self.app.name)
        while True:
            claimed = store.claim(
                self.app.name,
                self.worker_id,
                self.app.workflow_versions(),
                lease_ttl=_LEASE_TTL,
                limit=1,
                dry_run=dry_run,
            )
            if not claimed:
                if self._tick(store):
                    continue
                return ran
            execution.Execution(_Host(self, store), claimed[0]).run()
            ran += 1
            if ran >= max_executions:
                raise Busy(f"still claiming runs after {ran} executions")

    def advance(self, delta: timedelta | float) -> datetime:
        """Move the fake clock forward, running what falls due on the way; return the new now.

        Time moves from one due instant to the next (a sleep's end, a wait's
        timeout, the end of a backoff) and the runs due then execute at that
        instant, as they would have with the time passing: a run that wakes
        from a one-day sleep inside a one-week advance and then waits three
        days times out within the same advance, four days before its end.
        """
        seconds = delta.total_seconds() if isinstance(delta, timedelta) else float(delta)
        if seconds < 0:
            raise ValueError("a clock never goes back")
        target = self.clock.now() + timedelta(seconds=seconds)
        while True:
            self.run_until_idle()
            due = self._next_due(after=self.clock.now())
            if due is None or due > target:
                break
            self.clock.set(due)
        self.clock.set(target)
        self.run_until_idle()
        return target

    def _next_due(self, *, after: datetime) -> datetime | None:
        """Return the earliest instant after ``after`` at which a resting run falls due."""
        store = self.store
        instants = [t.due for t in store.timers(self.app.name)]
        instants += [w.deadline for w in store.waits(self.app.name) if w.deadline is not None]
        declared = {s.name for s in self.app.schedule_specs()}
        if declared:
            for record in schedules.listing(store, self.app.name):
                if record.name in declared and record.next_tick is not None:
                    instants.append(record.next_tick)
        return min((i for i in instants if i > after), default=None)

    def _tick(self, store: port.Store) -> bool:
        """Start the runs of the app's due schedule ticks; return whether it started any."""
        specs = self.app.schedule_specs()
        if not specs:
            return False
        # Saved again when the app declares others, as a worker of a new deploy does.
        if specs != self._schedules_saved:
            schedules.save(store, self.app.name, specs)
            self._schedules_saved = specs
        before = [s.last_tick for s in schedules.listing(store, self.app.name)]
        # catch_up="all" starts a bounded batch per evaluation: repeat while due now.
        while True:
            due = schedules.evaluate(store, self.app.name, {s.name for s in specs})
            if due is None or due > self.clock.now():
                break
        return before != [s.last_tick for s in schedules.listing(store, self.app.name)]

    def now(self) -> datetime:
        """Return the fake clock's instant."""
        return self.clock.now()

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            self._loop_thread = threading.Thread(
                target=self._loop.run_forever, name="perdure-env-loop", daemon=True
            )
            self._loop_thread.start()
        return self._loop
