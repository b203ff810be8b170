"""Failed step attempts: their journal body, and how steps keep them across retries and crashes."""

from __future__ import annotations

from typing import Any

import pytest
from test_context_runtime import make

import perdure
from perdure import effects, errors, journal, steps


def failing(times: int, *, retry: perdure.Retry | None = None, effect: Any = "idempotent") -> Any:
    calls = {"n": 0}

    def flaky() -> str:
        calls["n"] += 1
        if calls["n"] <= times:
            raise ValueError(f"down {calls['n']}")
        return "up"

    opts = effects.StepOptions("flaky", effect, retry or perdure.Retry(max_attempts=5))
    flaky.__perdure_step__ = opts  # type: ignore[attr-defined]
    return flaky


def test_a_failed_attempt_is_bounded_and_names_where_it_failed() -> None:
    def deep(n: int) -> None:
        if n == 0:
            raise RuntimeError("x" * 5000)
        deep(n - 1)

    with pytest.raises(RuntimeError) as caught:
        deep(20)
    attempt = journal.FailedAttempt.of(3, caught.value, 0.25)
    assert (attempt.attempt, attempt.code, attempt.type, attempt.duration) == (
        3,
        "step_failed",
        "RuntimeError",
        0.25,
    )
    assert len(attempt.message) == journal.MESSAGE_LIMIT
    assert attempt.traceback is not None
    assert len(attempt.traceback) <= journal.TRACEBACK_LIMIT
    assert "in deep" in attempt.traceback
    # Only the innermost frames are kept, the exception's line last.
    assert (
        attempt.traceback.splitlines()[-1].startswith("...")
        or "RuntimeError" in (attempt.traceback.splitlines()[-1])
    )


def test_a_perdure_error_keeps_its_code() -> None:
    attempt = journal.FailedAttempt.of(1, errors.EffectFailed("declined"), None)
    assert (attempt.code, attempt.type, attempt.duration) == ("effect_failed", "EffectFailed", None)


def test_attempts_round_trip_and_refuse_other_shapes() -> None:
    one = journal.FailedAttempt(1, "step_failed", "ValueError", "down", "f.py:1 in f", 0.5)
    two = journal.FailedAttempt(2, "step_failed", "ValueError", "down", None, None)
    assert journal.Attempts(()).encode() is None
    assert journal.Attempts.decode(journal.Attempts((one, two)).encode()).attempts == (one, two)
    error = journal.StepError("ValueError", "down", attempts=(one, two))
    assert journal.StepError.decode(error.encode()) == error
    retry = journal.AttemptFailed("ValueError", "down", (one,))
    assert journal.AttemptFailed.decode(retry.encode()) == retry
    for bad in (
        '{"attempts": 1}',
        '{"attempts": [1]}',
        '{"attempts": [{"attempt": true, "code": "c", "type": "t", "message": "m"}]}',
        '{"attempts": [{"attempt": 1, "code": 2, "type": "t", "message": "m"}]}',
        '{"attempts": [{"attempt": 1, "code": "c", "type": "t"}]}',
        '{"attempts": [{"attempt": 1, "code": "c", "type": "t", "message": "m", "duration": -1}]}',
        '{"attempts": [{"attempt": 1, "code": "c", "type": "t", "message": "m", "traceback": 3}]}',
    ):
        with pytest.raises(journal.Unreadable):
            journal.Attempts.decode(bad)


def test_journals_from_before_attempts_were_kept_read_their_one_known_failure() -> None:
    old_retry = journal.Entry(
        1, "step", "pay", "started", error='{"code":"effect_failed","type":"E","message":"no"}'
    )
    old_error = journal.Entry(
        2,
        "step",
        "ship",
        "error",
        error='{"type":"E","message":"gone","code":"step_failed"}',
        attempt=3,
    )
    resolved = journal.Entry(3, "step", "x", "error", error='{"type":"Resolved","message":"m"}')
    canceled = journal.Entry(
        4, "step", "y", "error", error='{"type":"Canceled","message":"m","code":"canceled"}'
    )
    assert journal.failed_attempts(old_retry) == (
        journal.FailedAttempt(1, "effect_failed", "E", "no"),
    )
    assert journal.failed_attempts(old_error) == (
        journal.FailedAttempt(3, "step_failed", "E", "gone"),
    )
    assert journal.failed_attempts(resolved) == ()
    assert journal.failed_attempts(canceled) == ()
    assert journal.failed_attempts(journal.Entry(5, "step", "z", "ok", '"v"')) == ()
    wait = journal.Entry(6, "wait", "w", "error", error='{"code":"wait_timeout"}')
    assert journal.failed_attempts(wait) == ()


