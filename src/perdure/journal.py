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

The ``step`` bodies, and the failed attempts they keep (``attempts``), are
in :mod:`perdure.attempts` and named here too.

A decoder refuses a body of another shape with :class:`Unreadable` (a
``ValueError``; text that is not JSON raises ``errors.InvalidPayload``, also
one): the caller decides whether that is corruption or an older shape. The
shape checks the decoders share are in :mod:`perdure.bodyshape`.

The store's records that the engine layers above speak (entries, marks,
outcomes, messages, waits) are named here too, so that the context and the
step machinery never import the store.
"""

from __future__ import annotations

import uuid as _uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeAlias

from perdure import attempts, bodyshape, codec
from perdure.store import port

Entry: TypeAlias = port.JournalEntry
EntryStatus: TypeAlias = port.EntryStatus
Mark: TypeAlias = port.Mark
Outcome: TypeAlias = port.Outcome
Message: TypeAlias = port.Message
WaitSpec: TypeAlias = port.WaitSpec

# The error every decoder raises (defined with the shape checks, bodyshape.py).
Unreadable = bodyshape.Unreadable

# A step's bodies and the failed attempts they keep (attempts.py), named here too.
FailedAttempt = attempts.FailedAttempt
Attempts = attempts.Attempts
StepError = attempts.StepError
AttemptFailed = attempts.AttemptFailed
failed_attempts = attempts.failed_attempts
retry_due = attempts.retry_due
unsettled = attempts.unsettled
MESSAGE_LIMIT = attempts.MESSAGE_LIMIT
TRACEBACK_LIMIT = attempts.TRACEBACK_LIMIT


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
        return cls(bodyshape.instant(codec.decode(text or "null")))


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
        return cls(_uuid.UUID(bodyshape.text(codec.decode(text or "null"), "uuid")))


# -- waits and receives ----------------------------------------------------------


@dataclass(frozen=True)
class Opened:
    """A ``wait`` or ``receive`` reached and not settled yet: its journaled deadline."""

    deadline: datetime | None

    def encode(self) -> str:
        return codec.encode({"deadline": self.deadline.isoformat() if self.deadline else None})

    @classmethod
    def decode(cls, text: str | None) -> Opened:
        deadline = bodyshape.field(bodyshape.read_object(text), "deadline")
        return cls(bodyshape.optional_instant(deadline))


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
        data = bodyshape.read_object(text)
        return cls(
            bodyshape.field(data, "payload"),
            bodyshape.optional_text(data.get("signal_id"), "signal_id"),
            bodyshape.instant(bodyshape.field(data, "at")),
            bodyshape.optional_text(data.get("digest"), "digest"),
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
        data = bodyshape.read_object(text)
        return cls(
            str(data.get("code")),
            str(data.get("message")),
            str(data.get("outcome", "timed_out")),
            bodyshape.instant(bodyshape.field(data, "at")),
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
        data = bodyshape.read_object(text)
        sequence = bodyshape.field(data, "sequence")
        if isinstance(sequence, bool) or not isinstance(sequence, int):
            raise Unreadable("'sequence' is not an integer")
        return cls(str(bodyshape.field(data, "key")), bodyshape.field(data, "payload"), sequence)


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
        data = bodyshape.read_object(text)
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
        return cls(bodyshape.text(bodyshape.field(bodyshape.read_object(text), "run_id"), "run_id"))


@dataclass(frozen=True)
class ChildOutcome:
    """The outcome record a child's end leaves for its parent (written by the store)."""

    state: str | None
    result: Any
    error: Any

    @classmethod
    def decode(cls, text: str | None) -> ChildOutcome:
        data = bodyshape.read_object(text or "{}")
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
        data = bodyshape.read_object(text)
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
        data = bodyshape.read_object(text)
        found = bodyshape.field(data, "deadlines")
        if not isinstance(found, list):
            raise Unreadable("'deadlines' is not a list")
        return cls(
            tuple(bodyshape.optional_instant(d) for d in found),
            bodyshape.optional_instant(data.get("timeout")),
        )


FIRST_KINDS = ("signal", "message", "update", "child", "timer")
"""The kinds of source a ``first`` selects over."""


def _index(data: dict[str, Any]) -> int:
    index = bodyshape.field(data, "index")
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
        data = bodyshape.read_object(text)
        kind = bodyshape.text(bodyshape.field(data, "kind"), "kind")
        if kind not in FIRST_KINDS:
            raise Unreadable(f"unknown source kind {kind!r}")
        name = bodyshape.optional_text(data.get("name"), "name")
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
        data = bodyshape.read_object(text)
        code = bodyshape.text(bodyshape.field(data, "code"), "code")
        if code not in ("wait_timeout", "canceled"):
            raise Unreadable(f"unknown end {code!r}")
        index = None if data.get("index") is None else _index(data)
        name = bodyshape.optional_text(data.get("name"), "name")
        return cls(code, bodyshape.text(bodyshape.field(data, "message"), "message"), index, name)
