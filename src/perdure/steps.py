"""One step call: replay its outcome, or run its attempts and record the outcome.

A ``once`` step records that its effect starts before each attempt; every
step records its final outcome. All writes go through the :class:`Runtime`
the worker's execution supplies, which buffers the values recorded since the
last write and commits them with the step, so a step costs one commit.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from datetime import datetime, timedelta
from typing import Any, Protocol

from perdure import codec, effects, errors, journal, payloads, telemetry

# Values that JSON gives back unchanged, type included (containers do not:
# tuples come back as lists, dict keys as strings).
_SAME_AFTER_DECODE = frozenset({int, str, float, bool, type(None)})

_STEP_KEY: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "perdure_step_key", default=None
)


def in_step() -> bool:
    """Whether the calling code runs inside a step's body."""
    return _STEP_KEY.get() is not None


@contextlib.contextmanager
def keyed(key: str) -> Iterator[None]:
    """Make ``idempotency_key()`` return ``key`` inside the block (a plan's task body)."""
    token = _STEP_KEY.set(key)
    try:
        yield
    finally:
        _STEP_KEY.reset(token)


def idempotency_key() -> str:
    """Return the running step's stable idempotency key (``run_id/step key``).

    Raises:
        errors.InvalidInput: called outside a step body.
    """
    key = _STEP_KEY.get()
    if key is None:
        raise errors.InvalidInput("idempotency_key() is only available inside a step")
    return key


class Parked(errors.Suspend):
    """The run must wait: for ``waits`` to be settled or until ``wake_at``."""

    def __init__(self, waits: list[journal.WaitSpec], wake_at: datetime | None) -> None:
        self.waits = waits
        self.wake_at = wake_at
        super().__init__("parked")


class Halt(errors.Interrupt):
    """Stop executing the run and settle it as ``reason`` says."""

    def __init__(self, reason: str, error: dict[str, Any] | None = None) -> None:
        self.reason = reason  # "needs_attention" | "release" | "fault"
        self.error = error or {}
        super().__init__(f"{reason}: {self.error.get('message', '')}")


def error_dict(code: str, message: str, **extra: Any) -> dict[str, Any]:
    """Return a run error: a code, a sentence and whatever names the culprit."""
    return {"code": code, "message": message, **extra}


def opened(runtime: Runtime, value: Any) -> Any:
    """Return the payload a recorded value holds, for workflow code.

    A payload this worker cannot open (no codec, a key it lacks, a blob
    missing from the payload store) stops the run in needs_attention: the
    journal is sound, the worker's configuration is not.
    """
    try:
        return runtime.payloads.open(value)
    except errors.PayloadUnreadable as exc:
        raise Halt("needs_attention", error_dict(exc.code, str(exc))) from exc


def unreadable(run_id: str, entry: journal.Entry, exc: Exception) -> Halt:
    """Return the stop for a recorded body of a shape this code never writes."""
    return Halt(
        "needs_attention",
        error_dict(
            "corrupt_state",
            f"run {run_id} position {entry.position}: unreadable {entry.kind} entry ({exc})",
            invariant="journal_output_shape",
        ),
    )


class Runtime(Protocol):
    """What a step call needs from the execution it runs in."""

    @property
    def payload_limit(self) -> int:
        """The largest output a step may record, in bytes of JSON."""

    @property
    def payloads(self) -> payloads.Payloads:
        """The app's payload layer: seals what the run records, opens what it reads."""

    def check(self) -> None:
        """Raise if the run must stop (lease lost, canceled, worker stopping).

        A cancel is raised once and acknowledged as it is raised, so that
        clean-up steps are journaled afterwards.
        """

    def pause(self, seconds: float) -> None:
        """Wait between attempts; raise as :meth:`check` does if the run must stop."""

    def now(self) -> datetime:
        """The store's clock: when a parked retry is due is measured against it."""

    def recorded(self, position: int) -> journal.Entry | None:
        """Return the entry stored at ``position``, as far as this execution knows."""

    def begin_effect(self, entry: journal.Entry, marks: list[journal.Mark]) -> None:
        """Record (fenced, with the buffered entries) that a ``once`` effect starts."""

    def finish_step(self, entry: journal.Entry, marks: list[journal.Mark]) -> None:
        """Record (fenced, with the buffered entries) a step's outcome.

        If the run's cancel refuses the write, an outcome that happened is
        still recorded before :class:`errors.Canceled` is raised.
        """

    def transaction_step(
        self, body: Callable[[Any], journal.Entry], marks: list[journal.Mark]
    ) -> journal.Entry:
        """Record the entry ``body(connection)`` returns in the transaction it ran in.

        If anything raises, nothing is stored, the buffer is kept and the
        exception propagates.
        """

    def step_attempt(self, key: str, effect: str, attempt: int) -> telemetry.Span:
        """Begin observing one attempt of a step (a span, metrics, log lines)."""


