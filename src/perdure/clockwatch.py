"""Watch the store's clock against this process's monotonic clock; no I/O.

Leases are instants on the store's clock. When that clock steps forward (an
NTP step, a VM resumed, an operator's ``date -s``), every live lease looks
lapsed at once, although its owner is well and renews within a heartbeat. A
:class:`ClockWatch` tells a worker when the store's clock can be trusted to
judge a lapse: it keeps readings ``(store now, monotonic now)`` and notices
when the store's clock gained on the monotonic one (which clock steps do not
move) by more than ``tolerance``.

A healthy lease always has at least ``lease_ttl - heartbeat >= 2/3`` of its
TTL left, so a gain below ``lease_ttl / 3`` cannot lapse it. After a larger
gain the watch distrusts the clock for one ``lease_ttl`` of monotonic time:
by then every live owner has renewed its lease on the new clock. A fresh
watch distrusts too until it has watched for one ``lease_ttl``, since it
cannot know what happened before it started.

While it trusts the clock, :meth:`ClockWatch.recover_until` bounds the store
time at which a claim may still recover lapsed runs: the store's predicted
now plus what is left of the tolerance. A step between the reading and the
claim then pushes the claim's own instant past the bound, and the claim
recovers nothing (the store compares inside the claim's transaction).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from datetime import datetime, timedelta


@dataclass(frozen=True)
class Step:
    """A forward step of the store's clock that the watch noticed."""

    gained: float
    """Seconds the store's clock gained on the monotonic clock (at most)."""

    distrust_for: float
    """Seconds of monotonic time during which no lapsed run is recovered."""


@dataclass(frozen=True)
class _Reading:
    store: datetime
    before: float  # monotonic time just before the store was asked
    after: float  # and just after it answered

    @property
    def low(self) -> float:
        """The smallest ``store - monotonic`` offset this reading allows (seconds)."""
        return self.store.timestamp() - self.after

    @property
    def high(self) -> float:
        """The largest ``store - monotonic`` offset this reading allows (seconds)."""
        return self.store.timestamp() - self.before


class ClockWatch:
    """Decide from clock readings whether lapsed leases may be recovered now."""

    def __init__(
        self,
        lease_ttl: float,
        *,
        tolerance: float | None = None,
        sample_every: float | None = None,
    ) -> None:
        """Watch for steps that could lapse leases of ``lease_ttl`` seconds.

        ``tolerance`` (default a third of ``lease_ttl``) is the largest gain
        of the store's clock over the monotonic one that is not a step.
        ``sample_every`` (default half the tolerance) is how old the latest
        reading may grow before :meth:`wants_reading` asks for another.
        """
        if lease_ttl <= 0:
            raise ValueError(f"lease_ttl must be positive, got {lease_ttl}")
        self.lease_ttl = lease_ttl
        self.tolerance = lease_ttl / 3 if tolerance is None else tolerance
        if not 0 < self.tolerance < lease_ttl:
            raise ValueError(
                f"tolerance={self.tolerance} must be positive and below lease_ttl={lease_ttl}"
            )
        self.sample_every = self.tolerance / 2 if sample_every is None else sample_every
        self._latest: _Reading | None = None
        # Readings of the last lease TTL that may still hold its lowest offset,
        # oldest first with rising offsets (a sliding-window minimum).
        self._lowest: deque[_Reading] = deque()
        self._trusted_from: float | None = None
        self._gained = 0.0  # how much of the tolerance the latest reading used up

    def wants_reading(self, monotonic: float) -> bool:
        """Return whether a new reading is due at monotonic time ``monotonic``."""
        latest = self._latest
        return latest is None or monotonic - latest.after >= self.sample_every

    def observe(self, store_now: datetime, before: float, after: float) -> Step | None:
        """Record that the store said ``store_now`` between monotonic ``before`` and ``after``.

        Returns the :class:`Step` when the store's clock gained more than the
        tolerance on the monotonic clock since any reading of the last
        ``lease_ttl`` or the latest one (so several small steps add up, and
        a step back then forward again is seen), else None.
        """
        if after < before:
            raise ValueError("a monotonic clock does not go back")
        reading = _Reading(store_now, before, after)
        if self._trusted_from is None:
            self._trusted_from = after + self.lease_ttl
        while self._lowest and self._lowest[0].after < after - self.lease_ttl:
            self._lowest.popleft()
        earlier = [r.low for r in (self._lowest[0] if self._lowest else None, self._latest) if r]
        gained = reading.high - min(earlier, default=reading.high)
        self._latest = reading
        if gained > self.tolerance:
            self._lowest.clear()
            self._lowest.append(reading)
            self._trusted_from = after + self.lease_ttl
            self._gained = 0.0
            return Step(gained=gained, distrust_for=self.lease_ttl)
        while self._lowest and self._lowest[-1].low >= reading.low:
            self._lowest.pop()
        self._lowest.append(reading)
        self._gained = max(0.0, gained)
        return None

    def trusted(self, monotonic: float) -> bool:
        """Return whether lapsed leases may be judged by the store's clock at ``monotonic``."""
        return self._trusted_from is not None and monotonic >= self._trusted_from

    @property
    def trusted_from(self) -> float | None:
        """The monotonic instant from which lapsed leases may be judged (None: not read yet)."""
        return self._trusted_from

    def recover_until(self, monotonic: float) -> datetime | None:
        """Return the latest store instant at which a claim made now may recover runs.

        None while the clock is distrusted: such a claim recovers nothing.
        """
        latest = self._latest
        if latest is None or not self.trusted(monotonic):
            return None
        predicted = latest.store + timedelta(seconds=max(0.0, monotonic - latest.after))
        return predicted + timedelta(seconds=self.tolerance - self._gained)
