"""The body of every journal entry kind: one typed record, one encoder, one decoder.

An entry's ``output`` (status ``ok`` or ``started``) or ``error`` (status
``error``, or a ``started`` step whose attempt certainly failed) holds its
body as JSON text. Everything that writes or reads a body goes through the
records below, so the engine, the client, forks and validation agree on one
shape::

    kind          status    column   body
    step          ok        output   Value          the step's result
                            error    Attempts       {attempts} when earlier attempts failed, or none
    step          error     error    StepError      {type, message, code, attempts}
    step          started   error    AttemptFailed  {code: effect_failed, type, message, attempts}
                                     or Attempts    {attempts} (a later attempt in flight) or none
    sleep         ok        output   Instant        the wake-up instant, ISO 8601 text
    now           ok        output   Instant        the instant first read
    random        ok        output   Random         a float in [0, 1)
    uuid          ok        output   Uuid           the UUID's text
    wait          started   output   Opened         {deadline}
    wait          ok        output   Signaled       {payload, signal_id, at, digest}
    wait          error     error    WaitEnded      {code, message, outcome, at}
    receive       started   output   Opened         {deadline}
    receive       ok        output   Received       {key, payload, sequence}
    receive       error     error    ReceiveTimedOut {code, message}
    child         ok        output   ChildStarted   {run_id}
    child_result  ok        output   Value          the child's result
    child_result  error     error    ChildEnded     {code, message, state, child_error}
    patch         ok        output   Value          true: the run took the patched path
    first         started   output   FirstOpened    {deadlines, timeout}
    first         ok        output   FirstFired     {index, kind, name, value}
    first         error     error    FirstEnded     {code, message, index, name}

The kinds of talking to live runs (``update``, ``respond``, ``event``,
``stream``, ``stream_close``) have their bodies in :mod:`perdure.live`.

``attempts`` lists the step's failed attempts so far, oldest first, each a
:class:`FailedAttempt` ``{attempt, code, type, message, traceback, duration}``;
journals written before it was kept have none, read as an empty list.

A decoder refuses a body of another shape with :class:`Unreadable` (a
``ValueError``; text that is not JSON raises ``errors.InvalidPayload``, also
one): the caller decides whether that is corruption or an older shape.

The store's records that the engine layers above speak (entries, marks,
outcomes, messages, waits) are named here too, so that the context and the
step machinery never import the store.
"""

from __future__ import annotations

import os
import traceback
import uuid as _uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeAlias

from perdure import codec
from perdure.store import port

Entry: TypeAlias = port.JournalEntry
EntryStatus: TypeAlias = port.EntryStatus
Mark: TypeAlias = port.Mark
Outcome: TypeAlias = port.Outcome
Message: TypeAlias = port.Message
WaitSpec: TypeAlias = port.WaitSpec


class Unreadable(ValueError):
    """A journal body that is not of the shape its kind is written in."""


def _object(text: str | None) -> dict[str, Any]:
    data = codec.decode(text or "null")
    if not isinstance(data, dict):
        raise Unreadable(f"expected an object, found {type(data).__name__}")
    return data


def _field(data: dict[str, Any], name: str) -> Any:
    try:
        return data[name]
    except KeyError:
        raise Unreadable(f"no {name!r}") from None


