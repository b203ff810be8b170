"""examples/fastapi_app: start a run over HTTP, pay it through the webhook, read it back.

The service module is loaded afresh for each test with ``$PERDURE_STORE``
naming the test's store, as it would be deployed; FastAPI's TestClient runs
its lifespan, so the worker it embeds serves the runs.
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from fastapi.testclient import TestClient

SERVICE = Path(__file__).resolve().parents[2] / "examples" / "fastapi_app" / "app.py"
LIMIT = 30.0


@pytest.fixture
def service(store_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    monkeypatch.setenv("PERDURE_STORE", store_url)
    spec = importlib.util.spec_from_file_location("fastapi_app_example", SERVICE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    try:
        yield module
    finally:
        module.flow.close()


def settled(http: TestClient, run_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + LIMIT
    while True:
        body: dict[str, Any] = http.get(f"/orders/{run_id}").json()
        if body["state"] not in ("queued", "running", "waiting"):
            return body
        if time.monotonic() > deadline:
            raise AssertionError(f"run {run_id} still {body['state']} after {LIMIT}s")
        time.sleep(0.02)


def test_an_order_started_over_http_is_paid_once_through_a_redelivered_webhook(
    service: ModuleType,
) -> None:
    with TestClient(service.api) as http:
        started = http.post("/orders", json={"order_id": "o-17", "items": 2})
        assert started.status_code == 202, started.text
        run_id = started.json()["run_id"]
        assert started.json()["created"] is True
        again = http.post("/orders", json={"order_id": "o-17", "items": 2})
        assert again.json() == {"run_id": run_id, "created": False}

        event = {"event_id": "evt_1", "run_id": run_id, "status": "paid"}
        first = http.post("/webhooks/payments", json=event)
        assert first.status_code == 200, first.text
        redelivered = http.post("/webhooks/payments", json=event)
        assert redelivered.status_code == 200, redelivered.text
        assert redelivered.json() == first.json()
        assert first.json()["outcome"] == "signaled"
        assert first.json()["signal_id"] == "evt_1"

        done = settled(http, run_id)
        assert done["state"] == "succeeded", done
        assert done["result"] == {
            "order": "o-17",
            "status": "shipped",
            "cents": 2500,
            "tracking": "TRK-o-17",
        }
        assert service.carrier.shipments == [f"{run_id}/ship"]  # one effect

        # After the end: the provider's retry still gets its receipt; another event is refused.
        assert http.post("/webhooks/payments", json=event).json() == first.json()
        other = http.post("/webhooks/payments", json={**event, "event_id": "evt_2"})
        assert other.status_code == 409, other.text
        assert other.json()["error"]["code"] == "wait_settled"
        assert other.json()["receipt"]["signal_id"] == "evt_1"
    assert service.carrier.shipments == [f"{run_id}/ship"]


def test_unknown_runs_and_conflicting_orders_are_refused_with_a_status(
    service: ModuleType,
) -> None:
    with TestClient(service.api) as http:
        assert http.get("/orders/nope").status_code == 404
        missing = http.post(
            "/webhooks/payments", json={"event_id": "e", "run_id": "nope", "status": "paid"}
        )
        assert missing.status_code == 404
        assert missing.json()["error"]["code"] == "run_not_found"
        assert http.post("/orders", json={"order_id": "o-1", "items": 1}).status_code == 202
        conflict = http.post("/orders", json={"order_id": "o-1", "items": 5})
        assert conflict.status_code == 409
        assert http.post("/orders", json={"order_id": "", "items": 1}).status_code == 422
