"""OpenTelemetry for perdure: spans per run and step attempt, metrics, traces across processes.

Needs the ``perdure[otel]`` extra (``opentelemetry-api`` and ``-sdk``). Nothing
else in perdure imports this module; an app asks for it::

    import perdure, perdure.otel
    app = perdure.App(url, name="shop", telemetry=perdure.otel.OpenTelemetry())

Spans and metrics go to the global tracer and meter providers unless others
are given. ``app.start`` stores the caller's W3C trace context with the run,
so the worker that executes it, in any process on any host, continues the
caller's trace. See ``docs/observability.md`` for the spans, their attributes
and the metrics.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import metrics, trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from perdure import telemetry
from perdure.store import port

log = logging.getLogger("perdure.otel")

# Outcomes that make a span's status an error.
_ERRORS = frozenset({"failed", "retrying", "ambiguous", "needs_attention"})
# How long one census of the store serves the observable instruments.
_CENSUS_TTL = 1.0
_VERSION = "1"


class _Span:
    """An OpenTelemetry span, current in the flow that began it until it ends."""

    __slots__ = ("_done", "_on_end", "_token", "span")

    def __init__(
        self, span: trace.Span, on_end: Callable[[str, BaseException | None], None] | None = None
    ) -> None:
        self.span = span
        self._on_end = on_end
        self._done = False
        # Current while it lasts, so code it runs (an instrumented HTTP call in
        # a step) makes child spans.
        self._token: object | None = otel_context.attach(trace.set_span_in_context(span))

    def end(self, outcome: str, error: BaseException | None = None) -> None:
        if self._done:
            return
        self._done = True
        self.span.set_attribute("perdure.outcome", outcome)
        if error is not None:
            self.span.record_exception(error)
        if outcome in _ERRORS:
            detail = f"{type(error).__name__}: {error}" if error is not None else outcome
            self.span.set_status(trace.Status(trace.StatusCode.ERROR, detail))
        self.span.end()
        if self._token is not None:
            # Ended from another flow (it should not be): nothing to restore there.
            with contextlib.suppress(Exception):
                otel_context.detach(self._token)  # type: ignore[arg-type]
            self._token = None
        if self._on_end is not None:
            self._on_end(outcome, error)

    def trace_context(self) -> telemetry.Carrier | None:
        carrier: telemetry.Carrier = {}
        TraceContextTextMapPropagator().inject(carrier, trace.set_span_in_context(self.span))
        return carrier or None


class OpenTelemetry(telemetry.Telemetry):
    """The engine's hooks as OpenTelemetry spans and metrics.

    Args:
        tracer_provider: where spans go (default: the global provider).
        meter_provider: where metrics go (default: the global provider).
    """

    def __init__(
        self,
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: metrics.MeterProvider | None = None,
    ) -> None:
        self._tracer = trace.get_tracer("perdure", _VERSION, tracer_provider=tracer_provider)
        meter = metrics.get_meter("perdure", _VERSION, meter_provider=meter_provider)
        self._propagator = TraceContextTextMapPropagator()
        self._claims = meter.create_counter(
            "perdure.claims", unit="{run}", description="Runs claimed by workers."
        )
        self._step_duration = meter.create_histogram(
            "perdure.step.duration", unit="s", description="How long each step attempt ran."
        )
        self._retries = meter.create_counter(
            "perdure.step.retries",
            unit="{attempt}",
            description="Step attempts that failed and are run again.",
        )
        self._signal_latency = meter.create_histogram(
            "perdure.signal.resume_latency",
            unit="s",
            description="From a signal's delivery to the run applying it.",
        )
        meter.create_observable_gauge(
            "perdure.runs",
            callbacks=[self._observe_runs],
            unit="{run}",
            description="Runs of the app in each state.",
        )
        meter.create_observable_gauge(
            "perdure.timers.lag",
            callbacks=[self._observe_lag],
            unit="s",
            description="How long past its instant the most overdue timer or deadline is.",
        )
        self._watched: dict[str, Callable[[], telemetry.Census]] = {}
        self._census: dict[str, tuple[float, telemetry.Census]] = {}
        self._lock = threading.Lock()

    # -- trace context ---------------------------------------------------------------

    def trace_context(self) -> telemetry.Carrier | None:
        carrier: telemetry.Carrier = {}
        self._propagator.inject(carrier)
        return carrier or None

    # -- spans -----------------------------------------------------------------------

    def run_attempt(self, attempt: telemetry.RunAttempt) -> telemetry.Span:
        parent = (
            self._propagator.extract(attempt.trace_context)
            if attempt.trace_context
            else otel_context.Context()
        )
        span = self._tracer.start_span(
            f"run {attempt.workflow}",
            context=parent,
            attributes={
                "perdure.run_id": attempt.run_id,
                "perdure.app": attempt.app,
                "perdure.workflow": attempt.workflow,
                "perdure.version": attempt.version,
                "perdure.attempt": attempt.attempt,
                "perdure.recovered": attempt.recovered,
            },
        )
        return _Span(span)

    def step_attempt(self, run: telemetry.Span, attempt: telemetry.StepAttempt) -> telemetry.Span:
        parent = (
            trace.set_span_in_context(run.span)
            if isinstance(run, _Span)
            else otel_context.get_current()
        )
        span = self._tracer.start_span(
            f"step {attempt.step}",
            context=parent,
            attributes={
                "perdure.run_id": attempt.run_id,
                "perdure.app": attempt.app,
                "perdure.workflow": attempt.workflow,
                "perdure.version": attempt.version,
                "perdure.step": attempt.step,
                "perdure.attempt": attempt.attempt,
                "perdure.effect": attempt.effect,
            },
        )
        began = time.monotonic()
        labels = {
            "perdure.app": attempt.app,
            "perdure.workflow": attempt.workflow,
            "perdure.step": attempt.step,
            "perdure.effect": attempt.effect,
        }

        def ended(outcome: str, error: BaseException | None) -> None:
            self._step_duration.record(
                time.monotonic() - began, {**labels, "perdure.outcome": outcome}
            )
            if outcome == "retrying":
                self._retries.add(1, labels)

        return _Span(span, ended)

    # -- metrics ---------------------------------------------------------------------

    def claimed(self, app: str, count: int) -> None:
        self._claims.add(count, {"perdure.app": app})

    def signal_applied(self, app: str, workflow: str, latency: float) -> None:
        self._signal_latency.record(latency, {"perdure.app": app, "perdure.workflow": workflow})

    def watch(self, app: str, census: Callable[[], telemetry.Census]) -> None:
        with self._lock:
            self._watched[app] = census

    def unwatch(self, app: str) -> None:
        with self._lock:
            self._watched.pop(app, None)
            self._census.pop(app, None)

    def _counted(self) -> Iterable[tuple[str, telemetry.Census]]:
        """Each watched app's census, at most one store read per app per _CENSUS_TTL."""
        with self._lock:
            watched = dict(self._watched)
        now = time.monotonic()
        for app, census in watched.items():
            kept = self._census.get(app)
            if kept is None or now - kept[0] > _CENSUS_TTL:
                try:
                    kept = (now, census())
                except Exception as exc:  # the store is down: report nothing this time
                    log.debug("census of app %s failed: %s", app, exc)
                    continue
                self._census[app] = kept
            yield app, kept[1]

    def _observe_runs(self, options: Any) -> Iterable[metrics.Observation]:
        for app, census in self._counted():
            for state in port.RUN_STATES:
                count = census.states.get(state, 0)
                yield metrics.Observation(count, {"perdure.app": app, "perdure.state": state})

    def _observe_lag(self, options: Any) -> Iterable[metrics.Observation]:
        for app, census in self._counted():
            yield metrics.Observation(census.timer_lag, {"perdure.app": app})
