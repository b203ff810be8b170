"""Talking to the outside world from workflow code: updates, events and streams.

:class:`LiveContext` is a part of :class:`perdure.Context` (a base class of
it): ``ctx.next_update`` and ``ctx.respond`` answer a sender waiting on an
update; ``ctx.set_event``, ``ctx.write_stream`` and ``ctx.close_stream``
write entries that outside readers follow. Their journal bodies are in
:mod:`perdure.live`, and the client's side of them in :mod:`perdure.liveclient`.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from perdure import codec, errors, journal, live, records, replay, runtime, steps


@dataclass
class LiveState:
    """What one pass over the code has done so far with updates and streams."""

    updates: dict[str, int] = field(default_factory=dict)  # name -> last sequence consumed
    answered: set[str] = field(default_factory=set)
    closed: set[str] = field(default_factory=set)


class LiveContext(abc.ABC):
    """The live-run calls of a Context."""

    # What the Context supplies.
    run_id: str
    _runtime: runtime.Runtime
    _cursor: replay.JournalCursor
    _live: LiveState

    @abc.abstractmethod
    def _next(self, call: replay.Call) -> journal.Entry | None:
        """Take the next journal position for ``call``; return what it recorded, if anything."""

    @abc.abstractmethod
    def _read(self, entry: journal.Entry, reader: Callable[[str | None], Any]) -> Any:
        """Read a recorded entry's body."""

    @abc.abstractmethod
    def _opened(self, value: Any) -> Any:
        """Return the payload a recorded value holds."""

    @abc.abstractmethod
    def _hold(self, waits: list[journal.WaitSpec], wake_at: datetime | None) -> None:
        """Park; return only if the run may look at its wait again, in place."""

    @abc.abstractmethod
    def _open(
        self, kind: str, name: str, timeout: timedelta | float | None
    ) -> tuple[journal.Entry | None, datetime | None]:
        """Return the settled entry, or None and the journaled deadline of an open one."""

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
