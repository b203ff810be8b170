"""The clock watch: when may a worker judge a lapsed lease by the store's clock?

Readings are made up: the store's clock is the monotonic time plus an offset
that each test steps as a host's clock would be set.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from perdure.clockwatch import ClockWatch, Step

TTL = 30.0
TOL = TTL / 3
BASE = datetime(2030, 1, 1, tzinfo=UTC)


class Host:
    """A monotonic clock and a store clock that runs with it, plus steps."""

    def __init__(self, watch: ClockWatch) -> None:
        self.watch = watch
        self.mono = 1000.0
        self.offset = 0.0

    def store_now(self) -> datetime:
        return BASE + timedelta(seconds=self.mono + self.offset)

    def read(self, *, after: float = 1.0, latency: float = 0.0) -> Step | None:
        """Let ``after`` seconds pass, then read the store's clock.

        The store answers ``latency`` seconds after it was asked, reading its
        clock at the last moment.
        """
        self.mono += after
        before = self.mono
        self.mono += latency
        return self.watch.observe(self.store_now(), before, self.mono)

    def watch_for(self, seconds: float) -> list[Step]:
        steps = []
        for _ in range(round(seconds)):
            step = self.read()
            if step is not None:
                steps.append(step)
        return steps

    def bound(self) -> datetime | None:
        return self.watch.recover_until(self.mono)


@pytest.fixture
def host() -> Host:
    return Host(ClockWatch(TTL))


def test_a_fresh_watch_recovers_nothing_until_it_watched_one_ttl(host: Host) -> None:
    assert host.bound() is None
    assert host.read() is None
    start = host.mono
    assert host.watch_for(TTL - 2) == []
    assert host.bound() is None
    host.read(after=start + TTL - host.mono)
    assert host.bound() == host.store_now() + timedelta(seconds=TOL)


def test_a_steady_clock_bounds_claims_at_now_plus_the_tolerance(host: Host) -> None:
    host.watch_for(TTL + 1)
    assert host.bound() == host.store_now() + timedelta(seconds=TOL)
    # Between readings the bound follows the monotonic clock.
    host.mono += 0.4
    assert host.bound() == host.store_now() + timedelta(seconds=TOL)


def test_a_forward_step_stops_recovery_for_one_ttl(host: Host) -> None:
    host.watch_for(TTL + 1)
    host.offset += 3600
    step = host.read()
    assert step == Step(gained=pytest.approx(3600), distrust_for=TTL)
    stepped_at = host.mono
    assert host.bound() is None
    assert host.watch_for(TTL - 1) == []  # the new clock is steady: one step only
    assert host.mono < stepped_at + TTL
    assert host.bound() is None
    host.read(after=stepped_at + TTL - host.mono)
    assert host.bound() == host.store_now() + timedelta(seconds=TOL)


def test_a_step_after_the_reading_pushes_the_claim_past_the_bound(host: Host) -> None:
    host.watch_for(TTL + 1)
    bound = host.bound()
    assert bound is not None
    host.offset += TOL + 0.001  # the clock steps between the reading and the claim
    assert host.store_now() > bound


def test_a_small_step_is_tolerated_but_uses_up_the_tolerance(host: Host) -> None:
    host.watch_for(TTL + 1)
    host.offset += TOL * 0.75
    assert host.read() is None
    assert host.bound() == host.store_now() + timedelta(seconds=TOL * 0.25)


def test_small_steps_within_one_ttl_add_up(host: Host) -> None:
    host.watch_for(TTL + 1)
    host.offset += TOL * 0.6
    assert host.read() is None
    host.watch_for(5)
    host.offset += TOL * 0.6
    step = host.read()
    assert step is not None and step.gained == pytest.approx(TOL * 1.2)
    assert host.bound() is None


def test_small_steps_more_than_one_ttl_apart_do_not_add_up(host: Host) -> None:
    host.watch_for(TTL + 1)
    host.offset += TOL * 0.6
    assert host.read() is None
    assert host.watch_for(TTL + 2) == []
    host.offset += TOL * 0.6
    assert host.read() is None
    assert host.bound() is not None


def test_a_step_during_a_long_silence_is_seen_at_the_next_reading(host: Host) -> None:
    host.watch_for(TTL + 1)
    host.offset += 3600
    step = host.read(after=5 * TTL)  # e.g. the store could not be reached meanwhile
    assert step is not None and step.gained == pytest.approx(3600)
    assert host.bound() is None


def test_a_backward_step_is_no_reason_to_wait_but_its_return_is(host: Host) -> None:
    host.watch_for(TTL + 1)
    host.offset -= 3600
    assert host.read() is None
    assert host.bound() == host.store_now() + timedelta(seconds=TOL)
    host.watch_for(5)
    host.offset += 3600  # set right again: leases renewed meanwhile look an hour old
    step = host.read()
    assert step is not None and step.gained == pytest.approx(3600)
    assert host.bound() is None


def test_a_slow_reading_counts_against_the_tolerance(host: Host) -> None:
    host.watch_for(TTL + 1)
    # The store read its clock somewhere in a window wider than the
    # tolerance: a step cannot be told from the wait, so it assumes the worst.
    step = host.read(latency=TOL + 1)
    assert step is not None and step.gained == pytest.approx(TOL + 1)
    assert host.bound() is None


def test_a_reading_is_wanted_when_the_latest_grew_old() -> None:
    watch = ClockWatch(TTL, sample_every=2.0)
    assert watch.wants_reading(0.0)
    watch.observe(BASE, 10.0, 10.1)
    assert not watch.wants_reading(12.0)
    assert watch.wants_reading(12.1)


def test_a_distrusting_watch_ignores_readings_it_cannot_use() -> None:
    watch = ClockWatch(TTL)
    assert watch.recover_until(5.0) is None
    assert not watch.trusted(5.0)


@pytest.mark.parametrize(
    ("ttl", "options"),
    [(0.0, {}), (-1.0, {}), (30.0, {"tolerance": 0.0}), (30.0, {"tolerance": 30.0})],
)
def test_bad_settings_are_refused(ttl: float, options: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="must be positive"):
        ClockWatch(ttl, **options)


def test_a_monotonic_clock_that_goes_back_is_refused() -> None:
    with pytest.raises(ValueError, match="does not go back"):
        ClockWatch(TTL).observe(BASE, 2.0, 1.0)
