"""The durable select: ``ctx.first(*sources)`` takes whichever source fires first.

::

    exit_sig, inbox = perdure.signal("exit"), perdure.message("inbox")
    fired = ctx.first(exit_sig, inbox, perdure.timer(timedelta(days=30)))
    if fired.source == exit_sig:
        ...

A source is made by :func:`signal` (a signal's payload, as ``ctx.wait``
takes it), :func:`message` (the next unconsumed channel message, as
``ctx.receive``), :func:`update` (the next unconsumed update, as
``ctx.next_update``), :func:`child` (a child run's result, as
``handle.result()``) or :func:`timer` (fires once its duration has passed;
its value is None). The rules:

* Exactly one source wins. The journal records which one and what it
  delivered (one entry of kind ``first``), written before the call returns,
  so replay and recovery take the same branch without asking the store
  again, whatever arrived meanwhile; the outcome is written once, like a
  wait's.
* The others are left as they were: a signal that lost stays kept for a later
  wait or ``first`` on its name, a message stays in its channel, an update
  stays pending, a child keeps running (its result can still be awaited), a
  timer is dropped.
* When several are ready at once, the earliest in argument order wins. A timer
  is ready once its deadline has been reached; deadlines (a timer's, and the
  call's own ``timeout``) are computed when the call is first reached and
  journaled, like a wait's.
* When none is ready, the run parks on all of them at once (the worker is
  freed) and any of them wakes it: a signal, a message, an update, the
  child's end, or the earliest deadline. The call is then evaluated again.

This module is the context's own machinery (it reads the context's cursor and
runtime); :meth:`perdure.Context.first` is its entry point.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, ClassVar

from perdure import codec, errors, journal, live, records, replay, signals, steps

if TYPE_CHECKING:
    from perdure import children, context


def _duration(d: timedelta | float, what: str) -> timedelta:
    if isinstance(d, bool) or not isinstance(d, timedelta | int | float):
        raise errors.InvalidInput(f"{what} must be a timedelta or seconds, got {type(d).__name__}")
    delta = d if isinstance(d, timedelta) else timedelta(seconds=float(d))
    if delta < timedelta(0):
        raise errors.InvalidInput(f"{what} cannot be negative: {delta}")
    return delta


# -- sources ---------------------------------------------------------------------


@dataclass(frozen=True)
class Source:
    """Something :meth:`perdure.Context.first` waits on. Made by the functions below."""

    kind: ClassVar[str] = ""

    @property
    def label(self) -> str:
        """How the journal names this source in a ``first`` entry."""
        raise NotImplementedError


@dataclass(frozen=True)
class SignalSource(Source):
    """The next signal named ``name`` (see :func:`signal`)."""

    kind: ClassVar[str] = "signal"
    name: str
    type: Any = field(default=None, compare=False, repr=False)

    @property
    def label(self) -> str:
        return f"signal:{self.name}"


@dataclass(frozen=True)
class MessageSource(Source):
    """The next unconsumed message on ``channel`` (see :func:`message`)."""

    kind: ClassVar[str] = "message"
    channel: str
    type: Any = field(default=None, compare=False, repr=False)

    @property
    def label(self) -> str:
        return f"message:{self.channel}"


@dataclass(frozen=True)
class UpdateSource(Source):
    """The next unconsumed update named ``name`` (see :func:`update`)."""

    kind: ClassVar[str] = "update"
    name: str
    type: Any = field(default=None, compare=False, repr=False)

    @property
    def label(self) -> str:
        return f"update:{self.name}"


@dataclass(frozen=True)
class ChildSource(Source):
    """The end of the child run ``run_id`` (see :func:`child`)."""

    kind: ClassVar[str] = "child"
    run_id: str
    hint: Any = field(default=None, compare=False, repr=False)

    @property
    def label(self) -> str:
        return f"child:{self.run_id}"


@dataclass(frozen=True)
class TimerSource(Source):
    """A deadline ``duration`` after the ``first`` is first reached (see :func:`timer`)."""

    kind: ClassVar[str] = "timer"
    duration: timedelta

    @property
    def label(self) -> str:
        return "timer"


def signal(name: str, *, type: Any = None) -> SignalSource:
    """Return the source that fires when the signal ``name`` arrives; its value is the payload.

    A signal sent before the call is kept for it, as for ``ctx.wait``; one
    that loses stays kept for the next wait on ``name``. ``type`` converts the
    payload as ``ctx.wait(name, type=...)`` does.

    Raises:
        errors.InvalidInput: a name no wait can have.
    """
    signals.check_wait_name(name)
    return SignalSource(name, type)


def message(channel: str, *, type: Any = None) -> MessageSource:
    """Return the source that fires on the run's next unconsumed message on ``channel``.

    Its value is a :class:`perdure.Message`, as ``ctx.receive`` returns it.
    """
    codec.check_text("a channel name", channel)
    return MessageSource(channel, type)


def update(name: str, *, type: Any = None) -> UpdateSource:
    """Return the source that fires on the run's next unconsumed update named ``name``.

    Its value is a :class:`perdure.Update`, to answer with ``ctx.respond``.
    """
    if not isinstance(name, str) or not name or "/" in name:
        raise errors.InvalidInput(f"update name {name!r} must be non-empty, without '/'")
    return UpdateSource(name, type)


def child(handle: children.ChildHandle) -> ChildSource:
    """Return the source that fires when the child run of ``handle`` ends; its value is the result.

    A child that failed or was canceled makes ``first`` raise
    :class:`perdure.ChildFailed`, as ``handle.result()`` does.
    """
    run_id = getattr(handle, "run_id", None)
    if not isinstance(run_id, str):
        raise errors.InvalidInput(
            f"perdure.child takes the handle ctx.start_child returns, got {type(handle).__name__}"
        )
    return ChildSource(run_id, getattr(handle, "_hint", None))


def timer(duration: timedelta | float) -> TimerSource:
    """Return the source that fires ``duration`` after the ``first`` is first reached.

    Its value is None. A number is seconds.
    """
    return TimerSource(_duration(duration, "a timer's duration"))


@dataclass(frozen=True)
class Fired:
    """What :meth:`perdure.Context.first` returns: the source that won and what it delivered.

    ``source`` is the very source passed in (compare it with ``==``),
    ``index`` its place among the arguments (from 0), and ``value`` the
    signal's payload, the :class:`perdure.Message`, the :class:`perdure.Update`,
    the child's result, or None for a timer. ``await``-able, like a message,
    for async workflows.
    """

    source: Source
    value: Any
    index: int

    def __await__(self) -> Generator[Any, None, Fired]:
        return self
        yield  # never suspends: the winner is known


# -- the call ---------------------------------------------------------------------


def _checked(ctx: context.Context, sources: Sequence[Any]) -> list[tuple[Source, str | None]]:
    """Return each source with the name of the wait it registers (None for a timer)."""
    if not sources:
        raise errors.InvalidInput("ctx.first needs at least one source")
    found: list[tuple[Source, str | None]] = []
    for source in sources:
        if not isinstance(source, Source) or not source.kind:
            raise errors.InvalidInput(
                "ctx.first takes sources made by perdure.signal, perdure.message, "
                f"perdure.update, perdure.child or perdure.timer, got {type(source).__name__}"
            )
        if any(source == seen for seen, _ in found):
            raise errors.InvalidInput(f"ctx.first was given {source.label!r} twice")
        found.append((source, _registered(ctx, source)))
    names = [name for _, name in found if name is not None]
    clash = next((n for n in names if names.count(n) > 1), None)
    if clash is not None:
        # A run registers one wait per name: a signal, a channel and an update
        # of one name cannot be told apart while it is parked.
        raise errors.InvalidInput(f"ctx.first waits on two sources both named {clash!r}")
    return found


def _registered(ctx: context.Context, source: Source) -> str | None:
    if isinstance(source, SignalSource):
        return ctx._cursor.peek_wait_key(source.name)
    if isinstance(source, MessageSource):
        return source.channel
    if isinstance(source, UpdateSource):
        return source.name
    if isinstance(source, ChildSource):
        return f"child:{source.run_id}"
    return None


def first(ctx: context.Context, sources: Sequence[Any], timeout: timedelta | float | None) -> Fired:
    """Carry out ``ctx.first(*sources, timeout=timeout)`` (see the module docstring)."""
    chosen = _checked(ctx, sources)
    limit = None if timeout is None else _duration(timeout, "a timeout")
    label = "|".join(source.label for source, _ in chosen)
    runtime = ctx._runtime
    entry = ctx._next(replay.Call("first", label))
    if entry is not None and entry.status != "started":
        return _apply(ctx, chosen, entry)
    if entry is None:
        now = runtime.now()
        deadlines = tuple(
            now + s.duration if isinstance(s, TimerSource) else None for s, _ in chosen
        )
        opened = journal.FirstOpened(deadlines, None if limit is None else now + limit)
        entry = journal.Entry(ctx._cursor.position, "first", label, "started", opened.encode())
        runtime.buffer(entry)
    opened = ctx._read(entry, lambda text: _opened(text, len(chosen)))
    now = runtime.now()
    for index, (source, name) in enumerate(chosen):
        ready = _probe(ctx, label, index, source, name, opened.deadlines[index], now)
        if ready is not None:
            done, mark = ready
            runtime.buffer(done, mark)
            return _apply(ctx, chosen, _written(runtime, done))
    if opened.timeout is not None and now >= opened.timeout:
        ended = journal.FirstEnded("wait_timeout", f"no source of first({label}) fired in time")
        done = journal.Entry(ctx._cursor.position, "first", label, "error", error=ended.encode())
        return _apply(ctx, chosen, _written(runtime, done))
    waits = [_wait(ctx, source, name) for source, name in chosen if name is not None]
    due = [d for d in (*opened.deadlines, opened.timeout) if d is not None]
    raise steps.Parked(waits, min(due) if due else None)


def _written(runtime: context.Runtime, done: journal.Entry) -> journal.Entry:
    """Write the call's outcome now (with what is buffered), before the code goes on.

    A single wait can be applied lazily, with the next write: after a crash
    the same outcome is still the only one. A race is not: another source may
    have become ready meanwhile, and the branch already taken must not change,
    even when the code after it only ran idempotent steps, which write nothing
    before their outcome.
    """
    runtime.record_live(done)
    return done


def _opened(text: str | None, count: int) -> journal.FirstOpened:
    opened = journal.FirstOpened.decode(text)
    if len(opened.deadlines) != count:
        raise journal.Unreadable(f"{len(opened.deadlines)} deadlines for {count} sources")
    return opened


def _wait(ctx: context.Context, source: Source, name: str) -> journal.WaitSpec:
    """Return the wait the run registers for ``source`` while it is parked."""
    if isinstance(source, MessageSource):
        return journal.WaitSpec(name, "channel", None, ctx._consumed.get(source.channel, 0))
    if isinstance(source, UpdateSource):
        return journal.WaitSpec(name, "update", None, ctx._live.updates.get(source.name, 0))
    # A signal's wait has no deadline of its own: one that arrives after a
    # timer won is kept for a later wait, not turned into a timeout.
    return journal.WaitSpec(name, "child" if isinstance(source, ChildSource) else "signal")


def _body(value: Any) -> Any:
    """Return a journal body's record as the JSON value it is stored as."""
    return codec.decode(value.encode())


