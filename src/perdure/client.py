"""The calls from outside a run: start, get, runs, signal, send, waits, resume, cancel, resolve.

Nothing here needs the workflows' code, so any process on any host that
reaches the store can use a :class:`Client`. Each sync call has an async twin
(``start``/``astart``) derived from it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import getpass
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any, Generic, ParamSpec, TypeVar

from perdure import (
    codec,
    endings,
    errors,
    journal,
    lineage,
    liveclient,
    planclient,
    records,
    signals,
    telemetry,
    validation,
)
from perdure import payloads as _payloads
from perdure.store import controlport, planport, port, queueport

P = ParamSpec("P")
R = TypeVar("R")

_MISSING: Any = object()

# result() reads the run again after these pauses (growing 1.3x between them),
# unless a worker of this process reports the run's end first (see endings).
POLL_FIRST = 0.001
POLL_MAX = 0.02


def athread(fn: Callable[P, R]) -> Callable[P, Awaitable[R]]:
    """Derive the async twin of a call on a store: the same call, without blocking the loop.

    The first argument is the object the call is a method of (a Client or an
    App), whose ``store`` decides how: a store that runs calls on the event
    loop (``call_async``: PostgreSQL, on psycopg's async connections) runs it
    there; any other runs it on a thread.
    """

    @functools.wraps(fn)
    async def twin(*args: P.args, **kwargs: P.kwargs) -> R:
        store = getattr(args[0], "store", None) if args else None
        native: Callable[..., Awaitable[R]] | None = getattr(store, "call_async", None)
        if native is not None:
            return await native(fn, *args, **kwargs)
        return await asyncio.to_thread(fn, *args, **kwargs)

    twin.__doc__ = f"Async form of ``{fn.__name__}``."
    return twin


def blocking_twin(fn: Callable[P, R]) -> Callable[P, Awaitable[R]]:
    """Derive the async twin of a call that waits on other threads: it runs on a thread."""

    @functools.wraps(fn)
    async def twin(*args: P.args, **kwargs: P.kwargs) -> R:
        return await asyncio.to_thread(fn, *args, **kwargs)

    twin.__doc__ = f"Async form of ``{fn.__name__}``."
    return twin


def decode_column(run_id: str, column: str, text: str | None) -> Any:
    if text is None:
        return None
    try:
        return codec.decode(text)
    except errors.InvalidPayload as exc:
        raise errors.CorruptState(run_id, f"run_{column}_json", str(exc)) from exc


def _opened_result(run: port.Run, opener: Callable[[Any], Any]) -> Any:
    """A run's result, opened; a plan run's is its tasks' outputs, each sealed on its own."""
    value = decode_column(run.run_id, "result", run.result)
    if run.plan_digest is not None and isinstance(value, dict):
        return {name: opener(output) for name, output in value.items()}
    return opener(value)


def run_info(run: port.Run, opener: Callable[[Any], Any] | None = None) -> records.RunInfo:
    """Convert a stored run to what clients see, refusing unreadable columns.

    The result is opened by ``opener`` (the app's payload layer's ``open``,
    or its ``reveal`` for display); without one, a sealed result is given as
    it is stored.
    """
    error = decode_column(run.run_id, "error", run.error)
    if error is not None and not isinstance(error, dict):
        raise errors.CorruptState(run.run_id, "run_error_shape", "error is not an object")
    return records.RunInfo(
        run_id=run.run_id,
        workflow=run.workflow,
        version=run.version,
        state=run.state,
        result=_opened_result(run, opener or _as_stored),
        error=error,
        attempt=run.generation,
        failures=run.failures,
        created_at=run.created_at,
        updated_at=run.updated_at,
        key=run.key,
        parent_id=run.parent_id,
        cancel_requested=run.cancel_requested,
        deadline=run.deadline,
        suspend_requested=run.suspend_requested,
        continued_as=run.continued_as,
        queue=run.queue,
        queue_key=run.queue_key,
        priority=run.priority,
        dry_run=run.dry_run,
    )


def _child_id(entry: port.JournalEntry) -> str | None:
    """Return the run id a ``child`` entry recorded, or None if its body is unreadable."""
    try:
        return journal.ChildStarted.decode(entry.output).run_id
    except journal.Unreadable:
        return None


def _as_stored(value: Any) -> Any:
    return value


class RunHandle(Generic[R]):
    """A started run whose result is an ``R``."""

    def __init__(
        self, client: Client, run_id: str, hint: Any = None, *, created: bool = True
    ) -> None:
        self._client = client
        self.run_id = run_id
        self._hint = hint
        self.created = created
        """False when ``start`` found the run already created under its key."""

    def __repr__(self) -> str:
        return f"RunHandle({self.run_id!r})"

    def status(self) -> str:
        """Return the run's current state."""
        return self._client.get(self.run_id).state

    def info(self) -> records.RunInfo:
        return self._client.get(self.run_id)

    def result(self, timeout: float | None = None) -> R:
        """Wait for the run to end and return its result.

        Raises:
            errors.RunFailed: the run ended failed, canceled or needs_attention.
            errors.ResultTimeout: it did not end within ``timeout`` seconds.
        """
        result: R = self._client.result(self.run_id, timeout=timeout, hint=self._hint)
        return result

    async def aresult(self, timeout: float | None = None) -> R:
        """Async form of ``result``."""
        result: R = await self._client.aresult(self.run_id, timeout=timeout, hint=self._hint)
        return result


class Client(liveclient.LiveCalls, planclient.PlanCalls):
    """Start, inspect and steer an app's runs through its store.

    The calls that talk to live runs (updates, events, streams) are
    :class:`~perdure.liveclient.LiveCalls`'s.
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
    ) -> RunHandle[Any]:
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
        until = self._deadline(deadline)
        placement = self._placement(queue, queue_key, priority)
        if plan is not None and (until is not None or placement or dry_run):
            raise errors.InvalidInput(
                "a plan run takes no deadline, queue or dry run: its tasks are claimed "
                "one by one, outside the limits made for whole runs"
            )
        if dry_run and placement:
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
            **placement,
            dry_run=bool(dry_run),
            plan=plan,
        )
        run, created = self.store.create_run(new)
        # A key that follows a chain names the start of its first run.
        if not created and not port.same_start(
            lineage.first(self.store, run), new, self.payloads.open_text
        ):
            raise errors.KeyConflict(str(key), run, workflow, new.dry_run)
        return RunHandle[Any](self, run.run_id, hint, created=created)

    def _deadline(self, deadline: timedelta | datetime | None) -> datetime | None:
        """Return the absolute instant of a start's ``deadline``."""
        if deadline is None:
            return None
        if isinstance(deadline, timedelta):
            if deadline <= timedelta(0):
                raise errors.InvalidInput(
                    f"a run deadline must be a positive duration, got {deadline}"
                )
            return self.store.now() + deadline
        if isinstance(deadline, datetime):
            if deadline.tzinfo is None or deadline.utcoffset() is None:
                raise errors.InvalidInput(
                    f"a run deadline must be an aware datetime, got {deadline.isoformat()}"
                )
            return deadline
        raise errors.InvalidInput(
            f"a run deadline is a timedelta or an aware datetime, got {type(deadline).__name__}"
        )

    def _placement(
        self, queue: str | None, queue_key: str | None, priority: int | None
    ) -> dict[str, Any]:
        """Return a start's queue, key and priority as a run stores them, checked."""
        if queue is None:
            if queue_key is not None or priority is not None:
                given = "queue_key" if queue_key is not None else "priority"
                raise errors.InvalidQueue(
                    f"{given} applies within a queue: pass queue= too (runs in no queue "
                    "are claimed first come, first served)"
                )
            return {}
        codec.check_text("a queue name", queue)
        if queue_key is not None:
            if not isinstance(queue_key, str):
                raise errors.InvalidQueue(
                    f"a queue key is a string, got {type(queue_key).__name__}"
                )
            codec.check_text("a queue key", queue_key)
        if priority is None:
            priority = 0
        low, high = queueport.PRIORITY_MIN, queueport.PRIORITY_MAX
        if type(priority) is not int or not low <= priority <= high:
            raise errors.InvalidQueue(
                f"a priority is a 32-bit integer (lower runs first), got {priority!r}"
            )
        found = (
            self.store.get_queue(self.app, queue)
            if isinstance(self.store, queueport.QueueStore)
            else None
        )
        if found is None:
            raise errors.UnknownQueue(
                f"app {self.app} has no queue {queue!r}; declare it with app.queue({queue!r}, ...)"
            )
        return {"queue": queue, "queue_key": queue_key, "priority": priority}

    def handle(self, run_id: str, hint: Any = None) -> RunHandle[Any]:
        return RunHandle[Any](self, run_id, hint)

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
        return replace(run_info(run, self.payloads.open), chain=lineage.chain_ids(self.store, run))

    def _current(self, run_id: str) -> port.Run:
        """Return the run, or the current run of its chain if it continued as new."""
        return lineage.current(self.store, self._run(run_id))

    def _current_info(self, run_id: str) -> records.RunInfo:
        """Return the information of the run's chain's current run (no chain listing)."""
        return run_info(self._current(run_id), self.payloads.open)

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
        return [run_info(r, self.payloads.open) for r in found]

    def result(self, run_id: str, timeout: float | None = None, hint: Any = None) -> Any:
        """Wait for the run to end; return its result or raise RunFailed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = POLL_FIRST
        # Registered before the first read, so that an end reported by a
        # worker of this process in between is not missed.
        with endings.of(self.store).watch(run_id) as ended:
            while True:
                info = self._current_info(run_id)
                if info.state == "succeeded":
                    return codec.convert(info.result, hint)
                if info.done:
                    raise errors.RunFailed(run_id, info.state, info.error)
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    raise errors.ResultTimeout(
                        f"run {run_id} is still {info.state} after {timeout}s"
                    )
                left = pause if deadline is None else min(pause, max(0.0, deadline - now))
                ended.wait(left)
                ended.clear()
                pause = min(pause * 1.3, POLL_MAX)

    async def aresult(self, run_id: str, timeout: float | None = None, hint: Any = None) -> Any:
        """Async form of ``result``: reads with ``aget``, pauses with ``asyncio.sleep``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = POLL_FIRST
        while True:
            info = await self._acurrent_info(run_id)
            if info.state == "succeeded":
                return codec.convert(info.result, hint)
            if info.done:
                raise errors.RunFailed(run_id, info.state, info.error)
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                raise errors.ResultTimeout(f"run {run_id} is still {info.state} after {timeout}s")
            await asyncio.sleep(pause if deadline is None else min(pause, deadline - now))
            pause = min(pause * 1.3, POLL_MAX)

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

    def cancel(self, run_id: str) -> bool:
        """Cancel the run and its descendants; True if the request took effect.

        A run that continued as new is canceled through its chain's current run.
        """
        self._run(run_id)
        return self.store.request_cancel(run_id)

    def resolve(
        self,
        run_id: str,
        step: str,
        *,
        output: Any = _MISSING,
        error: str | None = None,
        note: str | None = None,
    ) -> records.RunInfo:
        """Settle the ambiguous step of a ``needs_attention`` run.

        With ``output`` the step is recorded as succeeded and the run re-queued;
        with ``error`` the step and the run fail.

        Raises:
            errors.NotResolvable: the run is not stopped on this step.
        """
        if (output is _MISSING) == (error is None):
            raise errors.InvalidInput("resolve takes exactly one of output= or error=")
        run = self._run(run_id)
        if run.plan_digest is not None:
            return self._resolve_task(run, step, output, error)
        info = run_info(run)
        if run.state != "needs_attention":
            raise errors.NotResolvable(f"run {run_id} is {run.state}, not needs_attention")
        at_fault = (info.error or {}).get("step")
        if at_fault != step:
            raise errors.NotResolvable(
                f"run {run_id} is not stopped on step {step!r}"
                + (
                    f" (it is stopped on {at_fault!r})"
                    if at_fault
                    else f" ({(info.error or {}).get('code')}: nothing to resolve)"
                )
            )
        entry = next(
            (
                e
                for e in self.store.journal(run_id)
                if e.kind == "step" and e.name == step and e.status == "started"
            ),
            None,
        )
        if entry is None:
            raise errors.NotResolvable(f"step {step!r} of run {run_id} has no unsettled effect")
        try:
            earlier = journal.failed_attempts(entry)
        except ValueError as exc:
            raise errors.CorruptState(
                run_id, "journal_attempts_shape", f"position {entry.position}: {exc}"
            ) from exc
        who = f"{getpass.getuser()}@{socket.gethostname()}"
        why = f"resolved by {who}" + (f": {note}" if note else "")
        if error is None:
            final = port.JournalEntry(
                entry.position,
                "step",
                step,
                "ok",
                self.payloads.seal(output, "the resolved output"),
                journal.Attempts(earlier).encode(),
                attempt=entry.attempt,
            )
            self.store.resolve(
                run_id, run.generation, final, state="queued", error=None, note=why + " (succeeded)"
            )
        else:
            final = port.JournalEntry(
                entry.position,
                "step",
                step,
                "error",
                error=journal.StepError("Resolved", error, attempts=earlier).encode(),
                attempt=entry.attempt,
            )
            run_error = codec.encode({"code": "resolved_failed", "message": error, "step": step})
            self.store.resolve(
                run_id,
                run.generation,
                final,
                state="failed",
                error=run_error,
                note=why + " (failed)",
            )
        return self.get(run_id)

    def fork(
        self, run_id: str, from_step: str | None = None, *, live: bool = False
    ) -> RunHandle[Any]:
        """Start a new run of the same workflow and inputs that reuses the journal.

        The new run replays the old journal up to ``from_step`` (the step's
        key, e.g. ``charge`` or ``charge#2``), or, by default, up to the first
        entry that did not succeed, and executes from there: the way to retry
        a failed run after a fix.

        A fork never runs a ``once`` effect again unless the caller names the
        step to run again from: a run that is still live (queued, running or
        waiting) is forked only from an explicit ``from_step`` before the step
        it is executing, with ``live=True``; a run stopped on an ambiguous
        ``once`` step is forked by default only once that step is resolved.

        Raises:
            errors.InvalidInput: the run's journal has no such step.
            errors.RunNotFinished: the run is live, and ``from_step`` or
                ``live=True`` is missing or the fork point is not before its
                in-flight step.
            errors.EffectUnsettled: the fork would run, or copy, a ``once``
                step whose effect started and whose outcome is unknown.
        """
        run = self._run(run_id)
        if run.plan_digest is not None:
            return RunHandle[Any](self, self._fork_plan(run, from_step), None, created=True)
        recorded = self.store.journal(run_id)
        validation.journal(run_id, recorded)
        # A resolve between the two reads makes the run live again: judge by both.
        state = next(
            (r.state for r in (run, self._run(run_id)) if r.state not in port.TERMINAL_STATES),
            run.state,
        )
        live_now = state not in port.TERMINAL_STATES
        if live_now and (from_step is None or not live):
            raise errors.RunNotFinished(
                run_id,
                state,
                f"run {run_id} is still {state}, so a fork could repeat a step the run is "
                "running or about to run; wait until it ends, or fork from an earlier step "
                "explicitly "
                "(from_step=... with live=True; perdure fork --from-step STEP --live)",
            )
        if from_step is None:
            cut = next((i for i, e in enumerate(recorded) if e.status != "ok"), len(recorded))
            if cut < len(recorded) and journal.unsettled(recorded[cut]):
                step = recorded[cut].name
                raise errors.EffectUnsettled(
                    run_id,
                    step,
                    f"step {step} of run {run_id} started its effect and its outcome is "
                    "unknown, so a fork would run it again; resolve the step first "
                    f"(perdure resolve {run_id} {step} --output JSON or --error MSG), or fork "
                    "from that step or an earlier one explicitly if running it again is right",
                )
        else:
            found = [i for i, e in enumerate(recorded) if e.kind == "step" and e.name == from_step]
            if not found:
                raise errors.InvalidInput(f"run {run_id} has no step {from_step!r} in its journal")
            cut = found[0]
            # The first entry that is not settled: a live run's is the step in
            # flight, which the fork must not run or copy.
            held = next(
                (
                    (i, e)
                    for i, e in enumerate(recorded)
                    if e.kind == "step"
                    and e.status == "started"
                    and (live_now or journal.unsettled(e))
                ),
                None,
            )
            if live_now and held is not None and held[0] <= cut:
                raise errors.RunNotFinished(
                    run_id,
                    state,
                    f"run {run_id} is {state} with step {held[1].name} in flight; fork from "
                    "a step before it",
                )
            if held is not None and held[0] < cut:
                step = held[1].name
                raise errors.EffectUnsettled(
                    run_id,
                    step,
                    f"step {step} of run {run_id} started its effect and its outcome is "
                    f"unknown; fork from {step} or an earlier step, or resolve it first "
                    f"(perdure resolve {run_id} {step} --output JSON or --error MSG)",
                )
        # A child whose result is not copied would report to the old parent, so
        # the fork starts its own child from that position.
        results = {e.name for e in recorded[:cut] if e.kind == "child_result"}
        for i, entry in enumerate(recorded[:cut]):
            if entry.kind == "child" and _child_id(entry) not in results:
                cut = i
                break
        new = port.NewRun(
            run_id=uuid.uuid4().hex,
            app=self.app,
            workflow=run.workflow,
            version=run.version,
            input=telemetry.with_trace(run.input, self.telemetry.trace_context()),
        )
        self.store.create_run(new, recorded[:cut])
        return RunHandle[Any](self, new.run_id)

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
    afork = athread(fork)
    aruns = athread(runs)
    achildren = athread(children)
    ahistory = athread(history)
    asignal = athread(signal)
    asend = athread(send)
    awaits = athread(waits)
    aresume = athread(resume)
    asuspend = athread(suspend)
    acancel = athread(cancel)
    aresolve = athread(resolve)
    # These wait for announcements on a listener thread.
    aupdate = blocking_twin(liveclient.LiveCalls.update)
    aevents = blocking_twin(liveclient.LiveCalls.events)
    aget_event = blocking_twin(liveclient.LiveCalls.get_event)
    atimers = athread(timers)
