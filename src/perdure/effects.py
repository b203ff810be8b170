"""Effect classes, retry policy, backoff and idempotency keys: pure functions."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from perdure import errors

Effect = Literal["pure", "idempotent", "once"]
EFFECTS: tuple[Effect, ...] = ("pure", "idempotent", "once")


@dataclass(frozen=True)
class Retry:
    """How a failing step is retried inside one execution.

    ``max_attempts`` counts the first try. Delays grow as
    ``initial_delay * multiplier**(attempt-1)``, capped at ``max_delay``, with
    full jitter when ``jitter`` is true. Only exceptions that are instances of
    ``retry_on`` and not of ``give_up_on`` are retried. A pause longer than
    ``park_after`` seconds parks the run until the next attempt is due (a
    durable timer, like ``ctx.sleep``): the worker is free meanwhile, and the
    retry survives a restart.
    """

    max_attempts: int = 3
    initial_delay: float = 0.1
    multiplier: float = 2.0
    max_delay: float = 30.0
    jitter: bool = True
    retry_on: tuple[type[BaseException], ...] = (Exception,)
    give_up_on: tuple[type[BaseException], ...] = field(default=())
    # A pause longer than this parks the run (a durable timer) instead of
    # holding its worker: the next attempt is due at a journaled instant.
    park_after: float = 5.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise errors.InvalidInput(f"Retry.max_attempts must be >= 1, got {self.max_attempts}")
        if self.initial_delay < 0 or self.max_delay < 0 or self.multiplier < 1:
            raise errors.InvalidInput("Retry delays must be >= 0 and multiplier >= 1")
        if not self.park_after >= 0:
            raise errors.InvalidInput(f"Retry.park_after must be >= 0, got {self.park_after}")

    def should_retry(self, attempt: int, exc: BaseException) -> bool:
        """Return whether a step that failed on ``attempt`` with ``exc`` runs again."""
        if attempt >= self.max_attempts:
            return False
        if isinstance(exc, self.give_up_on):
            return False
        return isinstance(exc, self.retry_on)

    def delay(self, attempt: int, rng: Callable[[], float] = random.random) -> float:
        """Return the pause in seconds before attempt ``attempt + 1``."""
        try:
            ceiling = min(self.max_delay, self.initial_delay * self.multiplier ** (attempt - 1))
        except OverflowError:
            ceiling = self.max_delay if self.initial_delay > 0 else 0.0
        return float(ceiling * rng()) if self.jitter else float(ceiling)


DEFAULT_RETRY = Retry()
NO_RETRY = Retry(max_attempts=1)


@dataclass(frozen=True)
class StepOptions:
    """What ``@app.step`` declared for a function."""

    name: str
    effect: Effect = "idempotent"
    retry: Retry = DEFAULT_RETRY
    transactional: bool = False
    # Seconds an attempt may run before it fails with StepTimedOut; None: no bound.
    timeout: float | None = None
    # Called in a dry run in place of the step, with its arguments (see perdure.dryrun).
    dry_run: Callable[..., Any] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.timeout is not None and not self.timeout > 0:
            raise errors.InvalidInput(f"a step timeout must be positive, got {self.timeout!r}")
        if self.effect not in EFFECTS:
            raise errors.InvalidInput(
                f"effect must be one of {', '.join(EFFECTS)}, got {self.effect!r}"
            )
        if not self.name or "#" in self.name or "/" in self.name:
            raise errors.InvalidInput(f"step name {self.name!r} must be non-empty without # or /")


def step_key(name: str, count: int) -> str:
    """Return the journal key of the ``count``-th call of step ``name`` in a run."""
    return name if count == 1 else f"{name}#{count}"


def idempotency_key(run_id: str, key: str) -> str:
    """Return the stable key an idempotent step passes to outside systems."""
    return f"{run_id}/{key}"


def release_backoff(failures: int, base: float = 1.0, cap: float = 300.0) -> float:
    """Return how long a run whose attempts keep failing waits before the next claim."""
    # The exponent is bounded so that a very long streak cannot overflow.
    return float(min(cap, base * 2 ** min(max(0, failures - 1), 64)))


def options_of(fn: Any) -> StepOptions | None:
    """Return the options ``@app.step`` attached to ``fn``, if any."""
    opts = getattr(fn, "__perdure_step__", None)
    return opts if isinstance(opts, StepOptions) else None
