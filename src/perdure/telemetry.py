"""The engine's instrumentation hooks, and the default that does nothing.

The engine calls a :class:`Telemetry` at fixed points: when a caller starts a
run (to keep the caller's trace context with it), around each attempt of a
run and of a step, when a worker claims runs, when a signal is applied on
resume, and once per worker to watch the store (runs by state, lag of due
timers). The default does nothing and imports nothing, so an app that does
not ask for telemetry pays a no-op method call per hook. ``perdure.otel``
implements the hooks with OpenTelemetry (the ``perdure[otel]`` extra)::

    import perdure.otel
    app = perdure.App(url, name="shop", telemetry=perdure.otel.OpenTelemetry())

Outcomes a span ends with: a run attempt ``succeeded``, ``failed``,
``canceled``, ``needs_attention``, ``parked``, ``released`` or ``stale``; a
step attempt ``succeeded``, ``retrying`` (it failed and runs again),
``failed`` (it failed for good), ``ambiguous`` (a ``once`` effect whose
outcome is unknown) or ``interrupted`` (the run stopped during it).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeAlias

# A trace context as propagated between processes: W3C ``traceparent`` (and
# ``tracestate``) headers. It is kept in a run's input record under ``trace``,
# next to ``args`` and ``kwargs``, so it needs no column and every store keeps
# it; it is not one of the run's inputs (a keyed start ignores it).
Carrier: TypeAlias = dict[str, str]


def with_trace(input_text: str, carrier: Carrier | None) -> str:
    """Return a run's input record (JSON text) carrying ``carrier``."""
    if not carrier:
        return input_text
    record = json.loads(input_text)
    record["trace"] = carrier
    return json.dumps(record, separators=(",", ":"))


def trace_of(input_text: str) -> Carrier | None:
    """Return the trace context a run's input record carries, or None.

    A malformed one is ignored: it only decides where the run's spans hang.
    """
    try:
        record: Any = json.loads(input_text)
    except ValueError:
        return None
    found = record.get("trace") if isinstance(record, dict) else None
    if not isinstance(found, dict):
        return None
    return {str(k): v for k, v in found.items() if isinstance(v, str)}


class Span(Protocol):
    """One attempt being observed; ended once (later calls are ignored)."""

    def end(self, outcome: str, error: BaseException | None = None) -> None:
        """End the attempt with ``outcome`` (and the exception that caused it, if any)."""

    def trace_context(self) -> Carrier | None:
        """Return this span's context, to store with a run it starts, or None."""


class _NoSpan:
    __slots__ = ()

    def end(self, outcome: str, error: BaseException | None = None) -> None:
        return None

    def trace_context(self) -> Carrier | None:
        return None


NO_SPAN: Span = _NoSpan()


@dataclass(frozen=True)
class RunAttempt:
    """A claimed run about to execute: ``attempt`` is its execution generation."""

    run_id: str
    app: str
    workflow: str
    version: str
    attempt: int
    recovered: bool
    trace_context: Carrier | None


@dataclass(frozen=True)
class StepAttempt:
    """One attempt (1, 2, ...) of a step at its journal position."""

    run_id: str
    app: str
    workflow: str
    version: str
    step: str
    attempt: int
    effect: str


@dataclass(frozen=True)
class Census:
    """The store's view of an app: runs by state, and how late the most overdue timer is."""

    states: Mapping[str, int]
    timer_lag: float


class Telemetry:
    """The hooks the engine calls; this base class does nothing. Override what you observe."""

    def trace_context(self) -> Carrier | None:
        """Return the caller's current trace context to store with a run it starts."""
        return None

    def run_attempt(self, attempt: RunAttempt) -> Span:
        """Begin observing a run attempt (parented from ``attempt.trace_context``)."""
        return NO_SPAN

    def step_attempt(self, run: Span, attempt: StepAttempt) -> Span:
        """Begin observing a step attempt inside the run attempt ``run``."""
        return NO_SPAN

    def claimed(self, app: str, count: int) -> None:
        """Note that a worker of ``app`` claimed ``count`` runs."""

    def signal_applied(self, app: str, workflow: str, latency: float) -> None:
        """Note that a run applied a signal ``latency`` seconds after it was delivered."""

    def watch(self, app: str, census: Callable[[], Census]) -> None:
        """Observe the store through ``census`` (called when metrics are collected)."""

    def unwatch(self, app: str) -> None:
        """Stop observing the store for ``app`` (its worker stopped)."""


NONE = Telemetry()
