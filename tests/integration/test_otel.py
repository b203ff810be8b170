"""OpenTelemetry: spans per run and step attempt, metrics, and a trace that crosses processes.

Spans go to the SDK's in-memory exporter and metrics to its in-memory reader;
the cross-process test has the worker's process export its spans as JSON
lines to a file. Runs on SQLite and PostgreSQL.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from test_runs import WORKER, wait_for, wait_state

import perdure
import perdure.otel
from perdure import telemetry
from perdure.testing.clock import FakeClock


@dataclass
class Otel:
    spans: InMemorySpanExporter
    reader: InMemoryMetricReader
    tracer_provider: TracerProvider
    telemetry: perdure.otel.OpenTelemetry

    def finished(self, prefix: str) -> list[ReadableSpan]:
        return [s for s in self.spans.get_finished_spans() if s.name.startswith(prefix)]

    def metrics(self) -> dict[str, list[Any]]:
        """Each metric's data points by name, as collected now."""
        found: dict[str, list[Any]] = {}
        data = self.reader.get_metrics_data()
        for resource in data.resource_metrics if data else []:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    found.setdefault(metric.name, []).extend(metric.data.data_points)
        return found


@pytest.fixture
def otel() -> Iterator[Otel]:
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    hooks = perdure.otel.OpenTelemetry(
        tracer_provider=tracer_provider, meter_provider=meter_provider
    )
    yield Otel(spans, reader, tracer_provider, hooks)
    tracer_provider.shutdown()
    meter_provider.shutdown()


def attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def test_a_run_with_a_retried_step_and_a_signal_makes_spans_and_metrics(
    make_app: Any, otel: Otel
) -> None:
    app = make_app(telemetry=otel.telemetry)
    calls = {"n": 0}

    @app.step(retry=perdure.Retry(max_attempts=3, initial_delay=0))
    def reserve(order_id: str) -> str:
        calls["n"] += 1
        if calls["n"] == 1:
            raise ConnectionError("inventory unreachable")
        return f"held {order_id}"

    @app.step(effect="once")
    def charge(order_id: str) -> str:
        return f"charged {order_id}"

    @app.workflow(version="4")
    def checkout(ctx: perdure.Context, order_id: str) -> str:
        hold = reserve(order_id)
        ctx.wait("approve")
        return f"{hold}, {charge(order_id)}"

    caller_tracer = otel.tracer_provider.get_tracer("caller")
    with caller_tracer.start_as_current_span("POST /orders") as caller:
        handle = app.start(checkout, "o-1")
    with app.worker(**WORKER):
        wait_state(app, handle.run_id, "waiting")
        app.signal(handle.run_id, "approve", True)
        assert handle.result(timeout=15) == "held o-1, charged o-1"
        collected = otel.metrics()

    runs = sorted(otel.finished("run "), key=lambda s: s.start_time or 0)
    assert [s.name for s in runs] == ["run checkout", "run checkout"]
    assert [attrs(s)["perdure.outcome"] for s in runs] == ["parked", "succeeded"]
    assert [attrs(s)["perdure.attempt"] for s in runs] == [1, 2]
    for span in runs:
        # Both attempts continue the caller's trace, as its children.
        assert span.context is not None and span.parent is not None
        assert span.context.trace_id == caller.get_span_context().trace_id
        assert span.parent.span_id == caller.get_span_context().span_id
        assert {
            k: attrs(span)[k]
            for k in ("perdure.run_id", "perdure.app", "perdure.workflow", "perdure.version")
        } == {
            "perdure.run_id": handle.run_id,
            "perdure.app": app.name,
            "perdure.workflow": "checkout",
            "perdure.version": "4",
        }

    steps = sorted(otel.finished("step "), key=lambda s: s.start_time or 0)
    assert [(s.name, attrs(s)["perdure.attempt"], attrs(s)["perdure.outcome"]) for s in steps] == [
        ("step reserve", 1, "retrying"),
        ("step reserve", 2, "succeeded"),
        ("step charge", 1, "succeeded"),
    ]
    assert [attrs(s)["perdure.effect"] for s in steps] == ["idempotent", "idempotent", "once"]
    first_run, second_run = runs
    for step, run in zip(steps, (first_run, first_run, second_run), strict=True):
        assert step.parent is not None and run.context is not None
        assert step.parent.span_id == run.context.span_id
        assert attrs(step)["perdure.step"] in ("reserve", "charge")
        assert attrs(step)["perdure.run_id"] == handle.run_id
    failed = steps[0]
    assert failed.status.status_code is StatusCode.ERROR
    assert [e.name for e in failed.events] == ["exception"]
    assert failed.events[0].attributes is not None
    assert failed.events[0].attributes["exception.type"] == "ConnectionError"
    assert steps[1].status.status_code is not StatusCode.ERROR

    claims = sum(p.value for p in collected["perdure.claims"])
    assert claims == 2
    durations = {
        (p.attributes["perdure.step"], p.attributes["perdure.outcome"]): p.count
        for p in collected["perdure.step.duration"]
    }
    assert durations == {
        ("reserve", "retrying"): 1,
        ("reserve", "succeeded"): 1,
        ("charge", "succeeded"): 1,
    }
    [retries] = collected["perdure.step.retries"]
    assert (retries.value, retries.attributes["perdure.step"]) == (1, "reserve")
    [latency] = collected["perdure.signal.resume_latency"]
    assert latency.count == 1 and latency.min >= 0
    states = {
        p.attributes["perdure.state"]: p.value
        for p in collected["perdure.runs"]
        if p.attributes["perdure.app"] == app.name
    }
    assert states["succeeded"] == 1 and states["queued"] == 0
    assert [p.value for p in collected["perdure.timers.lag"]] == [0.0]