def test_a_step_that_failed_then_succeeded_keeps_its_failures_with_its_result() -> None:
    ctx, runtime = make()
    assert ctx.step(failing(2)) == "up"
    [entry] = runtime.stored
    assert (entry.status, entry.attempt, journal.Value.decode(entry.output).value) == (
        "ok",
        3,
        "up",
    )
    kept = journal.failed_attempts(entry)
    assert [(a.attempt, a.type, a.message) for a in kept] == [
        (1, "ValueError", "down 1"),
        (2, "ValueError", "down 2"),
    ]
    assert all(a.duration is not None and a.duration >= 0 for a in kept)
    assert all(a.traceback and "in flaky" in a.traceback for a in kept)
    # Each failure was written before its retry; the result after.
    assert runtime.writes == ["finish_step", "finish_step", "finish_step"]


def test_a_step_that_never_failed_writes_no_attempts() -> None:
    ctx, runtime = make()
    assert ctx.step(failing(0)) == "up"
    [entry] = runtime.stored
    assert entry.error is None
    assert runtime.writes == ["finish_step"]


def test_a_step_resumed_after_a_crash_counts_on_and_keeps_earlier_failures() -> None:
    ctx, runtime = make()
    with pytest.raises(errors.StepFailed):
        ctx.step(failing(10, retry=perdure.Retry(max_attempts=2, initial_delay=0)))
    # The run crashed during the pause after attempt 1: only that was stored.
    first = journal.failed_attempts(runtime.stored[0])[0]
    retry_due = journal.Entry(
        1,
        "step",
        "flaky",
        "started",
        error=journal.AttemptFailed("ValueError", "down 1", (first,)).encode(),
    )
    ctx, runtime = make([retry_due])
    assert ctx.step(failing(0, retry=perdure.Retry(max_attempts=2))) == "up"
    [entry] = runtime.stored
    assert entry.attempt == 2
    assert journal.failed_attempts(entry) == (first,)


def test_an_old_retry_due_entry_resumes_and_counts_as_one_failure() -> None:
    old = journal.Entry(
        1, "step", "flaky", "started", error='{"code":"effect_failed","type":"E","message":"no"}'
    )
    ctx, runtime = make([old])
    assert ctx.step(failing(0)) == "up"
    [entry] = runtime.stored
    assert entry.attempt == 2
    assert journal.failed_attempts(entry) == (journal.FailedAttempt(1, "effect_failed", "E", "no"),)


def test_an_unreadable_retry_due_entry_needs_attention() -> None:
    broken = journal.Entry(
        1, "step", "flaky", "started", error='{"code":"effect_failed","attempts":"x"}'
    )
    ctx, _ = make([broken])
    with pytest.raises(steps.Halt) as halted:
        ctx.step(failing(0))
    assert halted.value.error["invariant"] == "journal_output_shape"


def test_a_once_step_keeps_its_failures_while_a_later_attempt_is_in_flight() -> None:
    calls = {"n": 0}

    def pay() -> str:
        calls["n"] += 1
        if calls["n"] == 1:
            raise errors.EffectFailed("declined")
        return "paid"

    pay.__perdure_step__ = effects.StepOptions(  # type: ignore[attr-defined]
        "pay", "once", perdure.Retry(max_attempts=2, initial_delay=0)
    )
    ctx, runtime = make()
    seen: list[journal.Entry] = []
    original = runtime.begin_effect

    def spy(entry: journal.Entry, marks: list[journal.Mark]) -> None:
        seen.append(entry)
        original(entry, marks)

    runtime.begin_effect = spy  # type: ignore[method-assign]
    assert ctx.step(pay) == "paid"
    # The second effect start keeps the first failure, and is still unsettled.
    assert seen[0].error is None
    assert [a.type for a in journal.failed_attempts(seen[1])] == ["EffectFailed"]
    assert journal.unsettled(seen[1])
    assert [a.code for a in journal.failed_attempts(runtime.stored[0])] == ["effect_failed"]
