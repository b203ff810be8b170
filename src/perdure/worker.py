"""The worker: claims runs, executes them through Context + replay, parks, sweeps.

One claim loop thread, one heartbeat thread, a thread pool for executions
(``concurrency`` slots) and, when async workflows are registered, one event
loop thread that runs their coroutines. Leases are renewed by a companion
process that a step holding the GIL cannot starve (:mod:`perdure.keeper`),
or by the heartbeat thread where the store cannot be reopened from its URL.
A claimed run executes from the top of its code; replay returns recorded
outcomes until the first unrecorded position. Recovery after a crash is this
same path: the next claim of a run whose lease lapsed.

Its parts are base classes of it, each in a module of its own: stopping
(:mod:`perdure.shutdown`), lease renewal (:mod:`perdure.renewal`), the plan
tasks it claims (:mod:`perdure.taskclaims`) and the slots of its warm-parked
runs (:mod:`perdure.warmslots`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import secrets
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from datetime import datetime
from typing import Any, Literal

from perdure import (
    clockwatch,
    context,
    eagerslots,
    endings,
    errors,
    keeper,
    renewal,
    schedules,
    shutdown,
    taskclaims,
    warmslots,
)
from perdure import execution as execution_api
from perdure import ownership as ownership_api
from perdure import tasks as tasks_api
from perdure import telemetry as telemetry_api
from perdure import warm as warm_api
from perdure.registry import Registry, WorkflowDef
from perdure.store import port, retention, scheduleport

log = logging.getLogger("perdure.worker")

# The longest pause between claims while the store keeps failing.
_MAX_CLAIM_BACKOFF = 30.0
# Runs deleted per sweep at most: pruning a big store never holds claims for long.
_PRUNE_BATCH = 500
# The shortest idle wait for a lease to lapse: a store clock held still (a
# test's) must not turn the wait into a spin.
_LAPSE_MIN_WAIT = 0.05


# Defined with the execution that uses it; named here for callers.
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


class Worker(
    shutdown.Shutdown,
    renewal.Renewal,
    taskclaims.TaskClaims,
    warmslots.WarmSlots,
    eagerslots.EagerSlots,
):
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
        grace: float = 30.0,
        liveness: Literal["process", "thread"] = "process",
        store_url: str | None = None,
        telemetry: telemetry_api.Telemetry = telemetry_api.NONE,
        dry_run: bool = False,
        ownership: str = "run-lease",
        lease_wait: float = 60.0,
        standby: bool = True,
        warm: int | None = None,
        warm_for: float = 5.0,
        eager: bool = True,
    ) -> None:
        validate_timing(lease_ttl, heartbeat)
        posture = ownership_api.posture(ownership)
        if grace < 0:
            raise errors.InvalidInput(f"grace must be at least 0 seconds, got {grace}")
        if liveness not in ("process", "thread"):
            raise errors.InvalidInput(f"liveness must be 'process' or 'thread', got {liveness!r}")
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
        self.telemetry = telemetry
        self.concurrency = concurrency
        self.lease_ttl = lease_ttl
        self.heartbeat = heartbeat
        self.poll_interval = poll_interval
        self.sweep_interval = sweep_interval
        self.grace = grace
        # The keeper reopens the store by URL; a store handed over as an object
        # (a wrapper, an injected clock) can only be renewed from here.
        self.liveness: Literal["process", "thread"] = (
            "process" if liveness == "process" and store_url and posture != "none" else "thread"
        )
        # Under "none" no run lease is renewed: runs are claimed for good, and
        # only the app's owner record is kept alive (see perdure.ownership).
        self.ownership = posture
        self._claim_ttl = ownership_api.UNRENEWED_LEASE if posture == "none" else lease_ttl
        self._owner = ownership_api.AppOwner(
            store,
            registry.name,
            posture,
            self.worker_id,
            lease_ttl,
            lease_wait=lease_wait,
            standby=standby,
        )
        self._keeper: keeper.Keeper | None = None
        if self.liveness == "process" and store_url:
            self._keeper = keeper.Keeper(
                store_url,
                lease_ttl=lease_ttl,
                heartbeat=heartbeat,
                on_lost=self._lost,
            )
        # Lapsed runs are recovered only while the store's clock keeps pace
        # with this process's monotonic clock (see perdure.clockwatch).
        self._clock_watch = clockwatch.ClockWatch(
            lease_ttl, sample_every=min(poll_interval, lease_ttl / 6)
        )
        # Runs by run id, and tasks of plan runs by "run_id/task".
        self._active: dict[str, Execution | tasks_api.TaskExecution] = {}
        self._active_lock = threading.Lock()
        self._slot_freed = threading.Event()
        self._stop_event = threading.Event()
        self._at_once = threading.Event()
        self._signals = 0  # SIGINT/SIGTERM received by run()
        self._halt = threading.Event()
        self._threads: list[threading.Thread] = []
        self._pool: ThreadPoolExecutor | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._next_wake: float | None = None
        # When (monotonic) the app's schedules are evaluated next; None: at once
        # (a test clock that moves sets it so, see clock_moved).
        self._next_tick: float | None = None
        # A registry written before schedules existed declares none.
        self._schedule_specs: Callable[[], list[scheduleport.ScheduleSpec]] = getattr(
            registry, "schedule_specs", list
        )
        # A dry-run worker claims dry runs only, and starts no scheduled (real) runs.
        self.dry_run = dry_run
        self._scheduled = not dry_run and bool(self._schedule_specs())
        self._schedules_saved = False
        self._started = False
        # Parked runs kept in memory, by run id (perdure.warm): at most ``warm``
        # of them (default: as many as run at once), each for ``warm_for`` seconds.
        cap = concurrency if warm is None else warm
        if cap < 0 or not warm_for >= 0:
            raise errors.InvalidInput(
                f"warm must be at least 0 and warm_for at least 0 seconds, got {warm}, {warm_for}"
            )
        self._warm_cap = cap if warm_for > 0 else 0
        self._warm_for = float(warm_for)
        self._warm: dict[str, tuple[warm_api.WarmSlot, Execution]] = {}
        self._warm_lock = threading.Lock()
        # Runs started in this process go straight to this worker (perdure.starts).
        self.eager = eager

    # -- lifecycle ------------------------------------------------------------

    @property
    def stopping(self) -> bool:
        return self._stop_event.is_set()

    def wait_stopping(self, timeout: float) -> bool:
        """Block up to ``timeout`` seconds or until the worker stops; return whether it does."""
        return self._stop_event.wait(timeout)

    def acquire(self) -> None:
        """Take the app's owner record now (``start`` does it if this did not).

        Raises:
            errors.OwnershipConflict: a worker of another posture serves the
                app, or, under ``none``, any other worker.
        """
        self._owner.acquire()

    @property
    def standing_by(self) -> bool:
        """Whether this store-lease worker waits for another to give the app up."""
        return self.ownership == "store-lease" and self._owner.held is None

    def start(self) -> Worker:
        """Start serving in background threads; return self."""
        if self._started:
            return self
        self._owner.acquire()
        self._started = True
        # Start listening for ready runs now, so no notification sent before the
        # first idle wait is missed.
        self.store.wait_ready(0)
        if self._keeper is not None:
            try:
                self._keeper.start()
                self._keeper_started = time.monotonic()
            except OSError as exc:
                log.warning(
                    "worker %s: no lease keeper (%s); renewing from a thread", self.worker_id, exc
                )
                self._keeper = None
                self.liveness = "thread"
        # Warm-parked runs hold a thread each, beside the ones that run.
        threads = self.concurrency + self._warm_cap
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="perdure-run")
        self._loop = asyncio.new_event_loop()
        for target, name in (
            (self._loop.run_forever, "perdure-loop"),
            (self._claim_loop, "perdure-claim"),
            (self._heartbeat_loop, "perdure-heartbeat"),
        ):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        self.telemetry.watch(self.registry.name, self.census)
        log.info("worker %s serving app %s", self.worker_id, self.registry.name)
        return self

    def census(self) -> telemetry_api.Census:
        """Return the app's runs by state and the lag of its most overdue timer."""
        found = self.store.census(self.registry.name)
        lag = 0.0
        if found.oldest_due is not None:
            lag = max(0.0, (found.at - found.oldest_due).total_seconds())
        return telemetry_api.Census(found.states, lag)

    def __enter__(self) -> Worker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop(timeout=self.grace)

    # -- claiming -------------------------------------------------------------

    def _claim_loop(self) -> None:
        self._await_keeper()
        if self.ownership == "store-lease" and not self._owner.stand_by(
            self._stop_event, self._watch_clock
        ):
            return
        last_sweep = 0.0
        failures = 0
        # Whether the last idle wait ended with a wake-up (not its timeout).
        notified = False
        while not self._stop_event.is_set():
            try:
                self._watch_clock()
            except Exception as exc:
                # The claim below meets the same outage and says so; until a
                # reading succeeds, claims are bounded by the last one.
                log.debug("worker %s: cannot read the store's clock: %s", self.worker_id, exc)
            # Before the slots are counted: starting a tick's run takes no slot.
            self._tick_safely()
            free = self._claim_slots()
            if free <= 0:
                self._slot_freed.wait(self.poll_interval)
                self._slot_freed.clear()
                continue
            try:
                if time.monotonic() - last_sweep >= self.sweep_interval:
                    last_sweep = time.monotonic()
                    self.store.sweep()
                    self._prune()
                known = self._known_journals()
                # A wake-up that named only runs parked warm here: those alone are
                # claimed, by key. A timeout claims the ordinary way (timers, lapses).
                claimed, ordinary = self._claim_woken(known, free) if notified else ([], True)
                polled, notified = not notified, False
                if ordinary and len(claimed) < free:
                    try:
                        claimed += self._owner.claim(
                            self.store,
                            self.registry.workflow_versions(),
                            lease_ttl=self._claim_ttl,
                            limit=free - len(claimed),
                            recover_until=self._clock_watch.recover_until(time.monotonic()),
                            dry_run=self.dry_run,
                            known=known,
                        )
                    except Exception:
                        # What was claimed by key is this worker's: run it all the same.
                        self._dispatch(claimed, known)
                        raise
            except errors.OwnershipConflict as exc:
                if exc.holder != self.worker_id:
                    # Taken over: the new holder's takeover fenced this one's runs off.
                    log.error("worker %s lost app %s: %s", self.worker_id, exc.app, exc)
                    self.stop_now()
                    return
                # Its own record lapsed (a renewal is late): claim again once renewed.
                self._claims_filled()
                self._stop_event.wait(self.poll_interval)
                continue
            except Exception as exc:
                failures += 1
                # Back off while the store keeps failing: an outage or a damaged
                # file is reported, not hammered.
                pause = min(self.poll_interval * 2 ** min(failures - 1, 10), _MAX_CLAIM_BACKOFF)
                level = logging.ERROR if isinstance(exc, errors.StoreDamaged) else logging.WARNING
                log.log(
                    level,
                    "worker %s: claim failed (%d in a row, next try in %.1fs): %s",
                    self.worker_id,
                    failures,
                    pause,
                    exc,
                )
                self._claims_filled()
                self._stop_event.wait(pause)
                continue
            failures = 0
            if claimed:
                self.telemetry.claimed(self.registry.name, len(claimed))
            self._dispatch(claimed, known)
            tasks = self._claim_tasks(free - len(claimed))
            self._claims_filled()
            if len(claimed) + tasks < free:
                # Short of the slots free: nothing else was ready. Whatever
                # becomes ready from here is announced, and an announcement
                # made meanwhile ends this wait at once, so claiming again
                # now would only find nothing. A lapse is not announced: after
                # a poll found nothing, the wait ends when the next lease lapses.
                if polled and not claimed:
                    self._wake_at_lapse()
                notified = self.store.wait_ready(self._idle_timeout())

    def _prune(self) -> None:
        """Delete one bounded batch of the app's runs that ended before its retention."""
        kept = self.registry.retention
        if kept is None or not isinstance(self.store, retention.PrunableStore):
            return
        pruned = self.store.prune(self.registry.name, self.store.now() - kept, _PRUNE_BATCH)
        if pruned:
            log.info(
                "worker %s: pruned %d runs that ended over %s ago", self.worker_id, pruned, kept
            )

    def clock_moved(self) -> None:
        """Evaluate the schedules at the next turn of the claim loop: a test clock moved."""
        self._next_tick = None

    def _tick_safely(self) -> None:
        """Evaluate the schedules; a failure is logged and retried, and never stops claims."""
        try:
            self._tick()
        except Exception as exc:
            self._next_tick = time.monotonic() + self.poll_interval
            log.warning("worker %s: cannot evaluate the schedules: %s", self.worker_id, exc)

    def _tick(self) -> None:
        """Start the runs of the schedules' due ticks, when one may be due."""
        if not self._scheduled:
            return
        if self._next_tick is not None and time.monotonic() < self._next_tick:
            return
        specs = self._schedule_specs()
        if not self._schedules_saved:
            schedules.save(self.store, self.registry.name, specs)
            self._schedules_saved = True
        due = schedules.evaluate(self.store, self.registry.name, {s.name for s in specs})
        # Evaluated again at the next tick, and at least every sweep interval,
        # which picks up schedules paused or resumed elsewhere.
        left = self.sweep_interval
        if due is not None:
            left = min(left, max(0.0, (due - self.store.now()).total_seconds()))
        self._next_tick = time.monotonic() + left
        if self._next_wake is None or self._next_tick < self._next_wake:
            self._next_wake = self._next_tick

    def _watch_clock(self) -> None:
        """Read the store's clock when due; warn when it stepped forward."""
        if not self._clock_watch.wants_reading(time.monotonic()):
            return
        before = time.monotonic()
        store_now = self.store.now()
        step = self._clock_watch.observe(store_now, before, time.monotonic())
        if step is not None:
            log.warning(
                "worker %s: the store's clock jumped %.1fs ahead of this host's monotonic "
                "clock; recovering no lapsed runs for %gs, so live owners can renew",
                self.worker_id,
                step.gained,
                step.distrust_for,
            )

    def _idle_timeout(self) -> float:
        timeout = self.poll_interval
        if self._next_wake is not None:
            left = self._next_wake - time.monotonic()
            if left <= 0:
                self._next_wake = None
                return 0.0
            timeout = min(timeout, left)
        return timeout

    def _wake_at_lapse(self) -> None:
        """End the next idle wait when the app's next lease lapses, if before the poll.

        Until the store's clock is trusted (a lease TTL after its first
        reading) no claim recovers a run, so the wait ends then instead, for
        leases that lapsed meanwhile.
        """
        wake = self._clock_watch.trusted_from
        if wake is None or wake <= time.monotonic():
            try:
                at = self.store.next_lapse(self.registry.name)
                left = None if at is None else (at - self.store.now()).total_seconds()
            except Exception as exc:
                # The poll finds the lapse all the same, only later.
                log.debug("worker %s: cannot read the next lapse: %s", self.worker_id, exc)
                return
            wake = None if left is None else time.monotonic() + max(_LAPSE_MIN_WAIT, left)
        if wake is not None and (self._next_wake is None or wake < self._next_wake):
            self._next_wake = wake

    def _note_wake(self, when: datetime | None) -> None:
        if when is None:
            return
        left = (when - self.store.now()).total_seconds()
        at = time.monotonic() + max(0.0, left)
        if self._next_wake is None or at < self._next_wake:
            self._next_wake = at
            self.store.notify_ready()

    def _start(self, execution: Execution | tasks_api.TaskExecution) -> None:
        self._activate(execution)
        self._submit(execution)

    def _activate(self, execution: Execution | tasks_api.TaskExecution) -> None:
        """Count ``execution`` among this worker's; callers here wait on it in memory."""
        with self._active_lock:
            self._active[execution.key] = execution
        endings.of(self.store).hold(execution.key)

    def _deactivate(self, execution: Execution | tasks_api.TaskExecution) -> None:
        """Stop counting ``execution`` (unless a newer one of its run replaced it)."""
        with self._active_lock:
            if self._active.get(execution.key) is not execution:
                return
            del self._active[execution.key]
        endings.of(self.store).let_go(execution.key)

    def _submit(self, execution: Execution | tasks_api.TaskExecution) -> None:
        assert self._pool is not None
        try:
            future = self._pool.submit(self._execute, execution)
        except RuntimeError:  # the pool is shut down: a stop outlasted the claim loop
            self._unstarted(execution)
            return

        def cancelled(done: Future[None]) -> None:
            # A stop cancels what no thread has picked up yet: hand those claims back.
            if done.cancelled():
                self._unstarted(execution)

        future.add_done_callback(cancelled)

    def _dispatch(
        self,
        claimed: Sequence[port.Claimed],
        known: Mapping[str, port.KnownJournal] | None = None,
    ) -> None:
        """Start the executions of runs just claimed (a warm one goes on in its thread)."""
        executions = []
        for item in claimed:
            if self._take_warm(item):
                continue
            if known and item.claim.run_id in known:
                # Its warm execution let go meanwhile. The journal the claim
                # returned is the one it knew (the claim proved it current),
                # and a claim by key may have left out the outcomes it held;
                # a replay reads the stored ones, as it always does.
                try:
                    run_id = item.claim.run_id
                    stored = self.store.journal(run_id), self.store.outcomes(run_id)
                    item = replace(item, journal=stored[0], outcomes=stored[1])
                except Exception as exc:
                    log.debug(
                        "worker %s: journal of %s unread: %s",
                        self.worker_id,
                        item.claim.run_id,
                        exc,
                    )
            execution = Execution(self, item)
            self._activate(execution)
            executions.append(execution)
        if self._keeper is not None and executions:
            # One line per claim but one write for them all, before any of them
            # starts: the keeper wakes once per claim batch, not once per run.
            self._keeper.hold_all([e.claimed.claim for e in executions])
        for execution in executions:
            self._submit(execution)

    def _forget(self, execution: Execution | tasks_api.TaskExecution) -> None:
        self._deactivate(execution)
        if self._keeper is not None:
            # An execution that ended, parked or let its run go has settled its
            # claim in the store; one interrupted may leave the run running.
            settled = isinstance(execution, Execution) and execution.ended != "interrupted"
            self._keeper.drop(execution.key, execution.claim.generation, settled=settled)
        self._slot_freed.set()

    # -- executing ------------------------------------------------------------

    def _execute(self, execution: Execution | tasks_api.TaskExecution) -> None:
        try:
            self._note_wake(execution.run())
        except errors.StaleClaim:
            execution.log.info("claim is stale; another worker owns it")
        except Exception:
            execution.log.error("unexpected engine error", exc_info=True)
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
