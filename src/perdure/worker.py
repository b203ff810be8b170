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
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Literal, Protocol

from perdure import clockwatch, codec, context, effects, errors, keeper, validation
from perdure.store import port

log = logging.getLogger("perdure.worker")

# How long a worker waits for its lease keeper to open the store before it
# renews from its own heartbeat thread instead.
_KEEPER_START = 30.0


@dataclass(frozen=True)
class WorkflowDef:
    """A registered workflow."""

    name: str
    version: str
    fn: Callable[..., Any]
    is_async: bool
    params: dict[str, Any]
    returns: Any


class Registry(Protocol):
    """What the worker needs from the app."""

    name: str
    max_failures: int

    def workflow_def(self, name: str) -> WorkflowDef | None: ...

    def workflow_versions(self) -> list[tuple[str, str]]: ...

    def workflow_ref(self, workflow: Any) -> tuple[str, str, Any]: ...


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


class Execution:
    """One claimed run being executed: the runtime its Context talks to."""

    def __init__(self, worker: Worker, claimed: port.Claimed) -> None:
        self._worker = worker
        self._claim = claimed.claim
        self.claimed = claimed
        self.lost: errors.LeaseLost | None = None
        self.context: context.Context | None = None
        self._lock = threading.Lock()

    @property
    def claim(self) -> port.Claim:
        with self._lock:
            return self._claim

    def renewed(self, claim: port.Claim) -> None:
        with self._lock:
            self._claim = replace(claim, canceling=self._claim.canceling)

    def check(self) -> None:
        lost = self.lost
        if lost is not None:
            if isinstance(lost, errors.Canceled) and self.claim.canceling:
                self.lost = None
                return
            raise lost
        if self._worker.stopping:
            raise context.Halt("release", {"code": "worker_stopping", "message": "worker stopping"})

    def acknowledge_cancel(self) -> None:
        with self._lock:
            self._claim = replace(self._claim, canceling=True)

    def workflow_ref(self, workflow: Any) -> tuple[str, str, Any]:
        return self._worker.registry.workflow_ref(workflow)

    def pause(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            self._worker._stop_event.wait(min(left, 0.05))
            self.check()
        self.check()


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
    ) -> None:
        validate_timing(lease_ttl, heartbeat)
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
        self.concurrency = concurrency
        self.lease_ttl = lease_ttl
        self.heartbeat = heartbeat
        self.poll_interval = poll_interval
        self.sweep_interval = sweep_interval
        self.grace = grace
        # The keeper reopens the store by URL; a store handed over as an object
        # (a wrapper, an injected clock) can only be renewed from here.
        self.liveness: Literal["process", "thread"] = (
            "process" if liveness == "process" and store_url else "thread"
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
        self._active: dict[str, Execution] = {}
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
        self._started = False

    # -- lifecycle ------------------------------------------------------------

    @property
    def stopping(self) -> bool:
        return self._stop_event.is_set()

    def start(self) -> Worker:
        """Start serving in background threads; return self."""
        if self._started:
            return self
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
        self._halt.set()
        if len(self._threads) > 2:
            self._threads[2].join(self.heartbeat + 1)
        if self._keeper is not None:
            self._keeper.close()
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
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
            claim = execution.claim
            ctx = execution.context
            effect = ctx.unsettled_effect if ctx is not None else None
            if effect is not None:
                log.warning(
                    "worker %s: run %s left in flight during the once step %s: its outcome is "
                    "unknown, so the run will need attention (effect_outcome_unknown)",
                    self.worker_id,
                    claim.run_id,
                    effect,
                )
            else:
                log.warning(
                    "worker %s: run %s left in flight; its current step did not record an "
                    "outcome and will run again",
                    self.worker_id,
                    claim.run_id,
                )
            if execution.lost is None:
                # Hand it over now rather than after the lease lapses.
                with contextlib.suppress(Exception):
                    self.store.release(claim, delay=0, failed=False)
        return [execution.claim.run_id for execution in left]

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
        last_sweep = 0.0
        while not self._stop_event.is_set():
            try:
                self._watch_clock()
            except Exception as exc:
                # The claim below meets the same outage and says so; until a
                # reading succeeds, claims are bounded by the last one.
                log.debug("worker %s: cannot read the store's clock: %s", self.worker_id, exc)
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
                    recover_until=self._clock_watch.recover_until(time.monotonic()),
                )
            except Exception as exc:
                log.warning("worker %s: claim failed: %s", self.worker_id, exc)
                self._stop_event.wait(self.poll_interval)
                continue
            for item in claimed:
                self._dispatch(item)
            if not claimed:
                self.store.wait_ready(self._idle_timeout())

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

    def _dispatch(self, claimed: port.Claimed) -> None:
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

    def _forget(self, execution: Execution) -> None:
        claim = execution.claim
        with self._active_lock:
            if self._active.get(claim.run_id) is execution:
                del self._active[claim.run_id]
        if self._keeper is not None:
            self._keeper.drop(claim.run_id, claim.generation)
        self._slot_freed.set()

    def _lost(self, run_id: str, generation: int, lost: errors.LeaseLost) -> None:
        """Take the keeper's word that a renewal was refused."""
        with self._active_lock:
            execution = self._active.get(run_id)
        if execution is not None and execution.claim.generation == generation:
            log.info("run %s: lease renewal refused (%s)", run_id, lost.code)
            execution.lost = lost

    def _heartbeat_loop(self) -> None:
        warned = False
        while not self._halt.wait(self.heartbeat):
            kept = self._keeper
            if kept is not None and kept.ready.is_set() and kept.alive:
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
                execution.renewed(self.store.renew(execution.claim, lease_ttl=self.lease_ttl))
            except errors.LeaseLost as lost:
                log.info("run %s: lease renewal refused (%s)", execution.claim.run_id, lost.code)
                execution.lost = lost
            except Exception as exc:
                log.warning("run %s: lease renewal failed: %s", execution.claim.run_id, exc)

    # -- executing ------------------------------------------------------------

    def _execute(self, execution: Execution) -> None:
        try:
            _Drive(self, execution).run()
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