def test_a_failed_step_ends_its_span_and_the_run_span_as_errors(make_app: Any, otel: Otel) -> None:
    app = make_app(telemetry=otel.telemetry)

    @app.step(retry=perdure.Retry(max_attempts=1))
    def fetch() -> None:
        raise TimeoutError("slow")

    @app.workflow()
    def poll(ctx: perdure.Context) -> None:
        fetch()

    handle = app.start(poll)  # no caller span: the run's trace starts here
    with app.worker(**WORKER):
        wait_state(app, handle.run_id, "failed")
        wait_for(lambda: otel.finished("run "), "the run span")
    [run] = otel.finished("run ")
    [step] = otel.finished("step ")
    assert run.parent is None
    assert attrs(run)["perdure.outcome"] == "failed"
    assert run.status.status_code is StatusCode.ERROR
    assert attrs(step)["perdure.outcome"] == "failed"
    assert step.status.status_code is StatusCode.ERROR


def test_a_child_run_continues_its_parents_trace(make_app: Any, otel: Otel) -> None:
    app = make_app(telemetry=otel.telemetry)

    @app.workflow()
    def ship(ctx: perdure.Context, order_id: str) -> str:
        return f"shipped {order_id}"

    @app.workflow()
    def order(ctx: perdure.Context, order_id: str) -> str:
        result: str = ctx.start_child(ship, order_id).result()
        return result

    handle = app.start(order, "o-9")
    with app.worker(**WORKER):
        assert handle.result(timeout=15) == "shipped o-9"
    parent_first = min(otel.finished("run order"), key=lambda s: s.start_time or 0)
    [child] = otel.finished("run ship")
    assert parent_first.context is not None and child.parent is not None
    assert child.context is not None
    assert child.context.trace_id == parent_first.context.trace_id
    assert child.parent.span_id == parent_first.context.span_id


def test_the_timer_lag_gauge_reports_the_most_overdue_timer(
    make_app: Any, otel: Otel, store_url: str
) -> None:
    clock = FakeClock(datetime(2031, 1, 1, tzinfo=UTC))
    app = make_app(clock=clock, telemetry=otel.telemetry)

    @app.workflow()
    def nap(ctx: perdure.Context) -> None:
        ctx.sleep(timedelta(seconds=10))

    handle = app.start(nap)
    [claimed] = app.store.claim(app.name, "w-1", app.workflow_versions(), lease_ttl=30, limit=1)
    assert app.store.park(claimed.claim, [], [], wake_at=clock.now() + timedelta(seconds=10))
    clock.advance(70)
    worker = app.worker(**WORKER)  # not started: its census is what the gauges read
    census = worker.census()
    assert census == telemetry.Census({"waiting": 1}, 60.0)
    otel.telemetry.watch(app.name, worker.census)
    [lag] = otel.metrics()["perdure.timers.lag"]
    assert (lag.value, lag.attributes["perdure.app"]) == (60.0, app.name)
    assert handle.run_id


WORKER_SCRIPT = textwrap.dedent(
    """
    import sys, time
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

    spans_file, store_url, run_id = sys.argv[1:4]
    out = open(spans_file, "w", encoding="utf-8")
    provider = TracerProvider()
    provider.add_span_processor(
        SimpleSpanProcessor(
            ConsoleSpanExporter(out=out, formatter=lambda s: s.to_json(indent=None) + "\\n")
        )
    )
    trace.set_tracer_provider(provider)

    import perdure, perdure.otel

    app = perdure.App(store_url, name="traced", telemetry=perdure.otel.OpenTelemetry())

    @app.step()
    def pack(order_id: str) -> str:
        return "packed " + order_id

    @app.workflow()
    def fulfil(ctx: perdure.Context, order_id: str) -> str:
        return pack(order_id)

    worker = app.worker(lease_ttl=3, heartbeat=1, poll_interval=0.2).start()
    deadline = time.monotonic() + 30
    while app.get(run_id).state != "succeeded" and time.monotonic() < deadline:
        time.sleep(0.05)
    worker.stop(timeout=10)
    provider.shutdown()
    out.close()
    app.close()
    """
)


