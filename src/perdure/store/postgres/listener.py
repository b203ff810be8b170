"""Watchers of live runs on PostgreSQL: one LISTEN connection per store object.

A background thread LISTENs on ``perdure_live`` and counts notifications;
each watcher remembers the count it last saw and waits on a condition until
the count moves. A watcher opens its subscription only once the thread
listens, so a change committed after the watcher's read is never missed. A
lost connection is reopened, and the reconnection counts as a notification
(watchers read again: what was announced meanwhile is not lost, only
re-checked).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

import psycopg

log = logging.getLogger("perdure.store.postgres")

_SLICE = 1.0
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
                    for _ in conn.notifies(timeout=_SLICE):
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
