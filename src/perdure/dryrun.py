"""A step call in a dry run: described in the journal instead of performed.

In a dry run, ``pure`` steps run as always; ``idempotent`` and ``once`` steps
and transaction steps have effects outside the run, so none of them is called.
Each is recorded as a completed step whose value is what its ``dry_run=`` stub
returns (called with the step's arguments), or ``None``; a ``step_described``
receipt with the digest of its arguments says what would have been called.
A replay returns the recorded value, as for any step, so the stub is called
once per call site and a dry run stays deterministic.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import datetime
from typing import Any

from perdure import codec, effects, journal, payloads, steps, telemetry


def described(opts: effects.StepOptions) -> bool:
    """Whether a dry run describes this step instead of calling it."""
    return opts.transactional or opts.effect != "pure"


def arguments_digest(args: Any, kwargs: dict[str, Any]) -> str:
    """Return a stable digest of a call's arguments (their JSON, else their repr)."""
    try:
        text = codec.encode({"args": list(args), "kwargs": kwargs}, envelope=2)
    except Exception:
        # Arguments a step takes need not be JSON; the description still names them.
        text = repr((list(args), sorted(kwargs.items())))
    digest = codec.digest(text)
    assert digest is not None
    return digest


def stub_of(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Return the callable a dry run calls in place of the step ``fn``."""
    stub = steps.options(fn).dry_run

    def describe(*args: Any, **kwargs: Any) -> Any:
        return None if stub is None else stub(*args, **kwargs)

    return describe


def call(
    runtime: steps.Runtime,
    run_id: str,
    fn: Callable[..., Any],
    opts: effects.StepOptions,
    key: str,
    position: int,
    recorded: journal.Entry | None,
    args: Any,
    kwargs: dict[str, Any],
) -> steps.StepCall:
    """Return the step call that records the stub's value in place of ``fn``'s.

    The call runs once, without retries or a timeout: the stub is the
    caller's own code standing in for the effect, and its failure is the
    step's failure.
    """
    mark = journal.Mark("step_described", key, arguments_digest(args, kwargs), _effect(opts))
    plain = dataclasses.replace(
        opts, effect="idempotent", retry=effects.NO_RETRY, timeout=None, transactional=False
    )
    # A stub's value is read back as the step's declared return type; the
    # None of a step without one is returned as it is.
    typed = fn if opts.dry_run is not None else stub_of(fn)
    return steps.StepCall(_Describing(runtime, mark), run_id, typed, plain, key, position, recorded)


def _effect(opts: effects.StepOptions) -> str:
    return "transaction" if opts.transactional else opts.effect


class _Describing:
    """The runtime of a described step: its outcome's write carries the description."""

    def __init__(self, runtime: steps.Runtime, mark: journal.Mark) -> None:
        self._runtime = runtime
        self._mark = mark

    @property
    def payload_limit(self) -> int:
        return self._runtime.payload_limit

    @property
    def payloads(self) -> payloads.Payloads:
        return self._runtime.payloads

    def check(self) -> None:
        self._runtime.check()

    def pause(self, seconds: float) -> None:
        self._runtime.pause(seconds)

    def now(self) -> datetime:
        return self._runtime.now()

    def recorded(self, position: int) -> journal.Entry | None:
        return self._runtime.recorded(position)

    def begin_effect(self, entry: journal.Entry, marks: list[journal.Mark]) -> None:
        self._runtime.begin_effect(entry, marks)

    def finish_step(self, entry: journal.Entry, marks: list[journal.Mark]) -> None:
        self._runtime.finish_step(entry, [*marks, self._mark])

    def transaction_step(
        self, body: Callable[[Any], journal.Entry], marks: list[journal.Mark]
    ) -> journal.Entry:
        return self._runtime.transaction_step(body, marks)

    def step_attempt(self, key: str, effect: str, attempt: int) -> telemetry.Span:
        return self._runtime.step_attempt(key, effect, attempt)