@pytest.mark.slow
def test_a_worker_in_another_process_continues_the_callers_trace(
    store_url: str, otel: Otel, tmp_path: Path
) -> None:
    app = perdure.App(store_url, name="traced", telemetry=otel.telemetry)

    @app.workflow()
    def fulfil(ctx: perdure.Context, order_id: str) -> str:
        raise AssertionError("runs in the worker process")

    try:
        with otel.tracer_provider.get_tracer("caller").start_as_current_span("checkout") as caller:
            handle = app.start(fulfil, "o-3")
        spans_file = tmp_path / "spans.jsonl"
        script = tmp_path / "traced_worker.py"
        script.write_text(WORKER_SCRIPT, encoding="utf-8")
        done = subprocess.run(
            [sys.executable, str(script), str(spans_file), store_url, handle.run_id],
            env={**os.environ},
            capture_output=True,
            text=True,
            timeout=90,
        )
        assert done.returncode == 0, done.stderr
        assert app.get(handle.run_id).state == "succeeded"
    finally:
        app.close()
    exported = [json.loads(line) for line in spans_file.read_text().splitlines()]
    by_name = {span["name"]: span for span in exported}
    assert set(by_name) == {"run fulfil", "step pack"}
    trace_id = f"0x{caller.get_span_context().trace_id:032x}"
    run, step = by_name["run fulfil"], by_name["step pack"]
    assert run["context"]["trace_id"] == trace_id
    assert run["parent_id"] == f"0x{caller.get_span_context().span_id:016x}"
    assert step["context"]["trace_id"] == trace_id
    assert step["parent_id"] == run["context"]["span_id"]
    assert run["attributes"]["perdure.run_id"] == handle.run_id
    assert step["attributes"]["perdure.outcome"] == "succeeded"


NO_OTEL = textwrap.dedent(
    """
    import sys
    import perdure

    app = perdure.App(sys.argv[1], name="plain")

    @app.step()
    def add(a: int, b: int) -> int:
        return a + b

    @app.workflow()
    def total(ctx: perdure.Context) -> int:
        return add(1, 2)

    handle = app.start(total)
    with app.worker(lease_ttl=3, heartbeat=1, poll_interval=0.2):
        assert handle.result(timeout=30) == 3
    app.close()
    loaded = sorted(m for m in sys.modules if m.startswith("opentelemetry") or m == "perdure.otel")
    print(",".join(loaded))
    """
)


def test_the_core_does_not_import_opentelemetry_when_telemetry_is_off(
    store_url: str, tmp_path: Path
) -> None:
    script = tmp_path / "plain.py"
    script.write_text(NO_OTEL, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(script), store_url], capture_output=True, text=True, timeout=90
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ""


def test_a_keyed_start_from_another_trace_returns_the_same_run(make_app: Any, otel: Otel) -> None:
    app = make_app(telemetry=otel.telemetry)

    @app.workflow()
    def once(ctx: perdure.Context, n: int) -> int:
        return n

    tracer = otel.tracer_provider.get_tracer("caller")
    key = f"k-{uuid.uuid4().hex}"
    with tracer.start_as_current_span("first"):
        first = app.start(once, 1, key=key)
    with tracer.start_as_current_span("second"):
        second = app.start(once, 1, key=key)
    assert second.run_id == first.run_id and not second.created
    with pytest.raises(perdure.errors.KeyConflict):
        app.start(once, 2, key=key)


def test_async_steps_gathered_make_one_span_per_attempt(make_app: Any, otel: Otel) -> None:
    app = make_app(telemetry=otel.telemetry)
    calls = {"a": 0}

    @app.step(retry=perdure.Retry(max_attempts=2, initial_delay=0))
    async def fetch_a() -> str:
        calls["a"] += 1
        if calls["a"] == 1:
            raise ConnectionError("a down")
        return "a"

    @app.step()
    async def fetch_b() -> str:
        return "b"

    @app.workflow()
    async def both(ctx: perdure.Context) -> list[str]:
        return list(await asyncio.gather(fetch_a(), fetch_b()))

    handle = app.start(both)
    with app.worker(**WORKER):
        assert handle.result(timeout=15) == ["a", "b"]
    [run] = otel.finished("run ")
    steps = otel.finished("step ")
    assert sorted(
        (s.name, attrs(s)["perdure.attempt"], attrs(s)["perdure.outcome"]) for s in steps
    ) == [
        ("step fetch_a", 1, "retrying"),
        ("step fetch_a", 2, "succeeded"),
        ("step fetch_b", 1, "succeeded"),
    ]
    assert run.context is not None
    assert all(s.parent is not None and s.parent.span_id == run.context.span_id for s in steps)
