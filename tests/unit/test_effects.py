"""Effect classes, retry policy, backoff and idempotency keys."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from perdure import effects, errors


class Transient(Exception):
    pass


class Fatal(Transient):
    pass


# -- Retry.should_retry ---------------------------------------------------------


def test_should_retry_until_max_attempts() -> None:
    retry = effects.Retry(max_attempts=3)
    exc = RuntimeError("boom")
    assert retry.should_retry(1, exc)
    assert retry.should_retry(2, exc)
    assert not retry.should_retry(3, exc)
    assert not retry.should_retry(4, exc)


def test_a_single_attempt_never_retries() -> None:
    assert not effects.Retry(max_attempts=1).should_retry(1, RuntimeError())
    assert not effects.NO_RETRY.should_retry(1, RuntimeError())


def test_retry_on_limits_what_is_retried() -> None:
    retry = effects.Retry(max_attempts=5, retry_on=(Transient,))
    assert retry.should_retry(1, Transient())
    assert retry.should_retry(1, Fatal())  # a subclass is still a Transient
    assert not retry.should_retry(1, ValueError())


def test_give_up_on_wins_over_retry_on() -> None:
    retry = effects.Retry(max_attempts=5, retry_on=(Transient,), give_up_on=(Fatal,))
    assert retry.should_retry(1, Transient())
    assert not retry.should_retry(1, Fatal())
    assert not retry.should_retry(1, KeyError())


def test_default_policy() -> None:
    retry = effects.DEFAULT_RETRY
    assert retry.max_attempts == 3
    assert retry.should_retry(1, Exception())
    assert not retry.should_retry(3, Exception())


# -- Retry.delay ----------------------------------------------------------------


def test_delay_grows_exponentially_without_jitter() -> None:
    retry = effects.Retry(
        max_attempts=10, initial_delay=0.5, multiplier=2.0, max_delay=100, jitter=False
    )
    assert [retry.delay(a) for a in range(1, 6)] == [0.5, 1.0, 2.0, 4.0, 8.0]


def test_delay_is_capped() -> None:
    retry = effects.Retry(
        max_attempts=50, initial_delay=1.0, multiplier=3.0, max_delay=10.0, jitter=False
    )
    assert [retry.delay(a) for a in range(1, 5)] == [1.0, 3.0, 9.0, 10.0]
    assert retry.delay(40) == 10.0


def test_delay_zero_initial_is_always_zero() -> None:
    retry = effects.Retry(initial_delay=0)
    assert retry.delay(1, rng=lambda: 0.999) == 0.0
    assert retry.delay(7, rng=lambda: 0.5) == 0.0


def test_jitter_scales_the_ceiling_by_the_injected_rng() -> None:
    retry = effects.Retry(max_attempts=10, initial_delay=1.0, multiplier=2.0, max_delay=5.0)
    assert retry.jitter
    assert retry.delay(3, rng=lambda: 0.0) == 0.0
    assert retry.delay(3, rng=lambda: 0.25) == 1.0  # ceiling 4
    assert retry.delay(5, rng=lambda: 0.5) == 2.5  # ceiling min(16, 5)
    calls: list[int] = []

    def rng() -> float:
        calls.append(1)
        return 0.5

    retry.delay(1, rng=rng)
    assert calls == [1]


def test_no_jitter_does_not_consult_the_rng() -> None:
    retry = effects.Retry(initial_delay=2.0, jitter=False)

    def rng() -> float:
        raise AssertionError("rng used without jitter")

    assert retry.delay(1, rng=rng) == 2.0


@given(
    attempt=st.integers(min_value=1, max_value=60),
    initial=st.floats(min_value=0, max_value=100, allow_nan=False),
    multiplier=st.floats(min_value=1, max_value=10, allow_nan=False),
    cap=st.floats(min_value=0, max_value=1000, allow_nan=False),
    draw=st.floats(min_value=0, max_value=1, exclude_max=True),
)
def test_jittered_delay_stays_within_zero_and_the_ceiling(
    attempt: int, initial: float, multiplier: float, cap: float, draw: float
) -> None:
    retry = effects.Retry(
        max_attempts=100, initial_delay=initial, multiplier=multiplier, max_delay=cap
    )
    ceiling = effects.Retry(
        max_attempts=100, initial_delay=initial, multiplier=multiplier, max_delay=cap, jitter=False
    ).delay(attempt)
    assert 0.0 <= ceiling <= cap
    delay = retry.delay(attempt, rng=lambda: draw)
    assert 0.0 <= delay <= ceiling


# -- validation -----------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_attempts": 0},
        {"max_attempts": -1},
        {"initial_delay": -0.1},
        {"max_delay": -1},
        {"multiplier": 0.5},
    ],
)
def test_retry_refuses_bad_values(kwargs: dict[str, float]) -> None:
    with pytest.raises(errors.InvalidInput):
        effects.Retry(**kwargs)  # type: ignore[arg-type]


def test_retry_is_frozen() -> None:
    retry = effects.Retry()
    with pytest.raises(AttributeError):
        retry.max_attempts = 5  # type: ignore[misc]


def test_step_options_defaults() -> None:
    opts = effects.StepOptions("reserve")
    assert opts.effect == "idempotent"
    assert opts.retry == effects.DEFAULT_RETRY
    assert not opts.transactional


@pytest.mark.parametrize("effect", ["pure", "idempotent", "once"])
def test_step_options_accepts_each_effect(effect: str) -> None:
    assert effects.StepOptions("s", effect).effect == effect  # type: ignore[arg-type]


@pytest.mark.parametrize("effect", ["", "Once", "twice", "exactly_once"])
def test_step_options_refuses_unknown_effects(effect: str) -> None:
    with pytest.raises(errors.InvalidInput, match="effect"):
        effects.StepOptions("s", effect)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["", "a#2", "a/b", "#", "/"])
def test_step_options_refuses_names_that_would_break_keys(name: str) -> None:
    with pytest.raises(errors.InvalidInput):
        effects.StepOptions(name)


def test_options_of() -> None:
    def plain() -> None: ...

    def declared() -> None: ...

    opts = effects.StepOptions("declared", "once")
    declared.__perdure_step__ = opts  # type: ignore[attr-defined]
    assert effects.options_of(declared) is opts
    assert effects.options_of(plain) is None

    def wrong() -> None: ...

    wrong.__perdure_step__ = "not options"  # type: ignore[attr-defined]
    assert effects.options_of(wrong) is None


# -- keys -----------------------------------------------------------------------


def test_step_key() -> None:
    assert effects.step_key("charge", 1) == "charge"
    assert effects.step_key("charge", 2) == "charge#2"
    assert effects.step_key("charge", 11) == "charge#11"


def test_idempotency_key() -> None:
    assert effects.idempotency_key("r123", "charge") == "r123/charge"
    assert effects.idempotency_key("r123", "charge#2") == "r123/charge#2"


# -- release backoff ------------------------------------------------------------


def test_release_backoff_doubles_from_the_base_and_is_capped() -> None:
    assert [effects.release_backoff(f) for f in range(1, 7)] == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0]
    assert effects.release_backoff(0) == 1.0
    assert effects.release_backoff(9) == 256.0
    assert effects.release_backoff(10) == 300.0
    assert effects.release_backoff(1000) == 300.0
    assert effects.release_backoff(3, base=0.5, cap=1.5) == 1.5
    assert effects.release_backoff(2, base=0.5, cap=10) == 1.0


@given(st.integers(min_value=0, max_value=100_000))
def test_release_backoff_is_monotonic_and_bounded(failures: int) -> None:
    here = effects.release_backoff(failures)
    assert 1.0 <= here <= 300.0
    assert effects.release_backoff(failures + 1) >= here


def test_release_backoff_stays_capped_for_very_many_failures() -> None:
    assert effects.release_backoff(5000) == 300.0


def test_delay_stays_capped_for_very_late_attempts() -> None:
    retry = effects.Retry(max_attempts=100_000, initial_delay=1.0, max_delay=60.0, jitter=False)
    assert retry.delay(5000) == 60.0
    jittered = effects.Retry(max_attempts=100_000, initial_delay=1.0, max_delay=60.0)
    assert jittered.delay(5000, rng=lambda: 0.5) == 30.0


def test_zero_initial_delay_stays_zero_for_very_late_attempts() -> None:
    retry = effects.Retry(max_attempts=100_000, initial_delay=0, max_delay=30.0, jitter=False)
    assert retry.delay(5000) == 0.0
