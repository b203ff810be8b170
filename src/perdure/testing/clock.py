"""A clock that moves only when told to."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta


class FakeClock:
    """A thread-safe clock for tests: ``now()`` is pinned until ``advance``."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2030, 1, 1, tzinfo=UTC)
        self._lock = threading.Lock()

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
            return self._now

    def set(self, when: datetime) -> None:
        """Jump to ``when``, which must not be earlier than now."""
        with self._lock:
            if when < self._now:
                raise ValueError("a clock never goes back")
            self._now = when
