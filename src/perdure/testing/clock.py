"""Clocks for tests: one that moves only when told to, one that steps like a host's."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta


class FakeClock:
    """A thread-safe clock for tests: ``now()`` is pinned until ``advance``.

    Whoever must know when time moves subscribes (:meth:`subscribe`): an
    ``App`` built with this clock makes each of its workers look for due runs
    as soon as the clock moves, instead of at their next poll.
    """

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2030, 1, 1, tzinfo=UTC)
        self._lock = threading.Lock()
        self._listeners: list[Callable[[], None]] = []

    def subscribe(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call ``listener()`` after every move of the clock; return the unsubscribe call."""
        with self._lock:
            self._listeners.append(listener)

        def unsubscribe() -> None:
            with self._lock, contextlib.suppress(ValueError):
                self._listeners.remove(listener)

        return unsubscribe

    def _moved(self) -> None:
        with self._lock:
            listeners = list(self._listeners)
        for listener in listeners:
            # A listener whose store was closed meanwhile must not stop the clock.
            with contextlib.suppress(Exception):
                listener()

    def now(self) -> datetime:
        with self._lock:
            return self._now

    def advance(self, seconds: float = 0.0, **delta: float) -> datetime:
        """Move forward by ``seconds`` (plus any ``timedelta`` keywords); return the new now."""
        step = timedelta(seconds=seconds, **delta)
        if step < timedelta(0):
            raise ValueError("a clock never goes back")
        with self._lock:
            self._now += step
            now = self._now
        self._moved()
        return now

    def set(self, when: datetime) -> None:
        """Jump to ``when``, which must not be earlier than now."""
        with self._lock:
            if when < self._now:
                raise ValueError("a clock never goes back")
            self._now = when
        self._moved()

    def step(self, seconds: float = 0.0, **delta: float) -> datetime:
        """Step by ``seconds`` either way, as a host clock does under NTP; return the new now.

        Unlike :meth:`advance`, a negative step is allowed: it is the clock
        being set back, which the store must survive.
        """
        with self._lock:
            self._now += timedelta(seconds=seconds, **delta)
            now = self._now
        self._moved()
        return now


class OffsetClock:
    """The system clock plus an offset in seconds read from a file on every ``now()``.

    Every process given the same file steps at once when a test rewrites it
    (:meth:`write`), as every process of a host does when its clock is set. A
    missing or empty file means no offset.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)

    def offset(self) -> float:
        """Return the offset now in the file, in seconds."""
        try:
            with open(self.path, encoding="ascii") as handle:
                text = handle.read().strip()
        except FileNotFoundError:
            return 0.0
        return float(text) if text else 0.0

    def now(self) -> datetime:
        return datetime.now(UTC) + timedelta(seconds=self.offset())

    def write(self, seconds: float) -> None:
        """Set the offset for every reader at once (an atomic rename)."""
        partial = f"{self.path}.{os.getpid()}.tmp"
        with open(partial, "w", encoding="ascii") as handle:
            handle.write(repr(float(seconds)))
        os.replace(partial, self.path)