def _probe(
    ctx: context.Context,
    label: str,
    index: int,
    source: Source,
    name: str | None,
    deadline: datetime | None,
    now: datetime,
) -> tuple[journal.Entry, journal.Mark | None] | None:
    """Return the entry (and receipt) that settles the call on ``source``, if it is ready."""
    runtime, position = ctx._runtime, ctx._cursor.position
    fired: journal.FirstFired | None = None
    mark: journal.Mark | None = None
    if isinstance(source, TimerSource):
        if deadline is not None and now >= deadline:
            fired = journal.FirstFired(index, "timer", None, None)
    elif isinstance(source, SignalSource | ChildSource):
        assert name is not None
        outcome = runtime.outcome(name)
        if outcome is None:
            return None
        mark = journal.Mark("outcome_applied", name, outcome.payload_digest)
        if isinstance(source, ChildSource):
            value = codec.decode(outcome.payload or "{}")
            fired = journal.FirstFired(index, "child", source.run_id, value)
        elif outcome.outcome == "signaled":
            fired = journal.FirstFired(index, "signal", name, _body(journal.Signaled.of(outcome)))
        else:
            code = "canceled" if outcome.outcome == "canceled" else "wait_timeout"
            ended = journal.FirstEnded(code, f"wait {name!r} {outcome.outcome}", index, name)
            return journal.Entry(position, "first", label, "error", error=ended.encode()), mark
    elif isinstance(source, MessageSource):
        found = runtime.next_message(source.channel, ctx._consumed.get(source.channel, 0))
        if found is not None:
            received = journal.Received.of(found)
            fired = journal.FirstFired(index, "message", source.channel, _body(received))
            mark = journal.Mark("outcome_applied", source.channel, codec.digest(found.payload))
    elif isinstance(source, UpdateSource):
        arrived = runtime.next_update(source.name, ctx._live.updates.get(source.name, 0))
        if arrived is not None:
            fired = journal.FirstFired(index, "update", source.name, _body(arrived))
            mark = journal.Mark("outcome_applied", source.name, codec.digest(arrived.encode()))
    if fired is None:
        return None
    return journal.Entry(position, "first", label, "ok", fired.encode()), mark


