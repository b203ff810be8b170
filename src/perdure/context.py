"""What workflow code sees: :class:`Context`, and the narrow runtime it needs.

Every durable call (a step, ``sleep``, ``wait``, ``receive``, a child,
``now``/``random``/``uuid``) takes the next journal position. Recorded
positions are replayed; the first unrecorded one executes. Entries that only
record values (``now``, a received message, a created child, an applied wait
outcome) are buffered by the runtime and written in the same transaction as
the next durable write, so a step costs one commit; nothing outside the run
can observe a buffered value before it is stored.

The context holds no store: everything it reads or writes goes through its
:class:`Runtime` (:mod:`perdure.runtime`), which the worker's execution
implements (and a test can fake in memory). Its base classes hold the calls
on child runs (:mod:`perdure.children`) and on live runs (:mod:`perdure.livecontext`).
"""

from __future__ import annotations

import contextvars
import random as _random
import uuid as _uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, NoReturn

from perdure import (
    chains,
    children,
    codec,
    dryrun,
    errors,
    journal,
    livecontext,
    ready,
    records,
    replay,
    runtime,
    select,
    signals,
    steps,
)

_CURRENT: contextvars.ContextVar[Context | None] = contextvars.ContextVar(
    "perdure_context", default=None
)

# Step-body helpers keep their historical home here.
in_step = steps.in_step
idempotency_key = steps.idempotency_key


def current() -> Context | None:
    """Return the context of the workflow running in this thread or task, if any."""
    return _CURRENT.get()


# Defined with the step machinery, which parks a run for a long retry backoff.
Parked = steps.Parked

# What the worker supplies to a context, declared apart (see perdure.runtime).
Runtime = runtime.Runtime
NewChild = runtime.NewChild


def _as_delta(d: timedelta | float) -> timedelta:
    delta = d if isinstance(d, timedelta) else timedelta(seconds=float(d))
    if delta < timedelta(0):
        raise errors.InvalidInput(f"a duration cannot be negative: {delta}")
    return delta


_Recorded = type[journal.Instant] | type[journal.Random] | type[journal.Uuid]