def _text(value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise Unreadable(f"{name!r} is not text")
    return value


def _optional_text(value: Any, name: str) -> str | None:
    return None if value is None else _text(value, name)


def instant(value: Any) -> datetime:
    """Read a journaled instant: ISO 8601 text with a time zone."""
    try:
        when = datetime.fromisoformat(_text(value, "instant"))
    except ValueError as exc:
        raise Unreadable(str(exc)) from exc
    if when.tzinfo is None:
        raise Unreadable(f"{value!r} has no time zone")
    return when


def _optional_instant(value: Any) -> datetime | None:
    return None if value is None else instant(value)


# -- values ----------------------------------------------------------------------


@dataclass(frozen=True)
class Value:
    """A recorded value as it decodes from JSON: a step's or a child's result."""

    value: Any

    def encode(self) -> str:
        return codec.encode(self.value)

    @classmethod
    def decode(cls, text: str | None) -> Value:
        return cls(codec.decode(text or "null"))


@dataclass(frozen=True)
class Instant:
    """A journaled instant (``sleep``'s wake-up, ``now``'s reading), aware."""

    value: datetime

    def encode(self) -> str:
        return codec.encode(self.value.isoformat())

    @classmethod
    def decode(cls, text: str | None) -> Instant:
        return cls(instant(codec.decode(text or "null")))


@dataclass(frozen=True)
class Random:
    """A ``random`` entry: the float first drawn."""

    value: float

    def encode(self) -> str:
        return codec.encode(self.value)

    @classmethod
    def decode(cls, text: str | None) -> Random:
        value = codec.decode(text or "null")
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise Unreadable("a random value is not a number")
        return cls(float(value))


@dataclass(frozen=True)
class Uuid:
    """A ``uuid`` entry: the UUID first drawn."""

    value: _uuid.UUID

    def encode(self) -> str:
        return codec.encode(str(self.value))

    @classmethod
    def decode(cls, text: str | None) -> Uuid:
        return cls(_uuid.UUID(_text(codec.decode(text or "null"), "uuid")))


# -- steps -----------------------------------------------------------------------

# A failed attempt's record is bounded, so a step that fails with a huge
# message or a deep stack cannot bloat its journal entry.
MESSAGE_LIMIT = 1000
_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep
TRACEBACK_LIMIT = 2000
TRACEBACK_FRAMES = 6


def _bounded(text: str, limit: int, *, keep_tail: bool = False) -> str:
    if len(text) <= limit:
        return text
    return "..." + text[-(limit - 3) :] if keep_tail else text[: limit - 3] + "..."


def traceback_summary(exc: BaseException) -> str:
    """Return the innermost frames of ``exc``'s traceback and its last line, bounded."""
    every = traceback.extract_tb(exc.__traceback__)
    # The engine's own frames (the attempt loop, step wrappers) say nothing
    # about the failure; they are kept only when nothing else is left.
    theirs = [f for f in every if not f.filename.startswith(_PACKAGE)] or every
    frames = theirs[-TRACEBACK_FRAMES:]
    # Each line is bounded too, so a huge message cannot push the frames out.
    lines = [_bounded(f"{f.filename}:{f.lineno} in {f.name}", 200, keep_tail=True) for f in frames]
    lines.append(_bounded(traceback.format_exception_only(exc)[-1].strip(), 500))
    return _bounded("\n".join(lines), TRACEBACK_LIMIT, keep_tail=True)


@dataclass(frozen=True)
class FailedAttempt:
    """One attempt of a step that raised: what it raised, where, and how long it ran."""

    attempt: int
    code: str
    type: str
    message: str
    traceback: str | None = None
    duration: float | None = None

    @classmethod
    def of(cls, attempt: int, exc: BaseException, duration: float | None) -> FailedAttempt:
        code = getattr(exc, "code", None)
        return cls(
            attempt,
            code if isinstance(code, str) else "step_failed",
            type(exc).__name__,
            _bounded(str(exc), MESSAGE_LIMIT),
            traceback_summary(exc),
            None if duration is None else round(duration, 6),
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "attempt": self.attempt,
            "code": self.code,
            "type": self.type,
            "message": self.message,
            "traceback": self.traceback,
            "duration": self.duration,
        }

    @classmethod
    def read(cls, data: Any) -> FailedAttempt:
        if not isinstance(data, dict):
            raise Unreadable("a failed attempt is not an object")
        attempt = _field(data, "attempt")
        if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 1:
            raise Unreadable("a failed attempt's 'attempt' is not a positive integer")
        duration = data.get("duration")
        if duration is not None and (
            isinstance(duration, bool) or not isinstance(duration, int | float) or duration < 0
        ):
            raise Unreadable("a failed attempt's 'duration' is not a non-negative number")
        return cls(
            attempt,
            _text(_field(data, "code"), "code"),
            _text(_field(data, "type"), "type"),
            _text(_field(data, "message"), "message"),
            _optional_text(data.get("traceback"), "traceback"),
            None if duration is None else float(duration),
        )


def _attempts(data: dict[str, Any]) -> tuple[FailedAttempt, ...]:
    found = data.get("attempts", [])
    if not isinstance(found, list):
        raise Unreadable("'attempts' is not a list")
    return tuple(FailedAttempt.read(item) for item in found)


def _attempts_list(attempts: tuple[FailedAttempt, ...]) -> list[dict[str, Any]]:
    return [a.as_dict() for a in attempts]


@dataclass(frozen=True)
class Attempts:
    """The failed attempts before a step's recorded outcome, or before the one in flight."""

    attempts: tuple[FailedAttempt, ...]

    def encode(self) -> str | None:
        """Return the body, or None when no attempt failed (the column stays empty)."""
        if not self.attempts:
            return None
        return codec.encode({"attempts": _attempts_list(self.attempts)})

    @classmethod
    def decode(cls, text: str | None) -> Attempts:
        return cls(_attempts(_object(text)) if text is not None else ())


@dataclass(frozen=True)
class StepError:
    """The error of a step that failed for good (or was canceled before its outcome).

    ``attempts`` holds every failed attempt, the last one included.
    """

    type: str
    message: str
    code: str = "step_failed"
    attempts: tuple[FailedAttempt, ...] = ()

    def encode(self) -> str:
        body: dict[str, Any] = {"type": self.type, "message": self.message, "code": self.code}
        if self.attempts:
            body["attempts"] = _attempts_list(self.attempts)
        return codec.encode(body)

    @classmethod
    def decode(cls, text: str | None) -> StepError:
        data = _object(text)
        return cls(
            str(data.get("type")), str(data.get("message")), str(data.get("code")), _attempts(data)
        )


@dataclass(frozen=True)
class AttemptFailed:
    """The error of a ``started`` step whose last attempt certainly did not happen.

    The attempt raised (for a ``once`` step: ``EffectFailed``) and a retry is
    due: the position is not an unsettled effect. ``attempts`` holds every
    failed attempt so far, this one included.
    """

    type: str
    message: str
    attempts: tuple[FailedAttempt, ...] = ()
    # Set when the backoff parks the run: the next attempt is not due before it.
    retry_at: datetime | None = None

    def encode(self) -> str:
        body: dict[str, Any] = {"code": "effect_failed", "type": self.type, "message": self.message}
        if self.attempts:
            body["attempts"] = _attempts_list(self.attempts)
        if self.retry_at is not None:
            body["retry_at"] = self.retry_at.isoformat()
        return codec.encode(body)

    @classmethod
    def decode(cls, text: str | None) -> AttemptFailed | None:
        """Return the failed attempt, or None for an error of another kind.

        Raises:
            ValueError: ``retry_at`` is not an aware instant.
        """
        data = codec.decode(text or "null")
        if not isinstance(data, dict) or data.get("code") != "effect_failed":
            return None
        due = data.get("retry_at")
        return cls(
            str(data.get("type")),
            str(data.get("message")),
            _attempts(data),
            None if due is None else instant(due),
        )


def failed_attempts(entry: Entry) -> tuple[FailedAttempt, ...]:
    """Return a ``step`` entry's failed attempts, oldest first (none for other kinds).

    An entry written before attempts were kept yields its one known failure
    (a retry-due attempt, or a step's final error), without traceback or
    duration.

    Raises:
        Unreadable: the body is not of the shape this code writes.
    """
    if entry.kind != "step" or entry.error is None:
        return ()
    data = _object(entry.error)
    found = _attempts(data)
    if found:
        return found
    code, kind = data.get("code"), str(data.get("type"))
    older = (entry.status == "started" and code == "effect_failed") or (
        entry.status == "error" and code == "step_failed" and kind != "Resolved"
    )
    if older:
        return (FailedAttempt(entry.attempt, str(code), kind, str(data.get("message"))),)
    return ()


def retry_due(entry: Entry) -> bool:
    """Whether a ``started`` entry records an attempt whose effect certainly failed."""
    if entry.status != "started" or entry.error is None:
        return False
    # Only the code decides; the attempts it keeps are read (and checked) apart.
    data = codec.decode(entry.error)
    return isinstance(data, dict) and data.get("code") == "effect_failed"


def unsettled(entry: Entry) -> bool:
    """Whether the entry is a ``once`` effect that may have escaped without a record."""
    return entry.kind == "step" and entry.status == "started" and not retry_due(entry)


# -- waits and receives ----------------------------------------------------------


@dataclass(frozen=True)
class Opened:
    """A ``wait`` or ``receive`` reached and not settled yet: its journaled deadline."""

    deadline: datetime | None

    def encode(self) -> str:
        return codec.encode({"deadline": self.deadline.isoformat() if self.deadline else None})

    @classmethod
    def decode(cls, text: str | None) -> Opened:
        return cls(_optional_instant(_field(_object(text), "deadline")))


@dataclass(frozen=True)
class Signaled:
    """A wait a signal settled: its payload and the receipt's fields.

    The receipt is kept so that a sender's retry is answered from the journal
    once the run has ended and its outcome record is gone.
    """

    payload: Any
    signal_id: str | None
    at: datetime
    digest: str | None

    @classmethod
    def of(cls, outcome: Outcome) -> Signaled:
        payload = codec.decode(outcome.payload) if outcome.payload is not None else None
        return cls(payload, outcome.signal_id, outcome.at, outcome.payload_digest)

    def encode(self) -> str:
        return codec.encode(
            {
                "payload": self.payload,
                "signal_id": self.signal_id,
                "at": self.at.isoformat(),
                "digest": self.digest,
            },
            envelope=1,
        )

    @classmethod
    def decode(cls, text: str | None) -> Signaled:
        data = _object(text)
        return cls(
            _field(data, "payload"),
            _optional_text(data.get("signal_id"), "signal_id"),
            instant(_field(data, "at")),
            _optional_text(data.get("digest"), "digest"),
        )


@dataclass(frozen=True)
class WaitEnded:
    """A wait a timeout or a cancel settled."""

    code: str
    message: str
    outcome: str
    at: datetime

    @classmethod
    def of(cls, outcome: Outcome) -> WaitEnded:
        code = "wait_timeout" if outcome.outcome == "timed_out" else "canceled"
        return cls(code, f"wait {outcome.name!r} {outcome.outcome}", outcome.outcome, outcome.at)

    def encode(self) -> str:
        return codec.encode(
            {
                "code": self.code,
                "message": self.message,
                "outcome": self.outcome,
                "at": self.at.isoformat(),
            }
        )

    @classmethod
    def decode(cls, text: str | None) -> WaitEnded:
        data = _object(text)
        return cls(
            str(data.get("code")),
            str(data.get("message")),
            str(data.get("outcome", "timed_out")),
            instant(_field(data, "at")),
        )


def settled_wait(position: int, outcome: Outcome) -> tuple[Entry, Mark]:
    """Return the entry that applies a wait's outcome record, and its receipt."""
    mark = Mark("outcome_applied", outcome.name, outcome.payload_digest)
    if outcome.outcome == "signaled":
        entry = Entry(position, "wait", outcome.name, "ok", Signaled.of(outcome).encode())
    else:
        entry = Entry(position, "wait", outcome.name, "error", error=WaitEnded.of(outcome).encode())
    return entry, mark


@dataclass(frozen=True)
class Received:
    """A channel message a ``receive`` consumed."""

    key: str
    payload: Any
    sequence: int

    @classmethod
    def of(cls, message: Message) -> Received:
        return cls(message.key, codec.decode(message.payload), message.sequence)

    def encode(self) -> str:
        body = {"key": self.key, "payload": self.payload, "sequence": self.sequence}
        return codec.encode(body, envelope=1)

    @classmethod
    def decode(cls, text: str | None) -> Received:
        data = _object(text)
        sequence = _field(data, "sequence")
        if isinstance(sequence, bool) or not isinstance(sequence, int):
            raise Unreadable("'sequence' is not an integer")
        return cls(str(_field(data, "key")), _field(data, "payload"), sequence)


@dataclass(frozen=True)
class ReceiveTimedOut:
    """A ``receive`` whose deadline passed with no message."""

    code: str
    message: str

    @classmethod
    def on(cls, channel: str) -> ReceiveTimedOut:
        return cls("wait_timeout", f"receive on {channel!r} timed out")

    def encode(self) -> str:
        return codec.encode({"code": self.code, "message": self.message})

    @classmethod
    def decode(cls, text: str | None) -> ReceiveTimedOut:
        data = _object(text)
        return cls(str(data.get("code")), str(data.get("message")))


# -- child runs ------------------------------------------------------------------


@dataclass(frozen=True)
class ChildStarted:
    """A child run this run started at the position."""

    run_id: str

    def encode(self) -> str:
        return codec.encode({"run_id": self.run_id})

    @classmethod
    def decode(cls, text: str | None) -> ChildStarted:
        return cls(_text(_field(_object(text), "run_id"), "run_id"))


@dataclass(frozen=True)
class ChildOutcome:
    """The outcome record a child's end leaves for its parent (written by the store)."""

    state: str | None
    result: Any
    error: Any

    @classmethod
    def decode(cls, text: str | None) -> ChildOutcome:
        data = _object(text or "{}")
        state = data.get("state")
        return cls(None if state is None else str(state), data.get("result"), data.get("error"))


@dataclass(frozen=True)
class ChildEnded:
    """A child that did not succeed, as its parent recorded it."""

    code: str
    message: str
    state: str | None
    child_error: Any

    @classmethod
    def of(cls, child_id: str, outcome: ChildOutcome) -> ChildEnded:
        return cls(
            "child_failed",
            f"child run {child_id} ended {outcome.state}",
            outcome.state,
            outcome.error,
        )

    def encode(self) -> str:
        return codec.encode(
            {
                "code": self.code,
                "message": self.message,
                "state": self.state,
                "child_error": self.child_error,
            },
            envelope=1,
        )

    @classmethod
    def decode(cls, text: str | None) -> ChildEnded:
        data = _object(text)
        state = data.get("state")
        return cls(
            str(data.get("code")),
            str(data.get("message")),
            None if state is None else str(state),
            data.get("child_error"),
        )


def child_result(position: int, child_id: str, outcome: Outcome) -> tuple[Entry, Mark]:
    """Return the entry that applies a child's outcome record, and its receipt."""
    ended = ChildOutcome.decode(outcome.payload)
    if ended.state == "succeeded":
        entry = Entry(position, "child_result", child_id, "ok", Value(ended.result).encode())
    else:
        body = ChildEnded.of(child_id, ended)
        entry = Entry(position, "child_result", child_id, "error", error=body.encode())
    return entry, Mark("outcome_applied", f"child:{child_id}", outcome.payload_digest)


# -- first (the durable select) ---------------------------------------------------
#
# A ``first`` entry's name lists its sources in argument order
# (``signal:exit|message:inbox|timer``), so replay refuses code that now
# selects over other sources.


@dataclass(frozen=True)
class FirstOpened:
    """A ``first`` reached before any source was ready: its deadlines, journaled once.

    ``deadlines`` has one item per source, the instant of a timer and None
    for every other kind; ``timeout`` is the instant of the call's own timeout.
    """

    deadlines: tuple[datetime | None, ...]
    timeout: datetime | None

    def encode(self) -> str:
        shown = [d.isoformat() if d else None for d in self.deadlines]
        timeout = self.timeout.isoformat() if self.timeout else None
        return codec.encode({"deadlines": shown, "timeout": timeout})

    @classmethod
    def decode(cls, text: str | None) -> FirstOpened:
        data = _object(text)
        found = _field(data, "deadlines")
        if not isinstance(found, list):
            raise Unreadable("'deadlines' is not a list")
        return cls(
            tuple(_optional_instant(d) for d in found), _optional_instant(data.get("timeout"))
        )


FIRST_KINDS = ("signal", "message", "update", "child", "timer")
"""The kinds of source a ``first`` selects over."""


def _index(data: dict[str, Any]) -> int:
    index = _field(data, "index")
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise Unreadable("'index' is not a non-negative integer")
    return index


@dataclass(frozen=True)
class FirstFired:
    """The source that won a ``first``, and what it delivered.

    ``index`` is the source's place in the call (from 0); ``name`` is the
    wait key of a signal (``exit``, ``exit#2``), a channel, an update's name,
    a child's run id, or None for a timer. ``value`` is the winner's own body,
    as the kind's single wait journals it: :class:`Signaled` fields,
    :class:`Received` fields, an update's ``{update_id, payload, sequence}``,
    a child's :class:`ChildOutcome` ``{state, result, error}``, or None.
    """

    index: int
    kind: str
    name: str | None
    value: Any

    def encode(self) -> str:
        body = {"index": self.index, "kind": self.kind, "name": self.name, "value": self.value}
        return codec.encode(body, envelope=2)

    @classmethod
    def decode(cls, text: str | None) -> FirstFired:
        data = _object(text)
        kind = _text(_field(data, "kind"), "kind")
        if kind not in FIRST_KINDS:
            raise Unreadable(f"unknown source kind {kind!r}")
        name = _optional_text(data.get("name"), "name")
        if (name is None) != (kind == "timer"):
            raise Unreadable(f"a {kind} source {'needs' if name is None else 'has no'} name")
        value = data.get("value")
        if kind != "timer" and not isinstance(value, dict):
            raise Unreadable(f"the value of a {kind} source is not an object")
        return cls(_index(data), kind, name, value)

    def signaled(self) -> Signaled:
        """Return the winning signal's body."""
        return Signaled.decode(codec.encode(self.value, envelope=2))

    def received(self) -> Received:
        """Return the winning message's body."""
        return Received.decode(codec.encode(self.value, envelope=2))

    def child(self) -> ChildOutcome:
        """Return the winning child's outcome."""
        return ChildOutcome.decode(codec.encode(self.value, envelope=2))


@dataclass(frozen=True)
class FirstEnded:
    """A ``first`` that no source won: its timeout passed, or a signal wait was canceled.

    ``code`` is ``wait_timeout`` or ``canceled``; a cancel names the signal
    source (``index``, and its wait key as ``name``) whose outcome it was.
    """

    code: str
    message: str
    index: int | None = None
    name: str | None = None

    def encode(self) -> str:
        body = {"code": self.code, "message": self.message, "index": self.index}
        return codec.encode({**body, "name": self.name})

    @classmethod
    def decode(cls, text: str | None) -> FirstEnded:
        data = _object(text)
        code = _text(_field(data, "code"), "code")
        if code not in ("wait_timeout", "canceled"):
            raise Unreadable(f"unknown end {code!r}")
        index = None if data.get("index") is None else _index(data)
        name = _optional_text(data.get("name"), "name")
        return cls(code, _text(_field(data, "message"), "message"), index, name)