class StepCall:
    """One call of a step at its journal position."""

    def __init__(
        self,
        runtime: Runtime,
        run_id: str,
        fn: Callable[..., Any],
        opts: effects.StepOptions,
        key: str,
        position: int,
        recorded: journal.Entry | None,
    ) -> None:
        self.runtime = runtime
        self.run_id = run_id
        self.opts = opts
        self.hint = codec.return_hint(getattr(fn, "__wrapped__", fn))
        self.key = key
        self.position = position
        self.attempt = 0
        self.value: Any = None
        # The failed attempts so far, kept in every entry the step writes.
        self.failures: tuple[journal.FailedAttempt, ...] = ()
        self.span: telemetry.Span = telemetry.NO_SPAN
        self.started_at = 0.0
        # When the next attempt is due, if the backoff before it parks the run.
        self.retry_at: datetime | None = None
        if recorded is not None and journal.retry_due(recorded):
            # The last attempt certainly did not happen: carry on with the next.
            try:
                self.failures = journal.failed_attempts(recorded)
                failed = journal.AttemptFailed.decode(recorded.error)
            except ValueError as exc:
                raise unreadable(run_id, recorded, exc) from exc
            self.retry_at = failed.retry_at if failed is not None else None
            self.attempt = recorded.attempt
            recorded = None
        self.replayed = recorded is not None
        if recorded is not None:
            self.value = self._replay(recorded)

    def _replay(self, entry: journal.Entry) -> Any:
        if entry.status == "ok":
            value = opened(self.runtime, journal.Value.decode(entry.output).value)
            return codec.convert(value, self.hint)
        if entry.status == "error":
            err = journal.StepError.decode(entry.error or "{}")
            raise errors.StepFailed(self.key, err.type, err.message)
        raise Halt(
            "needs_attention",
            error_dict(
                "effect_outcome_unknown",
                f"step {self.key} started its effect (attempt {entry.attempt}) and its outcome "
                "was never recorded; resolve it with its real outcome",
                step=self.key,
                attempt=entry.attempt,
            ),
        )

    def _entry(self, status: journal.EntryStatus, **body: Any) -> journal.Entry:
        return journal.Entry(self.position, "step", self.key, status, **body)

    def before(self) -> None:
        self.attempt += 1
        if self.opts.effect == "once":
            # The earlier failures stay in the entry while the effect is in flight.
            earlier = journal.Attempts(self.failures).encode() if self.failures else None
            started = self._entry("started", error=earlier, attempt=self.attempt)
            self.runtime.begin_effect(started, [journal.Mark("effect_started", self.key)])
        else:
            self.runtime.check()
        self.span = self.runtime.step_attempt(self.key, self.opts.effect, self.attempt)
        self.started_at = time.monotonic()

    def await_retry(self) -> None:
        """Park the run until its next attempt is due, if the backoff is a durable one."""
        if self.retry_at is None:
            return
        if self.runtime.now() < self.retry_at:
            raise Parked([], self.retry_at)
        self.retry_at = None

    def timed_out(self) -> errors.StepTimedOut:
        """Return the failure of an attempt that ran past the step's timeout."""
        return errors.StepTimedOut(
            f"step {self.key} attempt {self.attempt} ran past its timeout of {self.opts.timeout:g}s"
        )

    def end_attempt(self) -> None:
        """End the attempt's span if nothing else did: the run stopped during it."""
        self.span.end("interrupted")

    @contextlib.contextmanager
    def abandoned_on_cancel(self) -> Iterator[None]:
        """Record the step as canceled if a cancel stops it before it has an outcome.

        Its position is taken; leaving it empty would make the next durable
        call (a clean-up step in a ``finally``) leave a gap in the journal.
        """
        try:
            yield
        except errors.Canceled:
            self.abandon()
            raise

    def abandon(self) -> None:
        """Record the step as canceled (see :meth:`abandoned_on_cancel`), if it may be."""
        recorded = self.runtime.recorded(self.position)
        # Never over an unsettled effect: only an empty position, or one
        # whose last attempt certainly did not happen.
        if recorded is None or journal.retry_due(recorded):
            error = journal.StepError(
                "Canceled",
                "the run was canceled before this step finished",
                "canceled",
                self.failures,
            )
            entry = self._entry("error", error=error.encode(), attempt=max(1, self.attempt))
            self.runtime.finish_step(entry, [journal.Mark("step_failed", self.key)])

    @contextlib.contextmanager
    def scope(self) -> Iterator[None]:
        token = _STEP_KEY.set(effects.idempotency_key(self.run_id, self.key))
        try:
            yield
        finally:
            _STEP_KEY.reset(token)

    def succeeded(self, value: Any) -> Any:
        try:
            plain = journal.Value(value).encode()
            text = self.runtime.payloads.seal_text(plain, f"the output of step {self.key}")
        except errors.InvalidPayload as exc:
            self.failed(exc, final=True)
            raise  # failed() always raises here
        earlier = journal.Attempts(self.failures).encode() if self.failures else None
        entry = self._entry("ok", output=text, error=earlier, attempt=self.attempt)
        marks = [journal.Mark("step_completed", self.key, codec.digest(text))]
        if self.opts.effect != "once":
            marks.insert(0, journal.Mark("step_started", self.key))
        self.runtime.finish_step(entry, marks)
        self.span.end("succeeded")
        if value.__class__ in _SAME_AFTER_DECODE:
            # A replay decodes an equal value of the same type: skip the decode.
            return codec.convert(value, self.hint)
        return codec.convert(journal.Value.decode(plain).value, self.hint)

    def failed(self, exc: Exception, *, final: bool = False) -> float:
        """Return the pause before the next attempt, or raise what the workflow sees.

        The attempt's error is recorded before either: a retry writes the
        failures so far (a ``started`` entry whose attempt certainly failed),
        so they survive a crash during the pause.
        """
        once = self.opts.effect == "once"
        duration = time.monotonic() - self.started_at if self.started_at else None
        self.failures = (*self.failures, journal.FailedAttempt.of(self.attempt, exc, duration))
        if once and not isinstance(exc, errors.EffectFailed):
            self.span.end("ambiguous", exc)
            # The effect stays unsettled; its entry keeps what this attempt raised,
            # for the operator who resolves it.
            kept = journal.Attempts(self.failures).encode()
            self.runtime.finish_step(self._entry("started", error=kept, attempt=self.attempt), [])
            raise Halt(
                "needs_attention",
                error_dict(
                    "effect_outcome_unknown",
                    f"step {self.key} started its effect (attempt {self.attempt}) and then "
                    f"{type(exc).__name__}: {exc}; its outcome is not recorded",
                    step=self.key,
                    attempt=self.attempt,
                ),
            ) from exc
        marks = [journal.Mark("step_failed", self.key)]
        if not once:
            marks.insert(0, journal.Mark("step_started", self.key))
        if not final and self.opts.retry.should_retry(self.attempt, exc):
            delay = self.opts.retry.delay(self.attempt)
            # A long backoff is a durable timer: the run parks and frees its
            # worker, and the instant of the next attempt is journaled.
            if delay > self.opts.retry.park_after:
                self.retry_at = self.runtime.now() + timedelta(seconds=delay)
            # Record that this attempt did not happen (so that a stop or a lost
            # lease during the pause is not mistaken for an ambiguity) and why.
            attempt = journal.AttemptFailed(
                type(exc).__name__, str(exc), self.failures, self.retry_at
            )
            retry = self._entry("started", error=attempt.encode(), attempt=self.attempt)
            self.runtime.finish_step(retry, marks)
            self.span.end("retrying", exc)
            return delay
        error = journal.StepError(type(exc).__name__, str(exc), attempts=self.failures)
        entry = self._entry("error", error=error.encode(), attempt=self.attempt)
        self.runtime.finish_step(entry, marks)
        self.span.end("failed", exc)
        raise errors.StepFailed(self.key, type(exc).__name__, str(exc)) from exc

    def transact(self, body: Callable[[Any], Any]) -> Any:
        self.attempt = 1
        self.runtime.check()
        self.span = self.runtime.step_attempt(self.key, self.opts.effect, self.attempt)
        self.started_at = time.monotonic()
        raised: list[Exception] = []

        def run(conn: Any) -> journal.Entry:
            try:
                output = body(conn)
                text = self.runtime.payloads.seal(output, f"the output of step {self.key}")
            except Exception as exc:
                raised.append(exc)  # the step's own failure, not the store's
                raise
            return self._entry("ok", output=text)

        marks = [journal.Mark("step_started", self.key), journal.Mark("step_completed", self.key)]
        try:
            recorded = self.runtime.transaction_step(run, marks)
        except BaseException:
            if not raised:
                raise
            exc = raised[0]
            # The body's writes were rolled back with the transaction.
            duration = time.monotonic() - self.started_at
            self.failures = (journal.FailedAttempt.of(1, exc, duration),)
            error = journal.StepError(type(exc).__name__, str(exc), attempts=self.failures)
            failed = self._entry("error", error=error.encode())
            self.runtime.finish_step(failed, [journal.Mark("step_failed", self.key)])
            self.span.end("failed", exc)
            raise errors.StepFailed(self.key, type(exc).__name__, str(exc)) from exc
        self.span.end("succeeded")
        value = opened(self.runtime, journal.Value.decode(recorded.output).value)
        return codec.convert(value, self.hint)


