"""The calls that talk to live runs from outside: updates, events, streams, the run's view.

:class:`LiveCalls` is part of :class:`perdure.client.Client`: nothing here
needs the workflows' code (validators and queries do; the app runs them and
calls in here). A caller that waits (for an update's answer, an event, the
next stream item) is woken by the store's announcements (a socket on the
host for SQLite, ``LISTEN`` on PostgreSQL) and reads again; it also reads
again every few seconds, so an announcement lost with a dropped connection
costs a short delay, never a hang.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from perdure import codec, errors, live, payloads, validation
from perdure.store import liveport, port

_SLICE = 5.0
"""The longest a waiting caller sleeps between two reads, woken or not."""

_MISSING: Any = object()


def _deadline(timeout: float | None) -> float | None:
    if timeout is not None and timeout < 0:
        raise errors.InvalidInput(f"timeout must be at least 0, got {timeout}")
    return None if timeout is None else time.monotonic() + timeout


def _left(deadline: float | None) -> float:
    return _SLICE if deadline is None else min(_SLICE, deadline - time.monotonic())


def _check_name(what: str, name: str) -> None:
    codec.check_text(f"an {what}" if what[0] in "aeiou" else f"a {what}", name)
    if "/" in name:
        raise errors.InvalidInput(f"{what} {name!r} must be 1 to 512 characters, without '/'")


class LiveCalls:
    """Updates, events and streams of an app's runs (a part of the Client)."""

    store: port.Store
    app: str
    payload_limit: int
    payloads: payloads.Payloads
    # The Client supplies it: the app's run, or RunNotFound.
    _run: Callable[[str], port.Run]

    # -- updates --------------------------------------------------------------

    def update(
        self,
        run_id: str,
        name: str,
        payload: Any = None,
        update_id: str | None = None,
        timeout: float | None = None,
        *,
        validator: Callable[[Any], Any] | None = None,
    ) -> Any:
        """Send the update ``name`` to a live run and return the run's answer.

        The same ``update_id`` sent again, from any process, is applied once
        and answered with the stored response, also after the run has ended.
        ``validator`` (the workflow's, run by the app) sees the payload as the
        run would, before anything is stored; it is not run again for an
        ``update_id`` already stored.

        Raises:
            errors.UpdateRejected: the validator raised (nothing was stored).
            errors.UpdateAbandoned: the run ended without answering.
            errors.UpdateTimedOut: no answer within ``timeout`` seconds (it may come later).
            errors.RunFinished: the run had ended before the update arrived.
            errors.RunNotFound: no such run.
        """
        _check_name("update name", name)
        if update_id is not None:
            _check_name("update id", update_id)
        store = liveport.require(self.store)
        deadline = _deadline(timeout)
        if validator is not None:
            # An update_id already stored is answered from the store, and its
            # validator does not run again; a run that ended refuses the rest.
            run = self._run(run_id)
            if update_id is not None:
                stored = store.get_update(run_id, update_id)
                if stored is not None:
                    return self._answer(store, run_id, name, stored.update_id, deadline, timeout)
            if run.state in port.TERMINAL_STATES:
                raise errors.RunFinished(run_id, run.state)
        else:
            # The delivery finds the run itself (of this app, not past its
            # deadline), and a stored id, which spares a read before it.
            codec.check_text("a run id", run_id)
        plain = codec.check_size(codec.encode(payload), self.payload_limit, "the update's payload")
        if validator is not None:
            try:
                validator(codec.decode(plain))
            except Exception as exc:
                reason = str(exc) or type(exc).__name__
                raise errors.UpdateRejected(run_id, name, reason) from None
        text = self.payloads.seal_text(plain, "the update's payload")
        new = liveport.NewUpdate(run_id, update_id or uuid.uuid4().hex, name, text, self.app)
        # Watching from before the delivery, no answer can slip in unseen
        # between it and the first look at the update.
        with store.watch() as watch:
            delivered: liveport.UpdateRecord | None = None
            try:
                delivered, created = store.deliver_update(new)
            except (errors.RunFinished, liveport.Overdue) as exc:
                if isinstance(exc, liveport.Overdue):
                    # Settled as any reader of the run settles it; it has ended then.
                    ended = self._run(run_id).state
                    exc = errors.RunFinished(run_id, ended)
                # The run ended; a sender of this id before it may have got in.
                if update_id is None or store.get_update(run_id, update_id) is None:
                    raise exc from None
            else:
                if not created:
                    delivered = None  # stored before: read it afresh, it may be answered
            return self._await_answer(
                store, watch, run_id, name, new.update_id, deadline, timeout, delivered
            )

    def _answer(
        self,
        store: liveport.LiveStore,
        run_id: str,
        name: str,
        update_id: str,
        deadline: float | None,
        timeout: float | None,
    ) -> Any:
        """Wait for the stored update's answer (or its abandonment) and return it."""
        with store.watch() as watch:
            return self._await_answer(store, watch, run_id, name, update_id, deadline, timeout)

    def _await_answer(
        self,
        store: liveport.LiveStore,
        watch: liveport.Watch,
        run_id: str,
        name: str,
        update_id: str,
        deadline: float | None,
        timeout: float | None,
        delivered: liveport.UpdateRecord | None = None,
    ) -> Any:
        """Look at the update until it is answered or abandoned, woken by ``watch``.

        ``delivered`` is the record this call just stored under ``watch``,
        still pending: the first look need not read it again.
        """
        told = watch.answer if isinstance(watch, liveport.ToldAnswers) else None
        checked = False  # whether a record of the update showed its name
        while True:
            if checked and told is not None:
                # Heard with its announcement: the committed answer, not read back.
                response = told(run_id, update_id)
                if response is not None:
                    return self._response(run_id, response)
            found = delivered or store.get_update(run_id, update_id)
            delivered = None
            if found is None:
                raise errors.CorruptState(run_id, "update_state", f"update {update_id} is gone")
            if found.name != name:
                raise errors.InvalidInput(
                    f"update id {update_id!r} of run {run_id} was sent as {found.name!r}, "
                    f"not {name!r}"
                )
            checked = True
            if found.state == "answered":
                return self._response(run_id, found.response)
            if found.state == "abandoned":
                ended = self._run(run_id).state
                raise errors.UpdateAbandoned(run_id, update_id, ended)
            left = _left(deadline)
            if left <= 0:
                raise errors.UpdateTimedOut(
                    f"run {run_id} did not answer update {update_id!r} within {timeout}s"
                )
            watch.wait(left)

    def _response(self, run_id: str, response: str | None) -> Any:
        """The value of a stored response."""
        try:
            return self.payloads.open_text(response)
        except errors.PayloadUnreadable:
            raise
        except errors.InvalidPayload as exc:
            raise errors.CorruptState(run_id, "update_response", str(exc)) from exc

    # -- reading the journal --------------------------------------------------

    def view(self, run_id: str) -> live.RunView:
        """Return the run's :class:`~perdure.live.RunView`, read from its durable journal."""
        run = self._run(run_id)
        entries = self.store.journal(run_id)
        validation.journal(run_id, entries)
        return live.view(run_id, run.workflow, run.state, run.input, entries, self.payloads.open)

    def events(self, run_id: str) -> dict[str, Any]:
        """Return the run's events: the latest value of each key it set."""
        return self.view(run_id).events

    def get_event(self, run_id: str, key: str, timeout: float | None = None) -> Any:
        """Return the latest value of the run's event ``key``, waiting until it is set.

        ``timeout=0`` answers at once; ``None`` waits as long as the run lives.

        Raises:
            errors.RunEventMissing: the key was not set in time, or the run
                ended (or stopped in needs_attention) without setting it.
        """
        _check_name("event key", key)
        store = liveport.require(self.store)
        deadline = _deadline(timeout)
        self._run(run_id)
        value, position = _MISSING, 0
        with store.watch() as watch:
            while True:
                # The state is read before the journal: a run seen ended has
                # written all it ever will.
                state = self._run(run_id).state
                for entry in store.journal_after(run_id, position):
                    position = entry.position
                    if entry.kind == "event" and entry.name == key:
                        live.check(run_id, entry)
                        value = live.EventSet.decode(entry.output).value
                if value is not _MISSING:
                    return self.payloads.open(value)
                if state in port.TERMINAL_STATES:
                    raise errors.RunEventMissing(
                        f"run {run_id} is {state} and never set event {key!r}"
                    )
                left = _left(deadline)
                if left <= 0:
                    waited = "now" if timeout == 0 else f"within {timeout}s"
                    raise errors.RunEventMissing(f"run {run_id} has not set event {key!r} {waited}")
                watch.wait(left)

    def read_stream(self, run_id: str, key: str, after: int = 0) -> Iterator[Any]:
        """Yield the values of the run's stream ``key`` in order, after the first ``after``.

        Follows the stream as the run writes it, and stops once the stream is
        closed or the run has ended (or stopped in needs_attention) and every
        item written is yielded.
        """
        _check_name("stream key", key)
        if after < 0:
            raise errors.InvalidInput(f"after must be at least 0, got {after}")
        store = liveport.require(self.store)
        self._run(run_id)
        return self._follow(store, run_id, key, after)

    def _follow(
        self, store: liveport.LiveStore, run_id: str, key: str, after: int
    ) -> Iterator[Any]:
        seen, position = 0, 0
        with store.watch() as watch:
            while True:
                state = self._run(run_id).state
                for entry in store.journal_after(run_id, position):
                    position = entry.position
                    if entry.name != key or entry.kind not in ("stream", "stream_close"):
                        continue
                    live.check(run_id, entry)
                    if entry.kind == "stream_close":
                        return
                    seen += 1
                    if seen > after:
                        yield self.payloads.open(live.StreamItem.decode(entry.output).value)
                if state in port.TERMINAL_STATES:
                    return
                watch.wait(_SLICE)
