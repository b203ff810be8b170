"""Talking to live runs: the journal bodies of updates, events and streams, and RunView.

These entry kinds extend the table of :mod:`perdure.journal`::

    kind          status    column   body
    update        started   output   Opened          {deadline}
    update        ok        output   UpdateReceived  {update_id, payload, sequence}
    update        error     error    ReceiveTimedOut {code, message}
    respond       ok        output   Responded       {update_id, value}
    event         ok        output   EventSet        {value}
    stream        ok        output   StreamItem      {value}
    stream_close  ok        output   StreamClosed    {}

An ``update`` entry's name is the update's name, as is a ``respond``'s; an
``event``'s, a ``stream``'s and a ``stream_close``'s is the key. Everything
the outside world reads of a live run (events, stream items, the updates a
run consumed and what it answered, completed step outputs) is read from the
journal here, by :class:`RunView`, with no I/O: the same code serves queries,
``get_event``, ``events`` and ``read_stream``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from perdure import bodyshape, codec, errors, journal, payloads, records
from perdure.bodyshape import Unreadable

KINDS = frozenset({"update", "respond", "event", "stream", "stream_close"})
"""The journal entry kinds of this module."""


@dataclass(frozen=True)
class UpdateReceived:
    """An update a ``next_update`` consumed."""

    update_id: str
    payload: Any
    sequence: int

    def encode(self) -> str:
        return codec.encode(
            {"update_id": self.update_id, "payload": self.payload, "sequence": self.sequence},
            envelope=1,
        )

    @classmethod
    def decode(cls, text: str | None) -> UpdateReceived:
        data = bodyshape.read_object(text)
        update_id, sequence = bodyshape.field(data, "update_id"), bodyshape.field(data, "sequence")
        if not isinstance(update_id, str):
            raise Unreadable("'update_id' is not text")
        if isinstance(sequence, bool) or not isinstance(sequence, int) or sequence < 1:
            raise Unreadable("'sequence' is not a positive integer")
        return cls(update_id, bodyshape.field(data, "payload"), sequence)


@dataclass(frozen=True)
class Responded:
    """The answer a run gave to an update."""

    update_id: str
    value: Any

    def encode(self) -> str:
        return codec.encode({"update_id": self.update_id, "value": self.value}, envelope=1)

    @classmethod
    def decode(cls, text: str | None) -> Responded:
        data = bodyshape.read_object(text)
        update_id = bodyshape.field(data, "update_id")
        if not isinstance(update_id, str):
            raise Unreadable("'update_id' is not text")
        return cls(update_id, bodyshape.field(data, "value"))


@dataclass(frozen=True)
class EventSet:
    """A value a run set for an event key (the latest one per key is the event's value)."""

    value: Any

    def encode(self) -> str:
        return codec.encode({"value": self.value}, envelope=1)

    @classmethod
    def decode(cls, text: str | None) -> EventSet:
        return cls(bodyshape.field(bodyshape.read_object(text), "value"))


@dataclass(frozen=True)
class StreamItem:
    """One item a run appended to a stream."""

    value: Any

    def encode(self) -> str:
        return codec.encode({"value": self.value}, envelope=1)

    @classmethod
    def decode(cls, text: str | None) -> StreamItem:
        return cls(bodyshape.field(bodyshape.read_object(text), "value"))


@dataclass(frozen=True)
class StreamClosed:
    """A stream the run closed: no item follows."""

    def encode(self) -> str:
        return codec.encode({})

    @classmethod
    def decode(cls, text: str | None) -> StreamClosed:
        bodyshape.read_object(text)
        return cls()


_READERS: dict[tuple[str, str], Callable[[str | None], Any]] = {
    ("update", "started"): journal.Opened.decode,
    ("update", "ok"): UpdateReceived.decode,
    ("update", "error"): journal.ReceiveTimedOut.decode,
    ("respond", "ok"): Responded.decode,
    ("event", "ok"): EventSet.decode,
    ("stream", "ok"): StreamItem.decode,
    ("stream_close", "ok"): StreamClosed.decode,
}


def body(entry: journal.Entry) -> Any:
    """Return the typed body of an entry of this module's kinds.

    Raises:
        Unreadable: the entry's status or body is not one this code writes.
    """
    reader = _READERS.get((entry.kind, entry.status))
    if reader is None:
        raise Unreadable(f"a {entry.kind} entry is never {entry.status}")
    return reader(entry.error if entry.status == "error" else entry.output)


def check(run_id: str, entry: journal.Entry) -> None:
    """Refuse an entry of this module's kinds whose body this code cannot read.

    Raises:
        errors.CorruptState: invariant ``journal_body``.
    """
    try:
        body(entry)
    except ValueError as exc:
        raise errors.CorruptState(
            run_id, "journal_body", f"position {entry.position} ({entry.kind}): {exc}"
        ) from exc


# -- the view -------------------------------------------------------------------


@dataclass
class RunView:
    """A read-only picture of a run, rebuilt from its durable journal.

    What it shows is what the run has recorded so far: the updates it
    consumed (not those still waiting for it), the answers it gave, its
    events (latest value per key), its stream items, and the outputs of its
    completed steps (by step key: ``charge``, ``charge#2``).
    """

    run_id: str
    workflow: str
    state: str
    args: list[Any]
    kwargs: dict[str, Any]
    events: dict[str, Any] = field(default_factory=dict)
    streams: dict[str, list[Any]] = field(default_factory=dict)
    closed_streams: set[str] = field(default_factory=set)
    steps: dict[str, Any] = field(default_factory=dict)
    responses: dict[str, Any] = field(default_factory=dict)
    consumed: list[records.Update] = field(default_factory=list)

    @property
    def inputs(self) -> dict[str, Any]:
        """The run's inputs: ``{"args": [...], "kwargs": {...}}``."""
        return {"args": list(self.args), "kwargs": dict(self.kwargs)}

    @property
    def done(self) -> bool:
        """Whether the run has ended (a run in needs_attention may still go on)."""
        return self.state in ("succeeded", "failed", "canceled")

    def updates(self, name: str | None = None) -> list[records.Update]:
        """Return the updates the run consumed so far (of ``name``, or all), in order."""
        return [u for u in self.consumed if name is None or u.name == name]

    def response(self, update_id: str, default: Any = None) -> Any:
        """Return the run's answer to ``update_id``, or ``default`` if it gave none."""
        return self.responses.get(update_id, default)

    def event(self, key: str, default: Any = None) -> Any:
        """Return the latest value of event ``key``, or ``default``."""
        return self.events.get(key, default)

    def stream(self, key: str) -> list[Any]:
        """Return the items of stream ``key`` so far."""
        return list(self.streams.get(key, []))

    def step(self, key: str, default: Any = None) -> Any:
        """Return the output of the completed step ``key``, or ``default``."""
        return self.steps.get(key, default)


def _as_stored(value: Any) -> Any:
    return value


def view(
    run_id: str,
    workflow: str,
    state: str,
    inputs: str,
    entries: Sequence[journal.Entry],
    opener: Callable[[Any], Any] = _as_stored,
) -> RunView:
    """Build the :class:`RunView` of a run from its stored inputs and journal.

    ``opener`` opens each payload (the app's payload layer, when it seals them).

    Raises:
        errors.CorruptState: the inputs or an entry's body cannot be read.
    """
    try:
        data = opener(codec.decode(inputs))
    except errors.PayloadUnreadable:
        raise
    except errors.InvalidPayload as exc:
        raise errors.CorruptState(run_id, "run_input_json", str(exc)) from exc
    if payloads.sealed(data):
        # A reader without the codec: the inputs stay sealed, the rest is shown as stored.
        data = {"args": [], "kwargs": {}}
    if not isinstance(data, dict) or not isinstance(data.get("args"), list):
        raise errors.CorruptState(run_id, "run_input_shape", "expected {args, kwargs}")
    found = RunView(run_id, workflow, state, list(data["args"]), dict(data.get("kwargs") or {}))
    for entry in entries:
        if entry.kind == "step" and entry.status == "ok":
            found.steps[entry.name] = opener(_read(run_id, entry, journal.Value.decode).value)
        if entry.kind == "first" and entry.status == "ok":
            fired = _read(run_id, entry, journal.FirstFired.decode)
            if fired.kind == "update" and fired.name is not None:
                text = codec.encode(fired.value, envelope=2)
                won = _read(run_id, replace(entry, output=text), UpdateReceived.decode)
                found.consumed.append(
                    records.Update(won.update_id, fired.name, opener(won.payload))
                )
        if entry.kind not in KINDS:
            continue
        check(run_id, entry)
        part = body(entry)
        if isinstance(part, UpdateReceived):
            update = records.Update(part.update_id, entry.name, opener(part.payload))
            found.consumed.append(update)
        elif isinstance(part, Responded):
            found.responses[part.update_id] = opener(part.value)
        elif isinstance(part, EventSet):
            found.events[entry.name] = opener(part.value)
        elif isinstance(part, StreamItem):
            found.streams.setdefault(entry.name, []).append(opener(part.value))
        elif isinstance(part, StreamClosed):
            found.closed_streams.add(entry.name)
    return found


def _read(run_id: str, entry: journal.Entry, reader: Callable[[str | None], Any]) -> Any:
    try:
        return reader(entry.output)
    except ValueError as exc:
        raise errors.CorruptState(
            run_id, "journal_body", f"position {entry.position} ({entry.kind}): {exc}"
        ) from exc
