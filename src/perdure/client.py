"""The calls from outside a run: start, get, runs, signal, send, waits, resume, cancel, resolve.

Nothing here needs the workflows' code, so any process on any host that
reaches the store can use a :class:`Client`. Each sync call has an async twin
(``start``/``astart``) derived from it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from perdure import (
    codec,
    endings,
    errors,
    handles,
    journal,
    lineage,
    liveclient,
    placement,
    planclient,
    records,
    repairs,
    signals,
    starts,
    telemetry,
    validation,
)
from perdure import payloads as _payloads
from perdure.store import controlport, planport, port
from perdure.twins import athread, blocking_twin

# result() reads the run again after these pauses (growing 1.3x between them),
# unless a worker of this process reports the run's end first (see endings).
POLL_FIRST = 0.001
POLL_MAX = 0.02
# The longest wait without a read while a worker of this process has the run
# (it wakes the caller when it ends or lets the run go).
HELD_PAUSE = 0.25


# Defined with the run's handle; named here, where callers find them.
RunHandle = handles.RunHandle
run_info = handles.run_info
decode_column = handles.decode_column


class Client(liveclient.LiveCalls, planclient.PlanCalls, repairs.Repairs):
    """Start, inspect and steer an app's runs through its store.

    The calls that talk to live runs (updates, events, streams) are
    :class:`~perdure.liveclient.LiveCalls`'s; resolve and fork are
    :class:`~perdure.repairs.Repairs`'s.
    """

    def __init__(
        self,
        store: port.Store,
        app: str,
        telemetry: telemetry.Telemetry = telemetry.NONE,
        *,
        payload_limit: int | None = None,
        payloads: _payloads.Payloads | None = None,
    ) -> None:
        if payloads is None:
            # No codec: sealed payloads are read as they are stored, not refused.
            payloads = _payloads.Payloads(
                codec.DEFAULT_PAYLOAD_LIMIT if payload_limit is None else payload_limit,
                strict=False,
            )
        elif payload_limit is not None:
            raise errors.InvalidInput("give payload_limit or payloads, not both")
        self.store = store
        self.app = app
        # Runs started here carry the caller's trace context, for their spans.
        self.telemetry = telemetry
        # The app's payload layer: it seals what is sent and opens what is read.
        self.payloads = payloads
        self.payload_limit = payloads.limit

    # -- runs -----------------------------------------------------------------

    def start(
        self,
        workflow: str,
        version: str,
        args: list[Any] | tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        *,
        key: str | None = None,
        hint: Any = None,
        deadline: timedelta | datetime | None = None,
        queue: str | None = None,
        queue_key: str | None = None,
        priority: int | None = None,
        dry_run: bool = False,
        plan: planport.PlanSpec | None = None,
    ) -> handles.RunHandle[Any]:
        """Create a run (or return the run already created under ``key``).

        A key names one start: the same workflow with the same inputs. Its
        version may differ, so a start repeated across a deploy stays idempotent.
        ``deadline`` (a duration from now by the store's clock, or an aware
        instant) cancels the run with ``deadline_exceeded`` if it has not
        ended by then.
        ``queue`` places the run in one of the app's declared queues, claimed
        under its limits; ``queue_key`` is what its per-key limit counts, and
        ``priority`` orders the queue's runs (lower first; default 0).
        A ``dry_run`` is claimed only by dry-run workers (``app.worker(dry_run=True)``)
        and is never placed in a queue.

        Raises:
            errors.KeyConflict: ``key`` names a run of another workflow or with
                other inputs.
            errors.InvalidInput: the deadline is not a positive duration or an aware instant.
            errors.InvalidQueue: a queue key or priority without a queue, or a
                priority that is not a 32-bit integer.
            errors.UnknownQueue: the store holds no such queue for the app.
        """
        if key is not None:
            codec.check_text("a run key", key)
        until = placement.deadline(self.store, deadline)
        placed = placement.in_queue(self.store, self.app, queue, queue_key, priority)
        if plan is not None and (until is not None or placed or dry_run):
            raise errors.InvalidInput(
                "a plan run takes no deadline, queue or dry run: its tasks are claimed "
                "one by one, outside the limits made for whole runs"
            )
        if dry_run and placed:
            raise errors.InvalidQueue(
                "a dry run is not placed in a queue: only dry-run workers claim it, "
                "outside every queue's limits"
            )
        text = self.payloads.seal(
            {"args": list(args), "kwargs": kwargs or {}}, "the run's input", envelope=2
        )
        text = telemetry.with_trace(text, self.telemetry.trace_context())
        new = port.NewRun(
            run_id=uuid.uuid4().hex,
            app=self.app,
            workflow=workflow,
            version=version,
            input=text,
            key=key,
            deadline=until,
            **placed,
            dry_run=bool(dry_run),
            plan=plan,
        )
        # A worker of this process with a slot free takes the run as it is created.
        made = starts.of(self.store).create(self.store, new)
        run, created = made if made is not None else self.store.create_run(new)
        # A key that follows a chain names the start of its first run.
        if not created and not port.same_start(
            lineage.first(self.store, run), new, self.payloads.open_text
        ):
            raise errors.KeyConflict(str(key), run, workflow, new.dry_run)
        return handles.RunHandle[Any](self, run.run_id, hint, created=created)

    def handle(self, run_id: str, hint: Any = None) -> handles.RunHandle[Any]:
        return handles.RunHandle[Any](self, run_id, hint)

    def record(self, run_id: str) -> port.Run:
        """Return the app's stored run ``run_id``.

        Raises:
            errors.RunNotFound: no such run in this app.
        """
        return self._run(run_id)

    def _run(self, run_id: str) -> port.Run:
        codec.check_text("a run id", run_id)
        run = self.store.get_run(run_id)
        if run is None or run.app != self.app:
            raise errors.RunNotFound(run_id)
        if (
            run.deadline is not None
            and not run.cancel_requested
            and run.state not in port.TERMINAL_STATES
            and run.deadline <= self.store.now()
        ):
            # Enforced even with no worker running: whoever reads it settles it.
            controlport.require(self.store).expire_deadlines(run_id=run_id)
            run = self.store.get_run(run_id) or run
        return run

    def get(self, run_id: str, *, follow: bool = True) -> records.RunInfo:
        """Return the run's current information.

        A run that continued as new is answered by its chain's current run
        (``follow=False``: by itself); ``chain`` lists the chain's run ids.
        """
        run = self._run(run_id)
        if follow:
            run = lineage.current(self.store, run)
        return replace(
            handles.run_info(run, self.payloads.open), chain=lineage.chain_ids(self.store, run)
        )

    def _current(self, run_id: str) -> port.Run:
        """Return the run, or the current run of its chain if it continued as new."""
        return lineage.current(self.store, self._run(run_id))

    def _current_info(self, run_id: str) -> records.RunInfo:
        """Return the information of the run's chain's current run (no chain listing)."""
        return handles.run_info(self._current(run_id), self.payloads.open)

    def runs(
        self,
        state: str | None = None,
        workflow: str | None = None,
        limit: int = 100,
        dry_run: bool | None = None,
    ) -> list[records.RunInfo]:
        """Return the app's runs, newest first; ``dry_run`` keeps only dry (or real) ones."""
        if state is not None and state not in port.RUN_STATES:
            raise errors.InvalidInput(
                f"unknown state {state!r}; one of {', '.join(port.RUN_STATES)}"
            )
        if limit < 1:
            raise errors.InvalidInput(f"limit must be at least 1, got {limit}")
        found = self.store.list_runs(
            self.app, state=state, workflow=workflow, limit=limit, dry_run=dry_run
        )
        return [handles.run_info(r, self.payloads.open) for r in found]

    def result(self, run_id: str, timeout: float | None = None, hint: Any = None) -> Any:
        """Wait for the run to end; return its result or raise RunFailed."""
        waiting = _ResultWait(endings.of(self.store), run_id, timeout)
        # Registered before the first read, so that an end reported by a
        # worker of this process in between is not missed.
        with waiting.hub.watch(run_id) as watch:
            state = waiting.unread()
            while True:
                watch.reported = False
                if watch.ended is not None:
                    return self._handed(run_id, watch.ended, hint)
                if state is None:
                    info = self._current_info(run_id)
                    if info.done:
                        return _ended(run_id, info, hint)
                    state = info.state
                while True:
                    left, held = waiting.next_pause(state)
                    woken = watch.wait(left)
                    watch.clear()
                    if waiting.read_again(watch, held, woken):
                        state = None
                        break

    async def aresult(self, run_id: str, timeout: float | None = None, hint: Any = None) -> Any:
        """Async form of ``result``: reads with ``aget``, waits on the event loop."""
        waiting = _ResultWait(endings.of(self.store), run_id, timeout)
        with waiting.hub.watch(run_id, asyncio.get_running_loop()) as watch:
            state = waiting.unread()
            while True:
                watch.reported = False
                if watch.ended is not None:
                    return self._handed(run_id, watch.ended, hint)
                if state is None:
                    info = await self._acurrent_info(run_id)
                    if info.done:
                        return _ended(run_id, info, hint)
                    state = info.state
                while True:
                    left, held = waiting.next_pause(state)
                    woken = await watch.await_set(left)
                    watch.clear()
                    if waiting.read_again(watch, held, woken):
                        state = None
                        break

    def _handed(self, run_id: str, ended: endings.Ended, hint: Any) -> Any:
        """The result a worker here committed, handed over: no read back."""
        value = handles.decode_column(run_id, "result", ended.result)
        return codec.convert(self.payloads.open(value), hint)

    def children(self, run_id: str) -> dict[str, int]:
        """Return how many child runs of the run are in each state."""
        self._run(run_id)
        return self.store.child_counts(run_id)

    def history(self, run_id: str) -> list[records.Provenance]:
        """Return the run's provenance ledger, oldest first."""
        # The ledger and the run's sequence are read separately; a receipt
        # appended in between is not corruption, so read again until they agree.
        for _ in range(10):
            entries = self.store.history(run_id)
            run = self._run(run_id)
            last = entries[-1].sequence if entries else 0
            if run.ledger_sequence <= last:
                break
        validation.ledger(run, entries)
        return [
            records.Provenance(
                e.sequence, e.kind, e.at, e.generation, e.worker, e.step, e.digest, e.note
            )
            for e in entries
        ]

    def attempts(self, run_id: str) -> list[records.StepAttempt]:
        """Return the failed attempts of the run's steps, in journal order.

        Raises:
            errors.CorruptState: an entry's body is not of a shape this code writes.
        """
        self._run(run_id)
        found: list[records.StepAttempt] = []
        for entry in self.store.journal(run_id):
            try:
                failed = journal.failed_attempts(entry)
            except ValueError as exc:
                raise errors.CorruptState(
                    run_id, "journal_attempts_shape", f"position {entry.position}: {exc}"
                ) from exc
            found += [
                records.StepAttempt(
                    entry.name,
                    entry.position,
                    a.attempt,
                    a.code,
                    a.type,
                    a.message,
                    a.traceback,
                    a.duration,
                )
                for a in failed
            ]
        return found

    # -- waits and messages ---------------------------------------------------

    def signal(
        self, run_id: str, name: str, payload: Any = None, signal_id: str | None = None
    ) -> records.Receipt:
        """Settle the earliest open wait on ``name``, or the one wait ``name#k``.

        A signal that arrives before the run waits is kept for its wait. A
        run that continued as new is signaled through its chain's current
        run. Returns the receipt of the wait it settled (its ``run_id``
        names the run that took it).

        Raises:
            errors.WaitSettled: the one wait named was settled by another signal, a timeout
                or a cancel (carries that receipt).
            errors.WaitExpired: the wait it would settle was past its deadline; it is now
                settled as timed out.
            errors.RunNotFound: no run has this id.
            errors.RunFinished: the run ended without settling a wait on this name.
        """
        signals.target(name)  # a bad name is refused before anything is read
        run = self._current(run_id)
        while True:
            if run.state in port.TERMINAL_STATES:
                return signals.ended_answer(self.store, run, name, signal_id)
            try:
                return signals.deliver(self.store, run, name, payload, signal_id, self.payloads)
            except errors.RunFinished:
                # The run ended after it was read: its journal answers, as above,
                # unless it continued as new: then its successor takes the signal.
                run = self._current(run.run_id)

    def send(self, run_id: str, channel: str, key: str, payload: Any = None) -> bool:
        """Store a channel message; False when ``key`` was already sent (first payload wins).

        A run that continued as new takes it through its chain's current run.
        """
        codec.check_text("a channel name", channel)
        codec.check_text("a message key", key)
        text = self.payloads.seal(payload, "the message")
        run = self._current(run_id)
        while True:
            if run.state in port.TERMINAL_STATES:
                raise errors.RunFinished(run.run_id, run.state)
            try:
                return self.store.send(port.NewMessage(run.run_id, channel, key, text))
            except errors.RunFinished:
                # Ended after it was read: a run that continued as new hands over.
                after = self._current(run.run_id)
                if after.run_id == run.run_id:
                    raise
                run = after

    def _settle_expired(self, waits: list[port.WaitRecord]) -> list[port.WaitRecord]:
        """Settle expired signal waits as timed out (and wake runs past a receive's
        deadline); return the waits still open."""
        now = self.store.now()
        still_open = []
        for wait in waits:
            if wait.deadline is None or wait.deadline > now:
                still_open.append(wait)
            elif wait.kind == "signal":
                timeout = port.Outcome(wait.run_id, wait.name, "timed_out", None, None, None, now)
                with contextlib.suppress(errors.RunNotFound, errors.RunFinished):
                    self.store.settle_wait(wait.run_id, wait.name, timeout)
            else:
                # A receive's timeout is decided by its owner, which compares the
                # journaled deadline with the messages it finds.
                self.store.wake(wait.run_id)
        return still_open

    def waits(self, run_id: str | None = None) -> list[records.Wait]:
        """Return open waits, settling expired ones as timed out on the way."""
        if run_id is not None:
            self._run(run_id)
        else:
            controlport.require(self.store).expire_deadlines(app=self.app)
        found = self._settle_expired(self.store.waits(self.app, run_id))
        return [
            records.Wait(f"{w.run_id}/{w.name}", w.run_id, w.name, w.deadline, w.kind)
            for w in found
        ]

    def resume(self, run_id: str) -> bool:
        """Resume a suspended run, or re-queue a waiting run whose waits all have outcomes.

        A suspended run returns to where it was: queued, or waiting (and then
        re-queued at once if a wait is met or a deadline passed meanwhile). A
        suspend its owner has not taken yet is withdrawn. Returns True when
        the run was resumed or re-queued.

        Raises:
            errors.WaitStillOpen: a waiting run has a wait with no outcome (or sleeps until later).
            errors.RunFinished: the run has ended.
        """
        run = self._run(run_id)
        if run.state in port.TERMINAL_STATES:
            raise errors.RunFinished(run_id, run.state)
        if run.state == "suspended" or run.suspend_requested:
            try:
                return controlport.require(self.store).unsuspend(run_id) is not None
            except errors.RunFinished:
                raise errors.RunFinished(run_id, self._run(run_id).state) from None
        if run.state != "waiting":
            return False
        still_open = self._settle_expired(self.store.waits(self.app, run_id))
        if still_open:
            names = ", ".join(f"{w.run_id}/{w.name}" for w in still_open)
            raise errors.WaitStillOpen(f"run {run_id} still waits on {names}")
        fresh = self._run(run_id)
        registered = self.store.outcomes(run_id)
        if (
            fresh.state == "waiting"
            and not registered
            and fresh.ready_at is not None
            and fresh.ready_at > self.store.now()
        ):
            raise errors.WaitStillOpen(f"run {run_id} sleeps until {fresh.ready_at.isoformat()}")
        return self.store.wake(run_id) or fresh.state == "queued"

    def suspend(self, run_id: str) -> bool:
        """Suspend the run: it is not claimed until :meth:`resume`.

        A queued or waiting run is suspended at once; a running one at its
        next journal write (its current step's outcome is still recorded).
        Its deadlines are kept and fire after the resume; signals, messages
        and updates sent meanwhile are stored and applied after it. Returns
        True if the request took effect, False if the run was already
        suspended or asked to be (a repeat changes nothing).

        Raises:
            errors.RunNotFound: no such run.
            errors.RunFinished: the run has ended, or needs attention.
        """
        run = self._run(run_id)
        if run.state in port.TERMINAL_STATES:
            raise errors.RunFinished(run_id, run.state)
        return controlport.require(self.store).suspend(run_id) != "already"

    # -- operators ------------------------------------------------------------
    # resolve and fork, the repairs of runs, are Repairs's (repairs.py).

    def cancel(self, run_id: str) -> bool:
        """Cancel the run and its descendants; True if the request took effect.

        A run that continued as new is canceled through its chain's current run.
        """
        self._run(run_id)
        return self.store.request_cancel(run_id)

    # -- overview ---------------------------------------------------------------

    def timers(self, run_id: str | None = None) -> list[records.Wait]:
        """Return the app's runs that only time will wake: sleeps and timers, earliest first.

        A ``sleep`` (a run in ``ctx.sleep``) is named ``sleep``; a ``timer``
        (a queued run held back by a retry's backoff or a release's delay) is
        named ``retry``. Their ``deadline`` is the instant they become
        claimable; a sleep stays listed once due, until a worker claims it.
        Unlike :meth:`waits`, nothing here can be signaled, and nothing is written.
        """
        if run_id is not None:
            self._run(run_id)
        return [
            records.Wait(
                f"{t.run_id}/{'sleep' if t.kind == 'sleep' else 'retry'}",
                t.run_id,
                "sleep" if t.kind == "sleep" else "retry",
                t.due,
                t.kind,
            )
            for t in self.store.timers(self.app, run_id)
        ]

    aget = athread(get)
    _acurrent_info = athread(_current_info)
    aattempts = athread(attempts)
    afork = athread(repairs.Repairs.fork)
    aruns = athread(runs)
    achildren = athread(children)
    ahistory = athread(history)
    asignal = athread(signal)
    asend = athread(send)
    awaits = athread(waits)
    aresume = athread(resume)
    asuspend = athread(suspend)
    acancel = athread(cancel)
    aresolve = athread(repairs.Repairs.resolve)
    # These wait for announcements on a listener thread.
    aupdate = blocking_twin(liveclient.LiveCalls.update)
    aevents = blocking_twin(liveclient.LiveCalls.events)
    aget_event = blocking_twin(liveclient.LiveCalls.get_event)
    atimers = athread(timers)