class Context(livecontext.LiveContext, children.Children):
    """The handle a workflow function receives as its first argument."""

    def __init__(
        self,
        *,
        run_id: str,
        workflow: str,
        runtime: Runtime,
        cursor: replay.JournalCursor,
        asynchronous: bool = False,
        dry_run: bool = False,
    ) -> None:
        self.run_id = run_id
        self.workflow = workflow
        # A dry run describes its effectful steps instead of calling them (dryrun.py).
        self.dry_run = dry_run
        # An async workflow awaits its waits: they return a Ready (see ready.py).
        self.asynchronous = asynchronous
        self._runtime = runtime
        self._cursor = cursor
        self._consumed: dict[str, int] = {}
        self._live = livecontext.LiveState()

    def restart(self) -> None:
        """Prepare to run the code again from the top (after a park that did not happen)."""
        self._cursor.rewind()
        self._consumed.clear()
        self._live = livecontext.LiveState()

    def bind(self) -> contextvars.Token[Context | None]:
        return _CURRENT.set(self)

    @staticmethod
    def unbind(token: contextvars.Token[Context | None]) -> None:
        _CURRENT.reset(token)

    # -- positions --------------------------------------------------------------

    def _next(self, call: replay.Call) -> journal.Entry | None:
        self._runtime.check()
        try:
            return self._cursor.next(call)
        except errors.NonDeterminism as exc:
            raise steps.Halt("needs_attention", steps.error_dict(exc.code, str(exc))) from exc

    def _read(self, entry: journal.Entry, reader: Callable[[str | None], Any]) -> Any:
        """Read a recorded entry's body; a shape this code never writes is corruption."""
        try:
            return reader(entry.output if entry.status != "error" else entry.error)
        except ValueError as exc:
            raise steps.unreadable(self.run_id, entry, exc) from exc

    def _opened(self, value: Any) -> Any:
        """Return the payload a recorded value holds (see :func:`steps.opened`)."""
        return steps.opened(self._runtime, value)

    def _record(self, kind: str, name: str, text: str) -> None:
        self._runtime.buffer(journal.Entry(self._cursor.position, kind, name, "ok", text))

    def _value(self, kind: str, body: _Recorded, make: Callable[[], Any]) -> Any:
        """Replay the value recorded at this position, or record a new one."""
        entry = self._next(replay.Call(kind, kind))
        if entry is not None:
            return self._read(entry, lambda text: body.decode(text).value)
        text = body(make()).encode()
        self._record(kind, kind, text)
        return body.decode(text).value  # as replay will read it back

    # -- logical time -----------------------------------------------------------

    def now(self) -> datetime:
        """Return the current time as first seen by this run at this point (aware UTC)."""
        at: datetime = self._value("now", journal.Instant, self._runtime.now)
        return at

    def random(self) -> float:
        """Return a random float in [0, 1), the same on every replay."""
        value: float = self._value("random", journal.Random, _random.random)
        return value

    def uuid(self) -> _uuid.UUID:
        """Return a random UUID, the same on every replay."""
        value: _uuid.UUID = self._value("uuid", journal.Uuid, _uuid.uuid4)
        return value

    # -- sleeping and waiting ---------------------------------------------------

    def _give(self, value: Any) -> Any:
        """Return ``value`` as this workflow takes it: itself, or a Ready to await."""
        return ready.Ready(value) if self.asynchronous else value

    def sleep(self, duration: timedelta | float) -> ready.Ready[None]:
        """Pause the run durably until ``duration`` after this call was first reached.

        ``await ctx.sleep(...)`` in an async workflow; the sync form ignores
        what it returns.
        """
        delta = _as_delta(duration)
        key = self._cursor.step_key("sleep")
        entry = self._next(replay.Call("sleep", key))
        if entry is None:
            until = journal.Instant(self._runtime.now() + delta).encode()
            entry = journal.Entry(self._cursor.position, "sleep", key, "ok", until)
            self._runtime.buffer(entry)
        due: datetime = self._read(entry, lambda text: journal.Instant.decode(text).value)
        while self._runtime.now() < due:
            self._hold([], due)
        return ready.Ready(None)

    def _hold(self, waits: list[journal.WaitSpec], wake_at: datetime | None) -> None:
        """Park; return only if the run may look at its wait again, in place."""
        # An async workflow's code runs on the worker's event loop: it cannot block there.
        if self.asynchronous or not self._runtime.hold(waits, wake_at):
            raise Parked(waits, wake_at)

    def _open(
        self, kind: str, name: str, timeout: timedelta | float | None
    ) -> tuple[journal.Entry | None, datetime | None]:
        """Return the settled entry, or None and the journaled deadline of an open one."""
        entry = self._next(replay.Call(kind, name))
        if entry is not None and entry.status != "started":
            return entry, None
        if entry is None:
            deadline = None if timeout is None else self._runtime.now() + _as_delta(timeout)
            body = journal.Opened(deadline).encode()
            entry = journal.Entry(self._cursor.position, kind, name, "started", body)
            self._runtime.buffer(entry)
        due: datetime | None = self._read(entry, lambda text: journal.Opened.decode(text).deadline)
        return None, due

    def wait(self, name: str, timeout: timedelta | float | None = None, *, type: Any = None) -> Any:
        """Pause until the signal ``name`` arrives and return its payload.

        In an async workflow, ``payload = await ctx.wait(name)``.

        Raises:
            errors.WaitTimedOut: the timeout won the race.
        """
        signals.check_wait_name(name)
        # Each wait on a name is a wait of its own (name, name#2, ...): a signal
        # settles the earliest one without an outcome.
        name = self._cursor.wait_key(name)
        done, deadline = self._open("wait", name, timeout)
        if done is None:
            while True:
                outcome = self._runtime.outcome(name)
                if outcome is None and deadline is not None and self._runtime.now() >= deadline:
                    outcome = self._runtime.settle_timeout(name)
                if outcome is not None:
                    break
                self._hold([journal.WaitSpec(name, "signal", deadline)], None)
            done, mark = journal.settled_wait(self._cursor.position, outcome)
            self._runtime.buffer(done, mark)
        if done.status == "ok":
            return self._give(
                codec.convert(self._opened(self._read(done, journal.Signaled.decode).payload), type)
            )
        ended: journal.WaitEnded = self._read(done, journal.WaitEnded.decode)
        if ended.code == "canceled":
            self._runtime.acknowledge_cancel()
            raise errors.Canceled(self.run_id, "the wait was canceled")
        raise errors.WaitTimedOut(f"wait {name!r} timed out")

    def receive(
        self, channel: str, timeout: timedelta | float | None = None, *, type: Any = None
    ) -> records.Message:
        """Return the oldest message on ``channel`` this run has not consumed yet.

        Raises:
            errors.WaitTimedOut: no message arrived before the timeout.
        """
        codec.check_text("a channel name", channel)
        after = self._consumed.get(channel, 0)
        done, deadline = self._open("receive", channel, timeout)
        while done is None:
            message = self._runtime.next_message(channel, after)
            position = self._cursor.position
            if message is not None:
                received = journal.Received.of(message)
                done = journal.Entry(position, "receive", channel, "ok", received.encode())
                mark = journal.Mark("outcome_applied", channel, codec.digest(message.payload))
                self._runtime.buffer(done, mark)
            elif deadline is not None and self._runtime.now() >= deadline:
                error = journal.ReceiveTimedOut.on(channel).encode()
                done = journal.Entry(position, "receive", channel, "error", error=error)
                self._runtime.buffer(done)
            else:
                self._hold([journal.WaitSpec(channel, "channel", deadline, after)], None)
        if done.status != "ok":
            raise errors.WaitTimedOut(f"receive on {channel!r} timed out")
        body: journal.Received = self._read(done, journal.Received.decode)
        self._consumed[channel] = body.sequence
        return records.Message(body.key, codec.convert(self._opened(body.payload), type))

    def first(
        self, *sources: select.Source, timeout: timedelta | float | None = None
    ) -> select.Fired:
        """Pause until the first of ``sources`` fires; return which one, and its value.

        ``fired = ctx.first(perdure.signal("exit"), perdure.message("inbox"),
        perdure.timer(timedelta(days=30)))``, then compare ``fired.source``
        with each source. The sources that lose are not consumed; when several
        are ready, the earliest in argument order wins; the journal records
        the winner, so replay takes the same branch (see :mod:`perdure.select`).
        In an async workflow, ``fired = await ctx.first(...)``.

        Raises:
            errors.WaitTimedOut: ``timeout`` passed before any source fired.
            errors.ChildFailed: the child that won failed or was canceled.
        """
        return select.first(self, sources, timeout)

    # -- steps ------------------------------------------------------------------

    def _step_call(self, fn: Callable[..., Any]) -> steps.StepCall:
        opts = steps.options(fn)
        key = self._cursor.step_key(opts.name)
        recorded = self._next(replay.Call("step", key))
        position = self._cursor.position
        return steps.StepCall(self._runtime, self.run_id, fn, opts, key, position, recorded)

    def _described(self, fn: Callable[..., Any], args: Any, kwargs: Any) -> Any:
        """Record ``fn``'s call in a dry run and return its stub's value."""
        opts = steps.options(fn)
        key = self._cursor.step_key(opts.name)
        recorded = self._next(replay.Call("step", key))
        position = self._cursor.position
        call = dryrun.call(
            self._runtime, self.run_id, fn, opts, key, position, recorded, args, kwargs
        )
        return steps.run(call, dryrun.stub_of(fn), args, kwargs)

    def step(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run ``fn`` as a journaled step (the explicit form of calling a step)."""
        fn = steps.unwrap(fn)
        if self.dry_run and dryrun.described(steps.options(fn)):
            return self._described(fn, args, kwargs)
        return steps.run(self._step_call(fn), fn, args, kwargs)

    async def astep(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run the ``async`` function ``fn`` as a journaled step."""
        fn = steps.unwrap(fn)
        if self.dry_run and dryrun.described(steps.options(fn)):
            return self._described(fn, args, kwargs)
        return await steps.arun(self._step_call(fn), fn, args, kwargs)

    def transaction(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run ``fn(connection, ...)`` inside the transaction that records its outcome."""
        fn = steps.unwrap(fn)
        if self.dry_run:
            return self._described(fn, args, kwargs)
        return steps.run_transaction(self._step_call(fn), fn, args, kwargs)

    # -- continuing as new ------------------------------------------------------

    def continue_as_new(self, *args: Any, version: str | None = None, **kwargs: Any) -> NoReturn:
        """End this run and start its successor with ``args`` and ``kwargs``; never returns.

        The successor runs the same workflow (``version=`` moves it to
        another version of it) from a fresh journal. In the same store
        transaction the run ends ``succeeded`` with no result and names its
        successor (``RunInfo.continued_as``), and the successor is created
        queued with the run's key and parent, the channel messages this run
        has not consumed and the signals it has not applied. The first run
        id keeps answering ``get``, ``result()``, signals, messages and
        cancel through the chain's current run.

        Raises:
            errors.InvalidInput: the arguments do not fit the workflow's signature.
            errors.InvalidPayload: a value does not fit its type hint, or is too large.
        """
        self._runtime.check()
        handover = self._runtime.successor(version, args, kwargs)
        handover.consumed = dict(self._consumed)
        raise chains.ContinueAsNew(handover)

    # -- changing live workflows ------------------------------------------------

    def patched(self, change_id: str) -> bool:
        """Return whether this run takes the code path of the change ``change_id``.

        For a change to a workflow that live runs are executing::

            if ctx.patched("new-charge-flow"):
                charge_with_new_provider(order_id)
            else:
                charge(order_id)

        Reached where the journal records nothing yet (a new run, or an old
        one that had not come this far), it records a ``patch`` entry at this
        position and returns True. Reached where the journal records that
        entry, it returns True again. Reached where the journal records
        anything else (a run that passed this point under the code before the
        change), it returns False and takes no position, so the old path
        replays what that run recorded.
        """
        if not change_id or "/" in change_id:
            raise errors.InvalidInput(f"change id {change_id!r} must be non-empty, without '/'")
        self._runtime.check()
        ahead = self._cursor.peek()
        if ahead is not None and (ahead.kind, ahead.name) != ("patch", change_id):
            return False
        if self._next(replay.Call("patch", change_id)) is None:
            self._record("patch", change_id, journal.Value(True).encode())
        return True