def _error(code: str, message: str, **extra: Any) -> str:
    return codec.encode({"code": code, "message": message, **extra})


class _Drive:
    """Execute one claimed run to its next resting point (parked, ended or released)."""

    def __init__(self, worker: Worker, execution: Execution) -> None:
        self.worker = worker
        self.store = worker.store
        self.ex = execution
        self.run_ = execution.claimed.run
        self.ctx: context.Context | None = None

    def run(self) -> None:
        run = self.run_
        log.info(
            "run %s claimed by %s (generation %d%s)",
            run.run_id,
            self.ex.claim.worker,
            self.ex.claim.generation,
            ", recovered" if self.ex.claimed.recovered else "",
        )
        try:
            validation.run(run, max_failures=self.worker.registry.max_failures)
            validation.journal(run.run_id, self.ex.claimed.journal)
            validation.outcomes(run.run_id, self.ex.claimed.outcomes, self.ex.claimed.journal)
        except errors.CorruptState as exc:
            log.error("run %s: %s", run.run_id, exc)
            self._finish(
                "needs_attention", error=_error(exc.code, str(exc), invariant=exc.invariant)
            )
            return
        if run.cancel_requested:
            self.ex.acknowledge_cancel()
            self._settle_cancel()
            return
        if run.failures >= self.worker.registry.max_failures:
            self._finish(
                "needs_attention",
                error=_error(
                    "poison_run", f"{run.failures} consecutive attempts failed; not retrying"
                ),
            )
            return
        wf = self.worker.registry.workflow_def(run.workflow)
        if wf is None or wf.version != run.version:
            self._finish(
                "needs_attention",
                error=_error(
                    "workflow_not_found", f"this worker has no {run.workflow} version {run.version}"
                ),
            )
            return
        try:
            self.ctx = context.Context(
                run=run,
                store=self.store,
                runtime=self.ex,
                journal=self.ex.claimed.journal,
                outcomes=self.ex.claimed.outcomes,
            )
            self.ex.context = self.ctx
            args, kwargs = self._inputs(wf)
        except errors.CorruptState as exc:
            self._finish(
                "needs_attention", error=_error(exc.code, str(exc), invariant=exc.invariant)
            )
            return
        except errors.InvalidPayload as exc:
            # Well-formed input that this version's type hints do not accept.
            self._finish("failed", error=_error(exc.code, f"the run's input: {exc}"))
            return
        self._loop(wf, self.ctx, args, kwargs)

    def _inputs(self, wf: WorkflowDef) -> tuple[list[Any], dict[str, Any]]:
        try:
            data = codec.decode(self.run_.input)
        except errors.InvalidPayload as exc:
            raise errors.CorruptState(self.run_.run_id, "run_input_json", str(exc)) from exc
        if not isinstance(data, dict) or not isinstance(data.get("args"), list):
            raise errors.CorruptState(
                self.run_.run_id, "run_input_shape", "expected {args, kwargs}"
            )
        names = list(wf.params)
        args = [
            codec.convert(v, wf.params[names[i]]) if i < len(names) else v
            for i, v in enumerate(data["args"])
        ]
        kwargs = {k: codec.convert(v, wf.params.get(k)) for k, v in data.get("kwargs", {}).items()}
        return args, kwargs

    def _loop(
        self, wf: WorkflowDef, ctx: context.Context, args: list[Any], kwargs: dict[str, Any]
    ) -> None:
        while True:
            try:
                result = self.worker.invoke(wf, ctx, args, kwargs)
            except context.Parked as parked:
                entries, marks = ctx.take_pending()
                try:
                    done = self.store.park(
                        self.ex.claim, entries, parked.waits, wake_at=parked.wake_at, marks=marks
                    )
                except errors.Canceled:
                    ctx.restore(entries, marks)
                    self.ex.acknowledge_cancel()
                    self._settle_cancel()
                    return
                except errors.LeaseLost:
                    raise
                except Exception as exc:
                    # The park did not happen: give the run back (with backoff)
                    # rather than leave it running until its lease lapses.
                    self._release(failed=True, why=f"could not park: {exc}")
                    return
                ctx.written(entries)
                if done:
                    log.info(
                        "run %s parked (%s)",
                        self.run_.run_id,
                        ", ".join(w.name for w in parked.waits) or f"until {parked.wake_at}",
                    )
                    deadlines = [w.deadline for w in parked.waits if w.deadline] + (
                        [parked.wake_at] if parked.wake_at else []
                    )
                    self.worker._note_wake(min(deadlines) if deadlines else None)
                    return
                ctx.restart()
                continue
            except BaseException as exc:  # every exit is settled below
                self._settle(exc)
                return
            try:
                text = codec.encode(result)
            except errors.InvalidPayload as exc:
                self._finish("failed", error=_error(exc.code, str(exc)))
                return
            self._finish("succeeded", result=text)
            return

    def _settle(self, exc: BaseException) -> None:
        if isinstance(exc, errors.StaleClaim):
            raise exc
        if isinstance(exc, errors.Canceled):
            self.ex.acknowledge_cancel()
            self._settle_cancel()
        elif isinstance(exc, context.Halt):
            if exc.reason == "needs_attention":
                self._finish("needs_attention", error=codec.encode(exc.error))
            elif exc.reason == "release":
                self._release(failed=False, why="worker stopping")
            else:
                self._release(failed=True, why=exc.error.get("message", ""))
        elif isinstance(exc, errors.CorruptState):
            self._finish("needs_attention", error=_error(exc.code, str(exc)))
        elif isinstance(exc, errors.StepFailed):
            self._finish("failed", error=_error(exc.code, str(exc), step=exc.step))
        elif isinstance(exc, errors.WaitTimedOut | errors.ChildFailed | errors.InvalidPayload):
            self._finish("failed", error=_error(exc.code, str(exc)))
        elif isinstance(exc, Exception):
            self._finish(
                "failed",
                error=_error(
                    "workflow_failed", f"{type(exc).__name__}: {exc}", type=type(exc).__name__
                ),
            )
        else:
            raise exc

    def _settle_cancel(self) -> None:
        unsettled = self.ctx.unsettled_effect if self.ctx is not None else None
        if unsettled is None:
            journal = (
                self.ctx._cursor.entries() if self.ctx is not None else self.ex.claimed.journal
            )
            unsettled = next((e.name for e in journal if context.unsettled(e)), None)
        if unsettled is not None:
            self._finish(
                "needs_attention",
                error=_error(
                    "effect_outcome_unknown",
                    f"the run was canceled while the effect of step {unsettled} was unsettled",
                    step=unsettled,
                ),
            )
        else:
            # As when the store cancels a queued or waiting run: no error.
            self._finish("canceled")

    def _pending(self) -> tuple[list[port.JournalEntry], list[port.Mark]]:
        return self.ctx.take_pending() if self.ctx is not None else ([], [])

    def _finish(
        self, state: port.RunState, *, result: str | None = None, error: str | None = None
    ) -> None:
        entries, marks = self._pending()
        try:
            self.store.finish(
                self.ex.claim, entries, state=state, result=result, error=error, marks=marks
            )
        except errors.Canceled:
            if state in ("canceled", "needs_attention"):
                raise
            if self.ctx is not None:
                self.ctx.restore(entries, marks)
            self.ex.acknowledge_cancel()
            self._settle_cancel()
            return
        except errors.StaleClaim:
            raise
        except Exception as exc:
            log.warning("run %s: could not record %s: %s", self.run_.run_id, state, exc)
            return
        detail = f": {codec.decode(error).get('message')}" if error else ""
        log.info("run %s %s%s", self.run_.run_id, state, detail)

    def _release(self, *, failed: bool, why: str) -> None:
        failures = self.run_.failures + (1 if failed else 0)
        if failed and failures >= self.worker.registry.max_failures:
            self._finish(
                "needs_attention",
                error=_error("poison_run", f"{failures} consecutive attempts failed; last: {why}"),
            )
            return
        delay = effects.release_backoff(failures) if failed else 0.0
        try:
            self.store.release(self.ex.claim, delay=delay, failed=failed)
        except errors.LeaseLost:
            raise
        except Exception as exc:
            log.warning("run %s: release failed (%s); its lease will lapse", self.run_.run_id, exc)
            return
        log.info("run %s released%s", self.run_.run_id, f" after failure: {why}" if failed else "")