def _ended(run_id: str, info: records.RunInfo, hint: Any) -> Any:
    """The result of a run that has ended, or RunFailed."""
    if info.state == "succeeded":
        return codec.convert(info.result, hint)
    raise errors.RunFailed(run_id, info.state, info.error)


class _ResultWait:
    """The pauses of one result() call between its reads (its sync and async forms share them).

    While a worker of this process has the run, the call waits for that
    worker's word (reading only every ``HELD_PAUSE``, in case the run was
    taken over elsewhere); otherwise it polls, backing off from
    ``POLL_FIRST`` to ``POLL_MAX``.
    """

    def __init__(self, hub: endings.Endings, run_id: str, timeout: float | None) -> None:
        self.hub = hub
        self.run_id = run_id
        self.timeout = timeout
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.pause = POLL_FIRST

    def unread(self) -> str | None:
        """The state a call may take without reading: a run a worker here holds is running.

        That worker's word (its end, or letting the run go) wakes the call
        even if it came between the watch and this look; None: read first.
        """
        return "running" if self.hub.held(self.run_id) else None

    def next_pause(self, state: str) -> tuple[float, bool]:
        """How long to wait now, and whether a worker here holds the run.

        Raises:
            errors.ResultTimeout: the call's timeout has passed.
        """
        now = time.monotonic()
        if self.deadline is not None and now >= self.deadline:
            raise errors.ResultTimeout(f"run {self.run_id} is still {state} after {self.timeout}s")
        held = self.hub.held(self.run_id)
        wait = HELD_PAUSE if held else self.pause
        if not held:
            self.pause = min(self.pause * 1.3, POLL_MAX)
        left = wait if self.deadline is None else min(wait, max(0.0, self.deadline - now))
        return left, held

    def read_again(self, watch: endings.Watch, held: bool, woken: bool) -> bool:
        """Whether the wait that just ended calls for a read of the run."""
        if watch.reported or not self.hub.held(self.run_id):
            return True
        return held and not woken  # a quarter second without word: read, in case