# -- applying the recorded winner --------------------------------------------------


def _parse(chosen: Sequence[tuple[Source, str | None]], text: str | None) -> tuple[int, Any]:
    """Return the winner's index and its body, refusing one that names another source."""
    fired = journal.FirstFired.decode(text)
    if fired.index >= len(chosen):
        raise journal.Unreadable(f"source {fired.index} of {len(chosen)}")
    source, name = chosen[fired.index]
    if fired.kind != source.kind:
        raise journal.Unreadable(f"source {fired.index} is a {source.kind}, not a {fired.kind}")
    if isinstance(source, TimerSource):
        return fired.index, None
    if isinstance(source, SignalSource):
        # The wait key is checked against the code's when it is taken.
        return fired.index, (fired.name, fired.signaled())
    expected = source.run_id if isinstance(source, ChildSource) else name
    if fired.name != expected:
        raise journal.Unreadable(f"source {fired.index} is {expected!r}, not {fired.name!r}")
    if isinstance(source, MessageSource):
        return fired.index, fired.received()
    if isinstance(source, UpdateSource):
        return fired.index, live.UpdateReceived.decode(codec.encode(fired.value, envelope=2))
    return fired.index, fired.child()


def _take_wait(ctx: context.Context, source: Source, recorded: str | None) -> None:
    """Take the wait key a signal source consumed, as ``ctx.wait`` would have."""
    assert isinstance(source, SignalSource)
    key = ctx._cursor.wait_key(source.name)
    if key != recorded:
        message = (
            f"run {ctx.run_id} position {ctx._cursor.position}: journal applied wait "
            f"{recorded!r}, code now takes {key!r}"
        )
        raise steps.Halt("needs_attention", steps.error_dict("non_determinism", message))


