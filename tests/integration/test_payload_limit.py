"""Payload limits: a payload over the app's limit is refused before anything is stored.

Inputs, signals, messages and resolved outputs are refused in the caller's
process; step outputs, workflow results and child inputs in the worker, where
the step or the run fails with the same error (a ``once`` step whose output
cannot be recorded is ambiguous: the effect happened).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import perdure
from perdure import codec

LIMIT = 1000
WORKER: dict[str, Any] = {"concurrency": 2, "lease_ttl": 3, "heartbeat": 1, "poll_interval": 0.05}
BIG = "x" * 2000


@pytest.fixture
def app(store_url: str) -> Iterator[perdure.App]:
    made = perdure.App(store_url, name="limits", payload_limit=LIMIT)

    @made.step()
    def echo(value: str) -> str:
        return value

    @made.step(effect="once", retry=perdure.Retry(max_attempts=1))
    def send_mail(value: str) -> str:
        return value

    @made.workflow()
    def gate(ctx: perdure.Context, *args: Any) -> Any:
        return ctx.wait("data")

    @made.workflow()
    def big_step(ctx: perdure.Context, value: str) -> str:
        return echo(value * 3)

    @made.workflow()
    def big_once(ctx: perdure.Context, value: str) -> str:
        return send_mail(value * 3)

    @made.workflow()
    def big_result(ctx: perdure.Context, value: str) -> str:
        return value * 3

    @made.workflow()
    def big_event(ctx: perdure.Context, value: str) -> str:
        ctx.set_event("status", value * 3)
        return "set"

    @made.workflow()
    def big_item(ctx: perdure.Context, value: str) -> str:
        ctx.write_stream("progress", value * 3)
        return "written"

    @made.workflow()
    def big_child(ctx: perdure.Context, value: str) -> str:
        return str(ctx.start_child(gate, value * 3).run_id)

    yield made
    made.close()


def test_the_callers_payloads_are_refused_before_anything_is_stored(app: perdure.App) -> None:
    rid = app.start("gate").run_id
    before = (app.runs(limit=100), app.store.outcomes(rid), [h.kind for h in app.history(rid)])
    for refused in (
        lambda: app.start("gate", BIG),
        lambda: app.signal(rid, "data", BIG),
        lambda: app.send(rid, "inbox", "k", BIG),
        lambda: app.update(rid, "add", BIG, update_id="u-1", timeout=1),
    ):
        with pytest.raises(perdure.PayloadTooLarge) as caught:
            refused()
        assert caught.value.code == "payload_too_large"
        assert isinstance(caught.value, perdure.InvalidPayload)
        assert (caught.value.limit, caught.value.size) == (
            LIMIT,
            len(codec.encode(BIG))
            + (len('{"args":[],"kwargs":{}}') if "input" in str(caught.value) else 0),
        )
        assert "1,000 bytes" in str(caught.value)
    assert (app.runs(limit=100), app.store.outcomes(rid), [h.kind for h in app.history(rid)]) == (
        before
    )
    # The limit is on the JSON text: exactly at it is accepted, one byte over is not.
    at_limit = "x" * (LIMIT - 2)
    assert len(codec.encode(at_limit)) == LIMIT
    with pytest.raises(perdure.PayloadTooLarge):
        app.send(rid, "inbox", "k", at_limit + "x")
    assert app.send(rid, "inbox", "k", at_limit) is True
    assert app.signal(rid, "data", at_limit).outcome == "signaled"


def test_the_workers_payloads_fail_the_step_or_the_run(app: perdure.App) -> None:
    chunk = "y" * 400  # fits as an input, not once tripled
    with app.worker(**WORKER):
        step = app.start("big_step", chunk)
        once = app.start("big_once", chunk)
        result = app.start("big_result", chunk)
        child = app.start("big_child", chunk)
        event = app.start("big_event", chunk)
        item = app.start("big_item", chunk)
        for handle in (step, result, child, event, item):
            with pytest.raises(perdure.RunFailed) as failed:
                handle.result(timeout=30)
            assert "over the limit of 1,000 bytes" in str(failed.value)
        with pytest.raises(perdure.RunFailed) as ambiguous:
            once.result(timeout=30)
    assert ambiguous.value.state == "needs_attention"
    assert (ambiguous.value.error or {}).get("code") == "effect_outcome_unknown"
    assert app.get(child.run_id).error is not None
    assert [r.workflow for r in app.runs(limit=100) if r.workflow == "gate"] == []
    journal = [(e.name, e.status) for e in app.store.journal(step.run_id)]
    assert journal == [("echo", "error")]


def test_a_limit_below_one_byte_is_refused(sqlite_url: str) -> None:
    with pytest.raises(perdure.InvalidInput, match="payload_limit"):
        perdure.App(sqlite_url, name="limits", payload_limit=0)