def options(fn: Callable[..., Any]) -> effects.StepOptions:
    """Return a step's declared options (a bare function is an idempotent step)."""
    return effects.options_of(fn) or effects.StepOptions(name=getattr(fn, "__name__", "step"))


def unwrap(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Return the declared function behind an ``@app.step`` wrapper."""
    inner = getattr(fn, "__wrapped__", None)
    return inner if inner is not None and effects.options_of(fn) is not None else fn


def _within(call: StepCall, fn: Callable[..., Any], args: Any, kwargs: Any) -> Any:
    """Call a sync step on a thread of its own; give up on it after the step's timeout.

    A thread cannot be stopped from outside: one that times out runs on until
    the function returns, and its result is dropped. The run goes on at once.
    """
    done = threading.Event()
    outcome: list[Any] = []
    context = contextvars.copy_context()  # the step's idempotency key goes along

    def attempt() -> None:
        try:
            outcome.append((True, context.run(fn, *args, **kwargs)))
        except BaseException as exc:  # handed to the run's thread below
            outcome.append((False, exc))
        finally:
            done.set()

    threading.Thread(target=attempt, name=f"perdure-step-{call.key}", daemon=True).start()
    if not done.wait(call.opts.timeout):
        raise call.timed_out()
    ok, value = outcome[0]
    if not ok:
        raise value
    return value


def run(call: StepCall, fn: Callable[..., Any], args: Any, kwargs: Any) -> Any:
    """Run a step's attempts until one succeeds or the failure is final."""
    if call.replayed:
        return call.value
    # abandoned_on_cancel() and scope() written out: no generator per step.
    try:
        call.await_retry()
        while True:
            call.before()
            try:
                try:
                    token = _STEP_KEY.set(effects.idempotency_key(call.run_id, call.key))
                    try:
                        if call.opts.timeout is None:
                            value = fn(*args, **kwargs)
                        else:
                            value = _within(call, fn, args, kwargs)
                    finally:
                        _STEP_KEY.reset(token)
                except Exception as exc:
                    delay = call.failed(exc)
                else:
                    return call.succeeded(value)
            finally:
                call.end_attempt()
            call.await_retry()
            call.runtime.pause(delay)
    except errors.Canceled:
        call.abandon()
        raise


async def arun(call: StepCall, fn: Callable[..., Awaitable[Any]], args: Any, kwargs: Any) -> Any:
    """Run an ``async`` step's attempts; pauses between them yield the event loop."""
    if call.replayed:
        return call.value
    with call.abandoned_on_cancel():
        call.await_retry()
        while True:
            call.before()
            try:
                try:
                    with call.scope():
                        if call.opts.timeout is None:
                            value = await fn(*args, **kwargs)
                        else:
                            bound = asyncio.timeout(call.opts.timeout)
                            try:
                                async with bound:
                                    value = await fn(*args, **kwargs)
                            except TimeoutError:
                                if not bound.expired():
                                    raise  # the step's own TimeoutError
                                raise call.timed_out() from None
                except Exception as exc:
                    delay = call.failed(exc)
                else:
                    return call.succeeded(value)
            finally:
                call.end_attempt()
            call.await_retry()
            await asyncio.sleep(delay)
            call.runtime.check()


def run_transaction(call: StepCall, fn: Callable[..., Any], args: Any, kwargs: Any) -> Any:
    """Run ``fn(connection, ...)`` inside the transaction that records its outcome."""
    if call.replayed:
        return call.value
    with call.abandoned_on_cancel():
        try:
            return call.transact(lambda conn: fn(conn, *args, **kwargs))
        finally:
            call.end_attempt()
