"""Runs that workers of this process just ended, so that callers here wake at once.

``RunHandle.result()`` polls the store, backing off from 1 ms to 20 ms. When
the worker that ends a run lives in the same process as the caller (tests,
scripts, an app serving its own runs), the caller need not wait for its next
poll: the worker reports the end here and the waiting call reads the store
again at once. The store stays the only source of truth; a report only cuts
a pause short, so one that is missed (another process ended the run) costs
nothing but the poll it would have saved.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager


class Endings:
    """Waiters on runs by run id, woken when a worker of this process ends one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiters: dict[str, list[threading.Event]] = {}

    @contextmanager
    def watch(self, run_id: str) -> Iterator[threading.Event]:
        """Return an event set when a worker here ends ``run_id``; register before reading."""
        event = threading.Event()
        with self._lock:
            self._waiters.setdefault(run_id, []).append(event)
        try:
            yield event
        finally:
            with self._lock:
                found = self._waiters.get(run_id)
                if found is not None:
                    found.remove(event)
                    if not found:
                        del self._waiters[run_id]

    def ended(self, run_id: str) -> None:
        """Wake whoever here waits on ``run_id`` (called once its end is committed)."""
        with self._lock:
            found = self._waiters.get(run_id)
            events = list(found) if found else ()
        for event in events:
            event.set()


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
