"""What workflow code sees: :class:`Context`, and the narrow runtime it needs.

Every durable call (a step, ``sleep``, ``wait``, ``receive``, a child,
``now``/``random``/``uuid``) takes the next journal position. Recorded
positions are replayed; the first unrecorded one executes. Entries that only
record values (``now``, a received message, a created child, an applied wait
outcome) are buffered and written in the same transaction as the next durable
write, so a step costs one commit; nothing outside the run can observe a
buffered value before it is stored.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import random as _random
import uuid as _uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

from perdure import codec, effects, errors, records, replay
from perdure.store import port

_CURRENT: contextvars.ContextVar[Context | None] = contextvars.ContextVar(
    "perdure_context", default=None
)
_STEP_KEY: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "perdure_step_key", default=None
)


def current() -> Context | None:
    """Return the context of the workflow running in this thread or task, if any."""
    return _CURRENT.get()


def in_step() -> bool:
    """Whether the calling code runs inside a step's body."""
    return _STEP_KEY.get() is not None


def idempotency_key() -> str:
    """Return the running step's stable idempotency key (``run_id/step key``).

    Raises:
        errors.InvalidInput: called outside a step body.
    """
    key = _STEP_KEY.get()
    if key is None:
        raise errors.InvalidInput("idempotency_key() is only available inside a step")
    return key


class Halt(errors.Interrupt):
    """Stop executing the run and settle it as ``reason`` says."""

    def __init__(self, reason: str, error: dict[str, Any] | None = None) -> None:
        self.reason = reason  # "needs_attention" | "release" | "fault"
        self.error = error or {}
        super().__init__(f"{reason}: {self.error.get('message', '')}")


class Parked(errors.Suspend):
    """The run must wait: for ``waits`` to be settled or until ``wake_at``."""

    def __init__(self, waits: list[port.WaitSpec], wake_at: datetime | None) -> None:
        self.waits = waits
        self.wake_at = wake_at
        super().__init__("parked")


class Runtime(Protocol):
    """What the worker supplies to a running context."""

    @property
    def claim(self) -> port.Claim: ...

    def check(self) -> None:
        """Raise if the run must stop (lease lost, canceled, worker stopping)."""
        ...

    def acknowledge_cancel(self) -> None:
        """Let clean-up writes through now that workflow code was told of the cancel."""
        ...

    def workflow_ref(self, workflow: Any) -> tuple[str, str, Any]:
        """Return (name, version, return hint) of a registered workflow or its name."""
        ...

    def pause(self, seconds: float) -> None:
        """Wait between step retries; raises like ``check`` if the run must stop."""
        ...


@dataclass
class ChildHandle:
    """A child run started by a workflow."""

    run_id: str
    _ctx: Context
    _hint: Any = None

    def result(self) -> Any:
        """Pause the parent until the child ends; return its result.

        Raises:
            errors.ChildFailed: the child failed or was canceled.
        """
        return self._ctx._child_result(self.run_id, self._hint)


