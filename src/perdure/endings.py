"""Runs that workers of this process just ended, so that callers here wake at once.

``RunHandle.result()`` (and ``aresult()``, on its event loop) polls the
store, backing off from 1 ms to 20 ms. When
the worker that ends a run lives in the same process as the caller (tests,
scripts, an app serving its own runs), the caller need not wait for its next
poll: the worker reports the end here and the waiting call reads the store
again at once. The store stays the source of truth: a worker reports only
what it has committed, and a report that is missed (another process ended
the run) costs nothing but the poll it would have saved.

Two more things spare the caller's reads while a worker here has the run:

* A worker reports which runs it holds (claimed and executing). While one
  holds the run, the caller waits for the worker's word, reading only every
  ``client.HELD_PAUSE``: the run ends or is let go (parked, released, given
  up on) through that worker, which says so either way; the rare run taken
  over elsewhere meanwhile (its lease lapsed) is seen by that read.
* A successful end is reported with the result column exactly as the worker
  committed it, so the caller need not read it back. A plan run's end and
  every other end are read from the store, which also follows a chain that
  continued.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass(frozen=True)
class Ended:
    """A run's successful end as the worker committed it: its stored result column."""

    result: str | None


class Watch:
    """One caller's wait on a run: set when a worker here ends it, holds or lets it go.

    A watch made for an event ``loop`` is also awaitable there
    (:meth:`await_set`): a worker's thread sets it through the loop.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._event = threading.Event()
        self._loop = loop
        self._async = asyncio.Event() if loop is not None else None
        # Set once a worker here reports the run's end (handed over or not).
        self.reported = False
        self.ended: Ended | None = None

    def wait(self, timeout: float | None) -> bool:
        return self._event.wait(timeout)

    async def await_set(self, timeout: float) -> bool:
        """Wait on the watch's loop until it is set or ``timeout`` seconds pass."""
        assert self._async is not None, "a watch made without a loop"
        if self._event.is_set():
            return True
        try:
            await asyncio.wait_for(self._async.wait(), timeout)
        except TimeoutError:
            return self._event.is_set()
        return True

    def is_set(self) -> bool:
        return self._event.is_set()

    def clear(self) -> None:
        self._event.clear()
        if self._async is not None:
            self._async.clear()

    def set(self) -> None:
        self._event.set()
        if self._loop is not None and self._async is not None:
            # A loop closed meanwhile has no waiter left to wake.
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._async.set)


class Endings:
    """Waiters on runs by run id, woken when a worker of this process ends one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiters: dict[str, list[Watch]] = {}
        self._held: set[str] = set()

    @contextmanager
    def watch(self, run_id: str, loop: asyncio.AbstractEventLoop | None = None) -> Iterator[Watch]:
        """Return a watch set when a worker here ends ``run_id``; register before reading.

        With ``loop``, the watch can also be awaited on it.
        """
        watch = Watch(loop)
        with self._lock:
            self._waiters.setdefault(run_id, []).append(watch)
        try:
            yield watch
        finally:
            with self._lock:
                found = self._waiters.get(run_id)
                if found is not None:
                    found.remove(watch)
                    if not found:
                        del self._waiters[run_id]

    def ended(self, run_id: str, report: Ended | None = None) -> None:
        """Wake whoever here waits on ``run_id`` (called once its end is committed).

        ``report`` is the committed end, handed to each waiter; None makes
        them read the store.
        """
        with self._lock:
            found = self._waiters.get(run_id)
            watches = list(found) if found else ()
            for watch in watches:
                watch.reported = True
                watch.ended = report
        for watch in watches:
            watch.set()

    def hold(self, run_id: str) -> None:
        """A worker here took ``run_id`` up: its waiters need not read until it says more.

        Nobody is woken: a waiter finds the hold when its pause ends, which
        costs less than taking the GIL from the worker as the run starts.
        """
        with self._lock:
            self._held.add(run_id)

    def let_go(self, run_id: str) -> None:
        """The worker here no longer has ``run_id``: its waiters read the store again."""
        with self._lock:
            self._held.discard(run_id)
            watches = list(self._waiters.get(run_id, ()))
        for watch in watches:
            watch.set()

    def held(self, run_id: str) -> bool:
        """Whether a worker of this process has ``run_id`` now."""
        with self._lock:
            return run_id in self._held


_lock = threading.Lock()
_by_store: weakref.WeakKeyDictionary[object, Endings] = weakref.WeakKeyDictionary()


def of(store: object) -> Endings:
    """Return the endings of ``store``: workers and clients sharing the object share them."""
    try:
        with _lock:
            found = _by_store.get(store)
            if found is None:
                found = _by_store[store] = Endings()
            return found
    except TypeError:
        # A store object that cannot be weakly referenced shares nothing:
        # its callers poll, as they would across processes.
        return Endings()
