"""The worker: claims runs, executes them through Context + replay, parks, sweeps.

One claim loop thread, one heartbeat thread, a thread pool for executions
(``concurrency`` slots) and, when async workflows are registered, one event
loop thread that runs their coroutines. Leases are renewed by a companion
process that a step holding the GIL cannot starve (:mod:`perdure.keeper`),
or by the heartbeat thread where the store cannot be reopened from its URL.
A claimed run executes from the top of its code; replay returns recorded
outcomes until the first unrecorded position. Recovery after a crash is this
same path: the next claim of a run whose lease lapsed.
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
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any, Literal

from perdure import clockwatch, context, errors, keeper, plans, schedules
from perdure import execution as execution_api
from perdure import ownership as ownership_api
from perdure import tasks as tasks_api
from perdure import telemetry as telemetry_api
from perdure import warm as warm_api
from perdure.registry import Registry, WorkflowDef
from perdure.store import planport, port, retention, scheduleport

log = logging.getLogger("perdure.worker")

# How long a worker waits for its lease keeper to open the store before it
# renews from its own heartbeat thread instead.
_KEEPER_START = 30.0
# The longest pause between claims while the store keeps failing.
_MAX_CLAIM_BACKOFF = 30.0
# Runs deleted per sweep at most: pruning a big store never holds claims for long.
_PRUNE_BATCH = 500


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

    def stop(self, timeout: float | None = None) -> bool:
        """Stop claiming; let in-flight runs record their current step, then release them.

        Leases stay renewed while in-flight steps finish. Waits up to
        ``timeout`` seconds (``None``: as long as it takes) or until
        :meth:`stop_now`; runs still in flight then are released at once and
        named in the log, with any ``once`` effect whose outcome is now
        unknown. Returns True when no run was left in flight.
        """
        self._stop_event.set()
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
        while self._active and not self._at_once.is_set():
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

    def _abandon_task(self, execution: tasks_api.TaskExecution) -> None:
        """Hand a task back, unless a once attempt may have had its effect (then it lapses)."""
        if execution.unsettled_effect() is not None:
            log.warning(
                "worker %s left the once task %s in flight: its outcome is unknown, so it "
                "will need attention (effect_outcome_unknown)",
                self.worker_id,
                execution.key,
            )
            return
        log.warning(
            "worker %s left the task %s in flight; it will run again", self.worker_id, execution.key
        )
        if execution.lost is None and isinstance(self.store, planport.PlanStore):
            with contextlib.suppress(Exception, errors.LeaseLost):
                self.store.release_task(execution.claim)

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

    def __enter__(self) -> Worker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop(timeout=self.grace)

    # -- claiming -------------------------------------------------------------

    def _await_keeper(self) -> None:
        """Claim nothing until the keeper renews.

        A step holding the GIL from the first claim on would otherwise starve
        the only other renewer, the heartbeat thread.
        """
        kept = self._keeper
        if kept is None:
            return
        deadline = time.monotonic() + _KEEPER_START
        while not kept.ready.wait(0.05):
            if self._stop_event.is_set():
                return
            if not kept.alive or time.monotonic() > deadline:
                log.warning(
                    "worker %s: the lease keeper did not start; renewing from this process",
                    self.worker_id,
                )
                self._keeper = None
                self.liveness = "thread"
                kept.close()
                return

    def _claim_loop(self) -> None:
        self._await_keeper()
        if self.ownership == "store-lease" and not self._owner.stand_by(
            self._stop_event, self._watch_clock
        ):
            return
        last_sweep = 0.0
        failures = 0
        while not self._stop_event.is_set():
            try:
                self._watch_clock()
            except Exception as exc:
                # The claim below meets the same outage and says so; until a
                # reading succeeds, claims are bounded by the last one.
                log.debug("worker %s: cannot read the store's clock: %s", self.worker_id, exc)
            # Before the slots are counted: starting a tick's run takes no slot.
            self._tick_safely()
            free = self.concurrency - len(self._active)
            if free <= 0:
                self._slot_freed.wait(self.poll_interval)
                self._slot_freed.clear()
                continue
            try:
                if time.monotonic() - last_sweep >= self.sweep_interval:
                    last_sweep = time.monotonic()
                    self.store.sweep()
                    self._prune()
                claimed = self._owner.claim(
                    self.store,
                    self.registry.workflow_versions(),
                    lease_ttl=self._claim_ttl,
                    limit=free,
                    recover_until=self._clock_watch.recover_until(time.monotonic()),
                    dry_run=self.dry_run,
                )
            except errors.OwnershipConflict as exc:
                if exc.holder != self.worker_id:
                    # Taken over: the new holder's takeover fenced this one's runs off.
                    log.error("worker %s lost app %s: %s", self.worker_id, exc.app, exc)
                    self.stop_now()
                    return
                # Its own record lapsed (a renewal is late): claim again once renewed.
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
                self._stop_event.wait(pause)
                continue
            failures = 0
            if claimed:
                self.telemetry.claimed(self.registry.name, len(claimed))
            for item in claimed:
                self._dispatch(item)
            tasks = self._claim_tasks(free - len(claimed))
            if not claimed and not tasks:
                self.store.wait_ready(self._idle_timeout())

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

    def _note_wake(self, when: datetime | None) -> None:
        if when is None:
            return
        left = (when - self.store.now()).total_seconds()
        at = time.monotonic() + max(0.0, left)
        if self._next_wake is None or at < self._next_wake:
            self._next_wake = at
            self.store.notify_ready()

    def _plans(self) -> dict[str, plans.Plan]:
        """The app's plans by name (a registry written before plans declares none)."""
        found = getattr(self.registry, "plans", None)
        return dict(found) if isinstance(found, dict) else {}

    def _claim_tasks(self, free: int) -> int:
        """Claim and start up to ``free`` tasks of the app's plans; return how many."""
        served = self._plans()
        if free <= 0 or not served or self.dry_run:
            return 0
        store = self.store
        if not isinstance(store, planport.PlanStore):
            return 0
        try:
            claims = store.claim_tasks(
                self.registry.name,
                self.worker_id,
                [p.identity for p in served.values()],
                lease_ttl=self._claim_ttl,
                limit=free,
                recover_until=self._clock_watch.recover_until(time.monotonic()),
            )
        except Exception as exc:
            log.warning("worker %s: task claim failed: %s", self.worker_id, exc)
            return 0
        for claim in claims:
            plan = served.get(claim.workflow)
            assert plan is not None  # claims are only of the plans served
            execution = tasks_api.TaskExecution(
                store,
                claim,
                plan,
                self.registry.payloads,
                stopping=self._stop_event,
                loop=lambda: self._loop,
            )
            self._start(execution)
            if self._keeper is not None:
                self._keeper.hold_task(execution.key, claim)
        return len(claims)

    def _start(self, execution: Execution | tasks_api.TaskExecution) -> None:
        with self._active_lock:
            self._active[execution.key] = execution
        assert self._pool is not None
        try:
            self._pool.submit(self._execute, execution)
        except RuntimeError:
            self._forget(execution)

    # -- warm parking (perdure.warm) ----------------------------------------------

    @property
    def warm_for(self) -> float:
        return self._warm_for

    def warm_slot(self, execution: Execution) -> warm_api.WarmSlot | None:
        # Only a worker that serves (its claim loop hands claims over) keeps runs warm:
        # an execution driven by hand parks the ordinary way.
        if self._warm_cap == 0 or self._pool is None or self._stop_event.is_set():
            return None
        with self._warm_lock:
            if len(self._warm) >= self._warm_cap or execution.key in self._warm:
                return None
            slot = warm_api.WarmSlot(execution.key)
            self._warm[execution.key] = (slot, execution)
            return slot

    def warm_parked(
        self, execution: Execution, slot: warm_api.WarmSlot, wake: datetime | None
    ) -> None:
        with self._active_lock:
            if self._active.get(execution.key) is execution:
                del self._active[execution.key]
        if self._keeper is not None:
            self._keeper.drop(execution.key, execution.claim.generation)
        with self._warm_lock:
            slot.parked = True
        slot.settled.set()
        self._slot_freed.set()
        self._note_wake(wake)

    def warm_cooled(self, slot: warm_api.WarmSlot) -> port.Claimed | None:
        with self._warm_lock:
            found = self._warm.get(slot.run_id)
            if found is not None and found[0] is slot:
                del self._warm[slot.run_id]
                slot.settled.set()
                return None
        # A claim took the slot: its hand-over follows at once.
        slot.wait(5.0)
        return slot.taken()

    def _cool_all(self) -> None:
        with self._warm_lock:
            slots = [slot for slot, _ in self._warm.values()]
            self._warm.clear()
        for slot in slots:
            slot.hand(None)

    def _take_warm(self, claimed: port.Claimed) -> bool:
        """Hand a claim to the run's warm execution, if it waits here and still fits."""
        if not self._warm:
            return False
        run_id = claimed.claim.run_id
        with self._warm_lock:
            found = self._warm.get(run_id)
        if found is None:
            return False
        # A claim can follow the park's commit before its thread says it parked.
        found[0].settled.wait(1.0)
        with self._warm_lock:
            if self._warm.get(run_id) is not found or not found[0].parked:
                return False
            del self._warm[run_id]
        slot, execution = found
        if claimed.recovered or not execution.matches(claimed):
            # Another pass ran it meanwhile: the claim replays the journal instead.
            log.debug("worker %s: run %s moved on elsewhere; replaying", self.worker_id, run_id)
            slot.hand(None)
            return False
        with self._active_lock:
            self._active[run_id] = execution
        if self._keeper is not None:
            self._keeper.hold(claimed.claim)
        slot.hand(claimed)
        return True

    def _dispatch(self, claimed: port.Claimed) -> None:
        if self._take_warm(claimed):
            return
        execution = Execution(self, claimed)
        with self._active_lock:
            self._active[claimed.claim.run_id] = execution
        if self._keeper is not None:
            self._keeper.hold(claimed.claim)
        assert self._pool is not None
        try:
            self._pool.submit(self._execute, execution)
        except RuntimeError:
            self._forget(execution)

    def _forget(self, execution: Execution | tasks_api.TaskExecution) -> None:
        with self._active_lock:
            if self._active.get(execution.key) is execution:
                del self._active[execution.key]
        if self._keeper is not None:
            self._keeper.drop(execution.key, execution.claim.generation)
        self._slot_freed.set()

    def _lost(self, run_id: str, generation: int, lost: errors.LeaseLost) -> None:
        """Take the keeper's word that a renewal was refused."""
        with self._active_lock:
            execution = self._active.get(run_id)
        if execution is not None and execution.claim.generation == generation:
            execution.log.info("lease renewal refused (%s)", lost.code)
            execution.lost = lost

    def _heartbeat_loop(self) -> None:
        warned = False
        while not self._halt.wait(self.heartbeat):
            if not self._owner.renew():
                # Another worker took the app over: its claims fence this one's
                # runs off; stop claiming, and stop their steps at once.
                self.stop_now()
            kept = self._keeper
            if self.ownership == "none":
                pass  # no run lease to renew
            elif kept is not None and kept.ready.is_set() and kept.alive:
                kept.beat()
            else:
                if kept is not None and kept.ready.is_set() and not warned:
                    warned = True
                    log.warning(
                        "worker %s: the lease keeper exited; renewing from this process",
                        self.worker_id,
                    )
                # Also while the keeper is starting: it renews nothing yet.
                self._renew_here()
            if self._stop_event.is_set() and not self._active:
                return

    def _renew_here(self) -> None:
        for execution in list(self._active.values()):
            if execution.lost is not None:
                continue
            try:
                if isinstance(execution, tasks_api.TaskExecution):
                    assert isinstance(self.store, planport.PlanStore)
                    claim = execution.claim
                    execution.renewed(self.store.renew_task(claim, lease_ttl=self.lease_ttl))
                    continue
                execution.renewed(self.store.renew(execution.claim, lease_ttl=self.lease_ttl))
            except errors.LeaseLost as lost:
                execution.log.info("lease renewal refused (%s)", lost.code)
                execution.lost = lost
            except Exception as exc:
                execution.log.warning("lease renewal failed: %s", exc)

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