def _unwrap(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Return the declared function behind an ``@app.step`` wrapper."""
    inner = getattr(fn, "__wrapped__", None)
    return inner if inner is not None and effects.options_of(fn) is not None else fn


def _as_delta(d: timedelta | float) -> timedelta:
    delta = d if isinstance(d, timedelta) else timedelta(seconds=float(d))
    if delta < timedelta(0):
        raise errors.InvalidInput(f"a duration cannot be negative: {delta}")
    return delta


def _error_dict(code: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"code": code, "message": message, **extra}


class Context:
    """The handle a workflow function receives as its first argument."""

    def __init__(
        self,
        *,
        run: port.Run,
        store: port.Store,
        runtime: Runtime,
        journal: list[port.JournalEntry],
        outcomes: list[port.Outcome],
    ) -> None:
        self.run_id = run.run_id
        self.workflow = run.workflow
        self._run = run
        self._store = store
        self._runtime = runtime
        self._cursor = replay.JournalCursor(run.run_id, journal)
        self._outcomes = {o.name: o for o in outcomes}
        self._pending: list[port.JournalEntry] = []
        self._marks: list[port.Mark] = []
        self._consumed: dict[str, int] = {}
        self.unsettled_effect: str | None = None

    # -- bookkeeping the worker uses ------------------------------------------

    def take_pending(self) -> tuple[list[port.JournalEntry], list[port.Mark]]:
        """Hand the buffered entries and marks to a write, emptying the buffer.

        Call :meth:`written` once the write has been stored.
        """
        entries, marks = self._pending, self._marks
        self._pending, self._marks = [], []
        return entries, marks

    def restore(self, entries: list[port.JournalEntry], marks: list[port.Mark]) -> None:
        """Put back entries and marks whose write was refused, ahead of newer ones."""
        newer = self._pending
        self._pending = [e for e in entries if all(n.position != e.position for n in newer)]
        self._pending += newer
        self._marks[:0] = marks

    def written(self, entries: list[port.JournalEntry]) -> None:
        """Note entries the store now holds, so a later pass replays them."""
        for entry in entries:
            self._cursor.record(entry)
            if entry.status != "started" and entry.name == self.unsettled_effect:
                self.unsettled_effect = None

    def restart(self) -> None:
        """Prepare to run the code again from the top (after a park that did not happen)."""
        self._cursor.rewind()
        self._consumed.clear()
        self._outcomes = {o.name: o for o in self._store.outcomes(self.run_id)}

    def bind(self) -> contextvars.Token[Context | None]:
        return _CURRENT.set(self)

    @staticmethod
    def unbind(token: contextvars.Token[Context | None]) -> None:
        _CURRENT.reset(token)

    # -- writing --------------------------------------------------------------

    def _buffer(self, entry: port.JournalEntry, mark: port.Mark | None = None) -> None:
        self._pending = [e for e in self._pending if e.position != entry.position]
        self._pending.append(entry)
        if mark is not None:
            self._marks.append(mark)

    def _write(
        self,
        op: Callable[[port.Claim, list[port.JournalEntry], list[port.Mark]], Any],
        entry: port.JournalEntry,
        marks: list[port.Mark],
    ) -> Any:
        """Write buffered entries plus ``entry`` through a fenced store operation.

        When the run's cancel refuses the write, an outcome that already
        happened (``entry`` is not a ``started`` one) is still recorded before
        the workflow is told; an effect that was about to start is not.
        """
        self._buffer(entry)
        entries, buffered = self.take_pending()
        try:
            result = self._guarded(lambda: op(self._runtime.claim, entries, [*buffered, *marks]))
        except errors.Canceled:
            if self._runtime.claim.canceling:
                raise
            self._runtime.acknowledge_cancel()
            if entry.status == "started" and not _retry_due(entry):
                # The effect was about to start: it did not, so nothing is recorded.
                self.restore([e for e in entries if e.position != entry.position], buffered)
                raise
            self._guarded(lambda: op(self._runtime.claim, entries, [*buffered, *marks]))
            self.written(entries)
            raise
        self.written(entries)
        return result

    def _guarded(self, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except (errors.Interrupt, errors.CorruptState, errors.NonDeterminism):
            raise
        except errors.PerdureError as exc:
            if isinstance(exc, errors.StoreError):
                raise Halt("fault", _error_dict(exc.code, str(exc))) from exc
            raise
        except Exception as exc:
            raise Halt("fault", _error_dict("store_error", f"{type(exc).__name__}: {exc}")) from exc

    def _check(self) -> None:
        try:
            self._runtime.check()
        except errors.Canceled:
            if self._runtime.claim.canceling:
                return
            self._runtime.acknowledge_cancel()
            raise

    def _next(self, call: replay.Call) -> port.JournalEntry | None:
        self._check()
        try:
            return self._cursor.next(call)
        except errors.NonDeterminism as exc:
            raise Halt("needs_attention", _error_dict(exc.code, str(exc))) from exc

    def _read(self, entry: port.JournalEntry, reader: Callable[[Any], Any]) -> Any:
        """Read a recorded entry's output; a shape this code never writes is corruption."""
        try:
            return reader(codec.decode(entry.output or "null"))
        except (errors.InvalidPayload, ValueError, TypeError, KeyError, AttributeError) as exc:
            raise Halt(
                "needs_attention",
                _error_dict(
                    "corrupt_state",
                    f"run {self.run_id} position {entry.position}: unreadable {entry.kind} "
                    f"entry ({exc})",
                    invariant="journal_output_shape",
                ),
            ) from exc

    def _pause(self, seconds: float) -> None:
        try:
            self._runtime.pause(seconds)
        except errors.Canceled:
            if not self._runtime.claim.canceling:
                self._runtime.acknowledge_cancel()
            raise

    def _store_now(self) -> datetime:
        now: datetime = self._guarded(self._store.now)
        return now

    # -- logical time ---------------------------------------------------------

    def _recorded_value(self, kind: str, make: Callable[[], Any]) -> Any:
        entry = self._next(replay.Call(kind, kind))
        if entry is not None:
            return self._read(entry, lambda value: value)
        value = make()
        self._buffer(
            port.JournalEntry(self._cursor.position, kind, kind, "ok", codec.encode(value))
        )
        return value

    def now(self) -> datetime:
        """Return the current time as first seen by this run at this point (aware UTC)."""
        text = self._recorded_value("now", lambda: self._store_now().isoformat())
        return _instant(text)

    def random(self) -> float:
        """Return a random float in [0, 1), the same on every replay."""
        return float(self._recorded_value("random", _random.random))

    def uuid(self) -> _uuid.UUID:
        """Return a random UUID, the same on every replay."""
        return _uuid.UUID(self._recorded_value("uuid", lambda: str(_uuid.uuid4())))

    # -- sleeping and waiting -------------------------------------------------

    def sleep(self, duration: timedelta | float) -> None:
        """Pause the run durably until ``duration`` after this call was first reached."""
        delta = _as_delta(duration)
        key = self._cursor.step_key("sleep")
        entry = self._next(replay.Call("sleep", key))
        if entry is None:
            until = self._store_now() + delta
            entry = port.JournalEntry(
                self._cursor.position, "sleep", key, "ok", codec.encode(until.isoformat())
            )
            self._buffer(entry)
        due: datetime = self._read(entry, _instant)
        if self._store_now() < due:
            raise Parked([], due)

    def _open_entry(
        self,
        kind: str,
        name: str,
        timeout: timedelta | float | None,
        extra: dict[str, Any] | None = None,
    ) -> tuple[port.JournalEntry | None, datetime | None]:
        """Return the settled entry, or None and the journaled deadline of an open one."""
        entry = self._next(replay.Call(kind, name))
        if entry is not None and entry.status != "started":
            return entry, None
        if entry is None:
            deadline = None if timeout is None else self._store_now() + _as_delta(timeout)
            body = {"deadline": deadline.isoformat() if deadline else None, **(extra or {})}
            entry = port.JournalEntry(
                self._cursor.position, kind, name, "started", codec.encode(body)
            )
            self._buffer(entry)
        due: datetime | None = self._read(
            entry, lambda body: None if body["deadline"] is None else _instant(body["deadline"])
        )
        return None, due

    def _outcome(self, name: str) -> port.Outcome | None:
        found = self._outcomes.get(name)
        if found is None:
            self._outcomes = {
                o.name: o for o in self._guarded(lambda: self._store.outcomes(self.run_id))
            }
            found = self._outcomes.get(name)
        return found

    def wait(self, name: str, timeout: timedelta | float | None = None, *, type: Any = None) -> Any:
        """Pause until the signal ``name`` arrives and return its payload.

        Raises:
            errors.WaitTimedOut: the timeout won the race.
        """
        if not name or "/" in name or name.startswith("child:"):
            raise errors.InvalidInput(f"wait name {name!r} must be non-empty, without '/'")
        done, deadline = self._open_entry("wait", name, timeout)
        if done is None:
            outcome = self._outcome(name)
            if outcome is None and deadline is not None and self._store_now() >= deadline:
                outcome, _ = self._guarded(
                    lambda: self._store.settle_wait(
                        self.run_id,
                        name,
                        port.Outcome(
                            self.run_id, name, "timed_out", None, None, None, self._store_now()
                        ),
                    )
                )
            if outcome is None:
                raise Parked([port.WaitSpec(name, "signal", deadline)], None)
            done = self._apply_outcome(outcome)
        if done.status == "ok":
            return codec.convert(self._read(done, lambda body: body["payload"]), type)
        err = codec.decode(done.error or "{}")
        if err.get("code") == "canceled":
            self._runtime.acknowledge_cancel()
            raise errors.Canceled(self.run_id, "the wait was canceled")
        raise errors.WaitTimedOut(f"wait {name!r} timed out")

    def _apply_outcome(self, outcome: port.Outcome) -> port.JournalEntry:
        position = self._cursor.position
        mark = port.Mark("outcome_applied", outcome.name, outcome.payload_digest)
        if outcome.outcome == "signaled":
            payload = codec.decode(outcome.payload) if outcome.payload is not None else None
            # The receipt's fields are kept too: once the run ends and its
            # outcome record is gone, a sender's retry is answered from here.
            body = {
                "payload": payload,
                "signal_id": outcome.signal_id,
                "at": outcome.at.isoformat(),
                "digest": outcome.payload_digest,
            }
            entry = port.JournalEntry(position, "wait", outcome.name, "ok", codec.encode(body))
        else:
            code = "wait_timeout" if outcome.outcome == "timed_out" else "canceled"
            error = _error_dict(
                code,
                f"wait {outcome.name!r} {outcome.outcome}",
                outcome=outcome.outcome,
                at=outcome.at.isoformat(),
            )
            entry = port.JournalEntry(
                position, "wait", outcome.name, "error", error=codec.encode(error)
            )
        self._buffer(entry, mark)
        return entry

    def receive(
        self, channel: str, timeout: timedelta | float | None = None, *, type: Any = None
    ) -> records.Message:
        """Return the oldest message on ``channel`` this run has not consumed yet.

        Raises:
            errors.WaitTimedOut: no message arrived before the timeout.
        """
        if not channel:
            raise errors.InvalidInput("a channel name cannot be empty")
        after = self._consumed.get(channel, 0)
        done, deadline = self._open_entry("receive", channel, timeout)
        if done is None:
            message = self._guarded(lambda: self._store.next_message(self.run_id, channel, after))
            position = self._cursor.position
            if message is not None:
                body = {
                    "key": message.key,
                    "payload": codec.decode(message.payload),
                    "sequence": message.sequence,
                }
                done = port.JournalEntry(position, "receive", channel, "ok", codec.encode(body))
                self._buffer(
                    done, port.Mark("outcome_applied", channel, codec.digest(message.payload))
                )
            elif deadline is not None and self._store_now() >= deadline:
                error = _error_dict("wait_timeout", f"receive on {channel!r} timed out")
                done = port.JournalEntry(
                    position, "receive", channel, "error", error=codec.encode(error)
                )
                self._buffer(done)
            else:
                raise Parked([port.WaitSpec(channel, "channel", deadline, after)], None)
        if done.status != "ok":
            raise errors.WaitTimedOut(f"receive on {channel!r} timed out")
        key, payload, sequence = self._read(
            done, lambda b: (str(b["key"]), b["payload"], int(b["sequence"]))
        )
        self._consumed[channel] = sequence
        return records.Message(key, codec.convert(payload, type))

    # -- child runs -----------------------------------------------------------

    def start_child(
        self, workflow: Any, *args: Any, key: str | None = None, **kwargs: Any
    ) -> ChildHandle:
        """Start a child run once (per journal position, or per ``key``) and return its handle."""
        name, version, hint = self._runtime.workflow_ref(workflow)
        entry = self._next(replay.Call("child", name))
        if entry is None:
            # A caller's key is scoped to this parent, so two parents never
            # share a child.
            child_key = f"{self.run_id}/{key or self._cursor.position}"
            new = port.NewRun(
                run_id=_uuid.uuid4().hex,
                app=self._run.app,
                workflow=name,
                version=version,
                input=codec.encode({"args": list(args), "kwargs": kwargs}),
                key=child_key,
                parent_id=self.run_id,
            )
            child = self._guarded(lambda: self._store.create_children(self._runtime.claim, [new]))[
                0
            ]
            if child.run_id != new.run_id and not port.same_start(child, new):
                raise errors.KeyConflict(child_key, child, name)
            entry = port.JournalEntry(
                self._cursor.position, "child", name, "ok", codec.encode({"run_id": child.run_id})
            )
            self._buffer(entry)
        return ChildHandle(self._read(entry, lambda b: str(b["run_id"])), self, hint)

    def map(self, workflow: Any, items: Any) -> list[ChildHandle]:
        """Start one child run per item (``workflow(item)``) in a single store call.

        Each child takes one journal position, so a replayed fan-out creates
        nothing twice. Collect results with ``[h.result() for h in handles]``:
        the parent pauses on the first child still running.
        """
        name, version, hint = self._runtime.workflow_ref(workflow)
        items = list(items)
        handles: list[ChildHandle] = []
        fresh: list[tuple[int, port.NewRun]] = []
        for item in items:
            entry = self._next(replay.Call("child", name))
            if entry is not None:
                handles.append(
                    ChildHandle(self._read(entry, lambda b: str(b["run_id"])), self, hint)
                )
                continue
            position = self._cursor.position
            new = port.NewRun(
                run_id=_uuid.uuid4().hex,
                app=self._run.app,
                workflow=name,
                version=version,
                input=codec.encode({"args": [item], "kwargs": {}}),
                key=f"{self.run_id}/{position}",
                parent_id=self.run_id,
            )
            fresh.append((position, new))
            handles.append(ChildHandle(new.run_id, self, hint))
        if fresh:
            created = self._guarded(
                lambda: self._store.create_children(self._runtime.claim, [new for _, new in fresh])
            )
            by_key = {run.key: run.run_id for run in created}
            for (position, new), index in zip(fresh, range(len(fresh)), strict=True):
                run_id = by_key.get(new.key, new.run_id)
                self._buffer(
                    port.JournalEntry(
                        position, "child", name, "ok", codec.encode({"run_id": run_id})
                    )
                )
                handles[len(handles) - len(fresh) + index] = ChildHandle(run_id, self, hint)
        return handles

    def _child_result(self, child_id: str, hint: Any) -> Any:
        entry = self._next(replay.Call("child_result", child_id))
        if entry is None:
            outcome = self._outcome(f"child:{child_id}")
            if outcome is None:
                raise Parked([port.WaitSpec(f"child:{child_id}", "child")], None)
            ended = codec.decode(outcome.payload or "{}")
            position = self._cursor.position
            if ended.get("state") == "succeeded":
                entry = port.JournalEntry(
                    position, "child_result", child_id, "ok", codec.encode(ended.get("result"))
                )
            else:
                error = _error_dict(
                    "child_failed",
                    f"child run {child_id} ended {ended.get('state')}",
                    state=ended.get("state"),
                    child_error=ended.get("error"),
                )
                entry = port.JournalEntry(
                    position, "child_result", child_id, "error", error=codec.encode(error)
                )
            self._buffer(
                entry, port.Mark("outcome_applied", f"child:{child_id}", outcome.payload_digest)
            )
        if entry.status == "ok":
            return codec.convert(codec.decode(entry.output or "null"), hint)
        err = codec.decode(entry.error or "{}")
        raise errors.ChildFailed(child_id, str(err.get("state")), err.get("child_error"))

    # -- steps ----------------------------------------------------------------

    def step(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run ``fn`` as a journaled step (the explicit form of calling a step)."""
        fn = _unwrap(fn)
        call = _StepCall(self, fn)
        if call.replayed:
            return call.value
        with call.abandoned_on_cancel():
            while True:
                call.before()
                try:
                    with call.scope():
                        value = fn(*args, **kwargs)
                except Exception as exc:
                    self._pause(call.failed(exc))
                    continue
                return call.succeeded(value)

    async def astep(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run the ``async`` function ``fn`` as a journaled step."""
        fn = _unwrap(fn)
        call = _StepCall(self, fn)
        if call.replayed:
            return call.value
        with call.abandoned_on_cancel():
            while True:
                call.before()
                try:
                    with call.scope():
                        value = await fn(*args, **kwargs)
                except Exception as exc:
                    delay = call.failed(exc)
                    await asyncio.sleep(delay)
                    self._check()
                    continue
                return call.succeeded(value)

    def transaction(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run ``fn(connection, ...)`` inside the transaction that records its outcome."""
        fn = _unwrap(fn)
        call = _StepCall(self, fn)
        if call.replayed:
            return call.value
        with call.abandoned_on_cancel():
            return call.transact(lambda conn: fn(conn, *args, **kwargs))


class _StepCall:
    """One step call: replay it, or run its attempts and record the outcome."""

    def __init__(self, ctx: Context, fn: Callable[..., Any]) -> None:
        opts = effects.options_of(fn) or effects.StepOptions(name=getattr(fn, "__name__", "step"))
        self.ctx = ctx
        self.opts = opts
        self.hint = codec.return_hint(getattr(fn, "__wrapped__", fn))
        self.key = ctx._cursor.step_key(opts.name)
        self.attempt = 0
        self.value: Any = None
        entry = ctx._next(replay.Call("step", self.key))
        self.position = ctx._cursor.position
        if entry is not None and _retry_due(entry):
            # The last attempt certainly did not happen: carry on with the next.
            self.attempt = entry.attempt
            entry = None
        self.replayed = entry is not None
        if entry is not None:
            self.value = self._replay(entry)

    def _replay(self, entry: port.JournalEntry) -> Any:
        if entry.status == "ok":
            return codec.convert(codec.decode(entry.output or "null"), self.hint)
        if entry.status == "error":
            err = codec.decode(entry.error or "{}")
            raise errors.StepFailed(self.key, str(err.get("type")), str(err.get("message")))
        raise Halt(
            "needs_attention",
            _error_dict(
                "effect_outcome_unknown",
                f"step {self.key} started its effect (attempt {entry.attempt}) and its outcome "
                "was never recorded; resolve it with its real outcome",
                step=self.key,
                attempt=entry.attempt,
            ),
        )

    def before(self) -> None:
        self.attempt += 1
        if self.opts.effect == "once":
            entry = port.JournalEntry(
                self.position, "step", self.key, "started", attempt=self.attempt
            )
            self.ctx._write(
                self.ctx._store.begin_effect, entry, [port.Mark("effect_started", self.key)]
            )
            self.ctx.unsettled_effect = self.key
        else:
            self.ctx._check()

    @contextlib.contextmanager
    def abandoned_on_cancel(self) -> Iterator[None]:
        """Record the step as canceled if a cancel stops it before it has an outcome.

        Its position is taken; leaving it empty would make the next durable
        call (a clean-up step in a ``finally``) leave a gap in the journal.
        """
        try:
            yield
        except errors.Canceled:
            recorded = self.ctx._cursor.entries()
            # Never over an unsettled effect: only an empty position, or one
            # whose last attempt certainly did not happen.
            if len(recorded) < self.position or _retry_due(recorded[self.position - 1]):
                error = {
                    "code": "canceled",
                    "type": "Canceled",
                    "message": "the run was canceled before this step finished",
                }
                entry = port.JournalEntry(
                    self.position,
                    "step",
                    self.key,
                    "error",
                    error=codec.encode(error),
                    attempt=max(1, self.attempt),
                )
                self.ctx._write(
                    self.ctx._store.finish_step, entry, [port.Mark("step_failed", self.key)]
                )
            raise

    @contextlib.contextmanager
    def scope(self) -> Iterator[None]:
        token = _STEP_KEY.set(effects.idempotency_key(self.ctx.run_id, self.key))
        try:
            yield
        finally:
            _STEP_KEY.reset(token)

    def succeeded(self, value: Any) -> Any:
        try:
            text = codec.encode(value)
        except errors.InvalidPayload as exc:
            self.failed(exc, final=True)
            raise  # failed() always raises here
        entry = port.JournalEntry(self.position, "step", self.key, "ok", text, attempt=self.attempt)
        marks = [port.Mark("step_completed", self.key, codec.digest(text))]
        if self.opts.effect != "once":
            marks.insert(0, port.Mark("step_started", self.key))
        self.ctx._write(self.ctx._store.finish_step, entry, marks)
        return codec.convert(codec.decode(text), self.hint)

    def failed(self, exc: Exception, *, final: bool = False) -> float:
        """Return the pause before the next attempt, or raise what the workflow sees."""
        once = self.opts.effect == "once"
        if once and not isinstance(exc, errors.EffectFailed):
            raise Halt(
                "needs_attention",
                _error_dict(
                    "effect_outcome_unknown",
                    f"step {self.key} started its effect (attempt {self.attempt}) and then "
                    f"{type(exc).__name__}: {exc}; its outcome is not recorded",
                    step=self.key,
                    attempt=self.attempt,
                ),
            ) from exc
        if not final and self.opts.retry.should_retry(self.attempt, exc):
            if once:
                # Record that this attempt did not happen, so that a stop or a
                # lost lease during the pause is not mistaken for an ambiguity.
                error = {"code": "effect_failed", "type": type(exc).__name__, "message": str(exc)}
                retry = port.JournalEntry(
                    self.position,
                    "step",
                    self.key,
                    "started",
                    error=codec.encode(error),
                    attempt=self.attempt,
                )
                self.ctx.unsettled_effect = None
                self.ctx._write(
                    self.ctx._store.finish_step, retry, [port.Mark("step_failed", self.key)]
                )
            return self.opts.retry.delay(self.attempt)
        error = {"type": type(exc).__name__, "message": str(exc), "code": "step_failed"}
        entry = port.JournalEntry(
            self.position,
            "step",
            self.key,
            "error",
            error=codec.encode(error),
            attempt=self.attempt,
        )
        marks = [port.Mark("step_failed", self.key)]
        if not once:
            marks.insert(0, port.Mark("step_started", self.key))
        self.ctx._write(self.ctx._store.finish_step, entry, marks)
        raise errors.StepFailed(self.key, type(exc).__name__, str(exc)) from exc

    def transact(self, body: Callable[[Any], Any]) -> Any:
        self.attempt = 1
        self.ctx._check()
        holder: dict[str, Any] = {}

        def run(conn: Any) -> port.JournalEntry:
            try:
                text = codec.encode(body(conn))
            except Exception as exc:
                holder["raised"] = exc  # the step's own failure, not the store's
                raise
            holder["text"] = text
            return port.JournalEntry(self.position, "step", self.key, "ok", text)

        marks = [port.Mark("step_started", self.key), port.Mark("step_completed", self.key)]
        entries, buffered = self.ctx.take_pending()
        try:
            self.ctx._guarded(
                lambda: self.ctx._store.transaction_step(
                    self.ctx._runtime.claim, entries, run, [*buffered, *marks]
                )
            )
        except BaseException:
            self.ctx.restore(entries, buffered)
            exc = holder.get("raised")
            if exc is None:
                raise
            # The body's writes were rolled back with the transaction.
            error = {"type": type(exc).__name__, "message": str(exc), "code": "step_failed"}
            failed = port.JournalEntry(
                self.position, "step", self.key, "error", error=codec.encode(error)
            )
            self.ctx._write(
                self.ctx._store.finish_step, failed, [port.Mark("step_failed", self.key)]
            )
            raise errors.StepFailed(self.key, type(exc).__name__, str(exc)) from exc
        self.ctx.written(
            [*entries, port.JournalEntry(self.position, "step", self.key, "ok", holder["text"])]
        )
        return codec.convert(codec.decode(holder["text"]), self.hint)


def _retry_due(entry: port.JournalEntry) -> bool:
    """Whether a ``started`` entry records an attempt whose effect certainly failed."""
    if entry.status != "started" or entry.error is None:
        return False
    error = codec.decode(entry.error)
    return isinstance(error, dict) and error.get("code") == "effect_failed"


def unsettled(entry: port.JournalEntry) -> bool:
    """Whether the entry is a ``once`` effect that may have escaped without a record."""
    return entry.kind == "step" and entry.status == "started" and not _retry_due(entry)


def _instant(value: Any) -> datetime:
    """Read a journaled instant: ISO 8601 text with a time zone."""
    when = datetime.fromisoformat(value)
    if when.tzinfo is None:
        raise ValueError(f"{value!r} has no time zone")
    return when
