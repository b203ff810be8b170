"""What workflow code sees: :class:`Context`, and the narrow runtime it needs.

Every durable call (a step, ``sleep``, ``wait``, ``receive``, a child,
``now``/``random``/``uuid``) takes the next journal position. Recorded
positions are replayed; the first unrecorded one executes. Entries that only
record values (``now``, a received message, a created child, an applied wait
outcome) are buffered by the runtime and written in the same transaction as
the next durable write, so a step costs one commit; nothing outside the run
can observe a buffered value before it is stored.

The context holds no store: everything it reads or writes goes through its
:class:`Runtime`, which the worker's execution implements (and a test can
fake in memory).
"""

from __future__ import annotations

import contextvars
import random as _random
import uuid as _uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, NoReturn, Protocol

from perdure import (
    chains,
    codec,
    dryrun,
    errors,
    journal,
    live,
    ready,
    records,
    replay,
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


@dataclass(frozen=True)
class NewChild:
    """A child run to create; ``key`` (scoped to the parent) makes creation idempotent."""

    workflow: str
    version: str
    input: str
    key: str


class Runtime(steps.Runtime, Protocol):
    """What the worker supplies to a running context (beyond what steps need)."""

    def acknowledge_cancel(self) -> None:
        """Let clean-up writes through now that workflow code was told of the cancel."""

    def hold(self, waits: list[journal.WaitSpec], wake_at: datetime | None) -> bool:
        """Park the run here, in place, instead of unwinding its code.

        Returns True when the caller should look at its wait again: the park
        found the wait already met, or the run was parked and then taken up
        again by this worker (see :mod:`perdure.warm`). Returns False when the
        run must be parked the ordinary way (raise :class:`Parked`). May
        raise to unwind a run that was parked here and not taken up again.
        """

    def workflow_ref(self, workflow: Any) -> tuple[str, str, Any]:
        """Return (name, version, return hint) of a registered workflow or its name."""

    def child_call(
        self, workflow: Any, key: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[str | None, dict[str, Any]]:
        """Check a child's arguments as ``app.start`` does; return its key and keyword arguments.

        ``key=`` goes to a workflow that has a parameter named ``key``; the
        run key then comes from ``workflow.keyed(...)``.
        """

    def successor(
        self, version: str | None, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> chains.Handover:
        """Check a successor's arguments as ``app.start`` does; return what it starts with."""

    def now(self) -> datetime:
        """Return the store's current time."""

    def buffer(self, entry: journal.Entry, mark: journal.Mark | None = None) -> None:
        """Keep ``entry`` (and ``mark``) for the next durable write."""

    def outcome(self, name: str) -> journal.Outcome | None:
        """Return the outcome record of the wait ``name``, if it has one."""

    def settle_timeout(self, name: str) -> journal.Outcome:
        """Settle the wait ``name`` as timed out now; return the outcome that won."""

    def next_message(self, channel: str, after_sequence: int) -> journal.Message | None:
        """Return the first message on ``channel`` after ``after_sequence``."""

    def create_children(self, children: list[NewChild]) -> list[str]:
        """Create the child runs (fenced, in one write); return their run ids in order."""

    def next_update(self, name: str, after_sequence: int) -> live.UpdateReceived | None:
        """Return the first update named ``name`` after ``after_sequence``."""

    def answer_update(self, entry: journal.Entry, update_id: str, response: str) -> None:
        """Write ``entry`` (with what is buffered) and the update's answer, in one write."""

    def record_live(self, entry: journal.Entry) -> None:
        """Write ``entry`` (with what is buffered) now, for outside readers to see."""


@dataclass
class ChildHandle:
    """A child run started by a workflow."""

    run_id: str
    _ctx: Context
    _hint: Any = None

    def result(self) -> Any:
        """Pause the parent until the child ends; return its result.

        In an async workflow, ``value = await handle.result()``.

        Raises:
            errors.ChildFailed: the child failed or was canceled.
        """
        return self._ctx._give(self._ctx._child_result(self.run_id, self._hint))


def _item_arguments(item: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Return the arguments one ``ctx.map`` item stands for (see :meth:`Context.map`)."""
    if isinstance(item, tuple):
        return item, {}
    if isinstance(item, dict):
        if not all(isinstance(name, str) for name in item):
            raise errors.InvalidInput("a ctx.map item that is a dict needs parameter names as keys")
        return (), dict(item)
    return (item,), {}


def _as_delta(d: timedelta | float) -> timedelta:
    delta = d if isinstance(d, timedelta) else timedelta(seconds=float(d))
    if delta < timedelta(0):
        raise errors.InvalidInput(f"a duration cannot be negative: {delta}")
    return delta


def _instant(text: str | None) -> datetime:
    return journal.Instant.decode(text).value


_Recorded = type[journal.Instant] | type[journal.Random] | type[journal.Uuid]


@dataclass
class _LiveState:
    """What one pass over the code has done so far with updates and streams."""

    updates: dict[str, int] = field(default_factory=dict)  # name -> last sequence consumed
    answered: set[str] = field(default_factory=set)
    closed: set[str] = field(default_factory=set)


class Context:
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
        self._live = _LiveState()

    def restart(self) -> None:
        """Prepare to run the code again from the top (after a park that did not happen)."""
        self._cursor.rewind()
        self._consumed.clear()
        self._live = _LiveState()

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
        due: datetime = self._read(entry, _instant)
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

    # -- child runs -------------------------------------------------------------

    def _child_id(self, entry: journal.Entry) -> str:
        started: journal.ChildStarted = self._read(entry, journal.ChildStarted.decode)
        return started.run_id

    def start_child(
        self, workflow: Any, *args: Any, key: str | None = None, **kwargs: Any
    ) -> ChildHandle:
        """Start a child run once (per journal position, or per ``key``) and return its handle.

        The arguments are checked against the child's signature here, as
        ``app.start`` checks them. Give the key as ``workflow.keyed(key)``
        when the child has a parameter named ``key``.
        """
        name, version, hint = self._runtime.workflow_ref(workflow)
        entry = self._next(replay.Call("child", name))
        if entry is not None:
            return ChildHandle(self._child_id(entry), self, hint)
        key, kwargs = self._runtime.child_call(workflow, key, args, kwargs)
        if key is not None:
            codec.check_text("a child key", key)
        # A caller's key is scoped to this parent, so two parents never share a child.
        child_key = f"{self.run_id}/{key or self._cursor.position}"
        text = self._runtime.payloads.seal(
            {"args": list(args), "kwargs": kwargs}, f"the input of child {name}", envelope=2
        )
        [run_id] = self._runtime.create_children([NewChild(name, version, text, child_key)])
        self._record("child", name, journal.ChildStarted(run_id).encode())
        return ChildHandle(run_id, self, hint)

    def map(self, workflow: Any, items: Any) -> list[ChildHandle]:
        """Start one child run per item in a single store call.

        An item that is a tuple is the child's positional arguments
        (``workflow(*item)``), a dict its keyword arguments
        (``workflow(**item)``), anything else its one argument
        (``workflow(item)``); to pass one tuple or dict as the only argument,
        wrap it: ``(value,)``. Every item is checked against the child's
        signature before any child is created. Each child takes one journal
        position, so a replayed fan-out creates nothing twice. Collect
        results with ``[h.result() for h in handles]``: the parent pauses on
        the first child still running.
        """
        name, version, hint = self._runtime.workflow_ref(workflow)
        run_ids: list[str] = []
        fresh: list[tuple[int, int, NewChild]] = []  # (index, position, child)
        for item in list(items):
            entry = self._next(replay.Call("child", name))
            if entry is not None:
                run_ids.append(self._child_id(entry))
                continue
            position = self._cursor.position
            args, kwargs = _item_arguments(item)
            _, kwargs = self._runtime.child_call(workflow, None, args, kwargs)
            text = self._runtime.payloads.seal(
                {"args": list(args), "kwargs": kwargs}, f"the input of child {name}", envelope=2
            )
            child = NewChild(name, version, text, f"{self.run_id}/{position}")
            fresh.append((len(run_ids), position, child))
            run_ids.append(child.key)
        if fresh:
            created = self._runtime.create_children([child for _, _, child in fresh])
            for (index, position, _), run_id in zip(fresh, created, strict=True):
                run_ids[index] = run_id
                body = journal.ChildStarted(run_id).encode()
                self._runtime.buffer(journal.Entry(position, "child", name, "ok", body))
        return [ChildHandle(run_id, self, hint) for run_id in run_ids]

    def _child_result(self, child_id: str, hint: Any) -> Any:
        entry = self._next(replay.Call("child_result", child_id))
        if entry is None:
            while (outcome := self._runtime.outcome(f"child:{child_id}")) is None:
                self._hold([journal.WaitSpec(f"child:{child_id}", "child")], None)
            entry, mark = journal.child_result(self._cursor.position, child_id, outcome)
            self._runtime.buffer(entry, mark)
        if entry.status == "ok":
            return codec.convert(self._opened(journal.Value.decode(entry.output).value), hint)
        ended = journal.ChildEnded.decode(entry.error or "{}")
        raise errors.ChildFailed(child_id, str(ended.state), ended.child_error)

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

    # -- talking to the outside world -----------------------------------------------

    def next_update(
        self, name: str, timeout: timedelta | float | None = None, *, type: Any = None
    ) -> records.Update:
        """Return the oldest update named ``name`` this run has not consumed yet.

        Pauses the run until one arrives. Answer it with :meth:`respond`; a run
        that ends first leaves its sender with ``UpdateAbandoned``.

        Raises:
            errors.WaitTimedOut: no update arrived before the timeout.
        """
        if not name or "/" in name:
            raise errors.InvalidInput(f"update name {name!r} must be non-empty, without '/'")
        after = self._live.updates.get(name, 0)
        done, deadline = self._open("update", name, timeout)
        while done is None:
            found = self._runtime.next_update(name, after)
            position = self._cursor.position
            if found is not None:
                done = journal.Entry(position, "update", name, "ok", found.encode())
                mark = journal.Mark("outcome_applied", name, codec.digest(found.encode()))
                self._runtime.buffer(done, mark)
            elif deadline is not None and self._runtime.now() >= deadline:
                error = journal.ReceiveTimedOut("wait_timeout", f"no update {name!r} arrived")
                done = journal.Entry(position, "update", name, "error", error=error.encode())
                self._runtime.buffer(done)
            else:
                self._hold([journal.WaitSpec(name, "update", deadline, after)], None)
        if done.status != "ok":
            raise errors.WaitTimedOut(f"no update {name!r} arrived before the timeout")
        body: live.UpdateReceived = self._read(done, live.UpdateReceived.decode)
        self._live.updates[name] = body.sequence
        return records.Update(body.update_id, name, codec.convert(self._opened(body.payload), type))

    def respond(self, update: records.Update, value: Any = None) -> None:
        """Answer ``update`` with ``value``: journaled, and returned to its sender.

        Raises:
            errors.InvalidInput: this run already answered that update.
        """
        if update.update_id in self._live.answered:
            raise errors.InvalidInput(f"update {update.update_id!r} was already answered")
        entry = self._next(replay.Call("respond", update.name))
        if entry is None:
            text = self._runtime.payloads.seal(value, "the update's response")
            body = live.Responded(update.update_id, codec.decode(text)).encode()
            entry = journal.Entry(self._cursor.position, "respond", update.name, "ok", body)
            self._runtime.answer_update(entry, update.update_id, text)
        else:
            recorded: live.Responded = self._read(entry, live.Responded.decode)
            if recorded.update_id != update.update_id:
                message = (
                    f"run {self.run_id} position {self._cursor.position}: journal answered "
                    f"update {recorded.update_id!r}, code now answers {update.update_id!r}"
                )
                raise steps.Halt("needs_attention", steps.error_dict("non_determinism", message))
        self._live.answered.add(update.update_id)

    def _publish(self, kind: str, key: str, body: Any) -> None:
        """Write an entry outside readers follow, now (replay writes nothing)."""
        if not key or "/" in key:
            raise errors.InvalidInput(f"a {kind} key {key!r} must be non-empty, without '/'")
        entry = self._next(replay.Call(kind, key))
        if entry is None:
            text = body.encode()
            self._runtime.record_live(journal.Entry(self._cursor.position, kind, key, "ok", text))

    def _sized(self, value: Any, what: str) -> Any:
        """Return ``value`` as it is recorded (sealed), refusing one over the payload limit."""
        return self._runtime.payloads.sealed_value(value, what)

    def set_event(self, key: str, value: Any) -> None:
        """Set event ``key`` to ``value`` (durable; readers see the latest value per key)."""
        self._publish("event", key, live.EventSet(self._sized(value, f"event {key!r}")))

    def write_stream(self, key: str, value: Any) -> None:
        """Append ``value`` to stream ``key`` (readers see every item, in order, once).

        Raises:
            errors.InvalidInput: the stream was closed.
        """
        if key in self._live.closed:
            raise errors.InvalidInput(f"stream {key!r} is closed")
        self._publish("stream", key, live.StreamItem(self._sized(value, f"an item of {key!r}")))

    def close_stream(self, key: str) -> None:
        """Close stream ``key``: its readers stop after the last item. Closing twice is a no-op."""
        if key in self._live.closed:
            return
        self._publish("stream_close", key, live.StreamClosed())
        self._live.closed.add(key)

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
