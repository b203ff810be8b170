"""Watchers of live runs on PostgreSQL: one LISTEN connection per store object.

A background thread LISTENs on ``perdure_live`` and counts notifications
(and keeps the answers of updates heard on ``perdure_answer``, for their
senders);
each watcher remembers the count it last saw and waits on a condition until
the count moves. A watcher opens its subscription only once the thread
listens, so a change committed after the watcher's read is never missed. A
lost connection is reopened, and the reconnection counts as a notification
(watchers read again: what was announced meanwhile is not lost, only
re-checked).
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

import psycopg

log = logging.getLogger("perdure.store.postgres")

_SLICE = 1.0
_ANSWER_CHANNEL = "perdure_answer"
# Answers held for senders that have not looked yet; the oldest go first.
_ANSWERS = 1024
_RETRY = 0.5
_READY = 5.0


class _Watch:
    """One watcher's subscription: the count of notifications it has seen."""

    def __init__(self, listener: Listener, seen: int) -> None:
        self._listener = listener
        self._seen = seen

    def wait(self, timeout: float) -> bool:
        moved, self._seen = self._listener.wait_past(self._seen, timeout)
        return moved

    def answer(self, run_id: str, update_id: str) -> str | None:
        return self._listener.answer(run_id, update_id)


class Listener:
    """A LISTEN connection shared by the watchers of one store object."""

    def __init__(self, connect: Callable[[], psycopg.Connection[Any]], listen: str) -> None:
        self._connect = connect
        self._listen_sql = listen
        self._cond = threading.Condition()
        self._count = 0
        self._listening = False
        self._closed = False
        self._thread: threading.Thread | None = None
        self._conn: psycopg.Connection[Any] | None = None
        # Answers heard (perdure_answer), newest last, at most _ANSWERS of them.
        self._answers: OrderedDict[tuple[str, str], str] = OrderedDict()

    def _bump(self) -> None:
        with self._cond:
            self._count += 1
            self._cond.notify_all()

    def _run(self) -> None:
        while not self._closed:
            try:
                conn = self._connect()
                conn.execute(self._listen_sql)
            except psycopg.Error as exc:
                log.warning("cannot listen for live runs: %s", exc)
                with self._cond:
                    self._count += 1  # watchers read again rather than stall
                    self._cond.notify_all()
                    self._cond.wait(_RETRY)
                continue
            with self._cond:
                self._conn, self._listening = conn, True
                self._count += 1
                self._cond.notify_all()
            try:
                while not self._closed:
                    for notice in conn.notifies(timeout=_SLICE):
                        if notice.channel == _ANSWER_CHANNEL:
                            self._heard(notice.payload)
                        self._bump()
            except psycopg.Error:
                pass
            finally:
                with self._cond:
                    self._listening = False
                    self._conn = None
                with contextlib.suppress(psycopg.Error):
                    conn.close()
                self._bump()

    @contextlib.contextmanager
    def watch(self) -> Iterator[_Watch]:
        """Subscribe once the connection listens (or after a bounded wait)."""
        with self._cond:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="perdure-live-listener", daemon=True
                )
                self._thread.start()
            self._cond.wait_for(lambda: self._listening or self._closed, _READY)
            seen = self._count
        yield _Watch(self, seen)

    def _heard(self, payload: str) -> None:
        try:
            told = json.loads(payload)
            key = (str(told["run_id"]), str(told["update_id"]))
            response = told["response"]
        except (ValueError, KeyError, TypeError):
            return
        if not isinstance(response, str):
            return
        with self._cond:
            self._answers[key] = response
            while len(self._answers) > _ANSWERS:
                self._answers.popitem(last=False)

    def answer(self, run_id: str, update_id: str) -> str | None:
        """The response heard for the update, if any (an answer never changes)."""
        with self._cond:
            return self._answers.get((run_id, update_id))

    def wait_past(self, seen: int, timeout: float) -> tuple[bool, int]:
        """Wait until the count passes ``seen``; return whether it did and the count now."""
        with self._cond:
            self._cond.wait_for(lambda: self._count != seen or self._closed, max(0.0, timeout))
            return self._count != seen, self._count

    def close(self) -> None:
        """Stop listening; the thread ends within one slice. Idempotent."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