def _apply(
    ctx: context.Context, chosen: Sequence[tuple[Source, str | None]], entry: journal.Entry
) -> Fired:
    """Return the recorded winner (taking what it consumed), or raise how the call ended."""
    if entry.status == "error":
        ended: journal.FirstEnded = ctx._read(entry, journal.FirstEnded.decode)
        if ended.index is not None:
            if ended.index >= len(chosen):
                raise steps.unreadable(ctx.run_id, entry, ValueError("no such source"))
            _take_wait(ctx, chosen[ended.index][0], ended.name)
        if ended.code == "canceled":
            ctx._runtime.acknowledge_cancel()
            raise errors.Canceled(ctx.run_id, "the wait was canceled")
        raise errors.WaitTimedOut(ended.message)
    index, body = ctx._read(entry, lambda text: _parse(chosen, text))
    source = chosen[index][0]
    value: Any = None
    if isinstance(source, SignalSource):
        recorded, signaled = body
        _take_wait(ctx, source, recorded)
        value = codec.convert(ctx._opened(signaled.payload), source.type)
    elif isinstance(source, MessageSource):
        ctx._consumed[source.channel] = body.sequence
        value = records.Message(body.key, codec.convert(ctx._opened(body.payload), source.type))
    elif isinstance(source, UpdateSource):
        ctx._live.updates[source.name] = body.sequence
        payload = codec.convert(ctx._opened(body.payload), source.type)
        value = records.Update(body.update_id, source.name, payload)
    elif isinstance(source, ChildSource):
        if body.state != "succeeded":
            raise errors.ChildFailed(source.run_id, str(body.state), body.error)
        value = codec.convert(ctx._opened(body.result), source.hint)
    return Fired(source, value, index)
