"""An order service on FastAPI: HTTP starts, signals and reads perdure runs.

- ``POST /orders`` starts an ``order`` run (the order id is its key, so a
  retried request returns the same run);
- ``POST /webhooks/payments`` is where the payment provider reports; it
  signals the run, and the provider's event id is the signal id, so a
  redelivered event is applied once;
- ``GET /orders/{run_id}`` reads the run's state and result.

The worker runs inside the service (threads started in FastAPI's lifespan),
unless ``ORDERS_EMBEDDED_WORKER=0``: then run ``perdure worker app:flow``
beside it. The store is ``$PERDURE_STORE`` (default ``sqlite:///perdure.db``).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

from fastapi import FastAPI, HTTPException
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

import perdure

flow = perdure.App(name="orders")


class Carrier:
    """Stands in for a shipping provider's API; remembers what it was asked to ship."""

    def __init__(self) -> None:
        self.shipments: list[str] = []

    def ship(self, order_id: str, idempotency_key: str) -> str:
        self.shipments.append(idempotency_key)
        return f"TRK-{order_id}"


carrier = Carrier()


@flow.step()
def reserve(order_id: str, items: int) -> int:
    return items * 1250


@flow.step()
def ship(order_id: str) -> str:
    return carrier.ship(order_id, perdure.idempotency_key())


@flow.workflow(version="1")
def order(ctx: perdure.Context, order_id: str, items: int) -> dict[str, Any]:
    cents = reserve(order_id, items)
    try:
        payment = ctx.wait("payment", timeout=timedelta(hours=1))
    except perdure.WaitTimedOut:
        return {"order": order_id, "status": "expired"}
    if payment.get("status") != "paid":
        return {"order": order_id, "status": "unpaid"}
    return {"order": order_id, "status": "shipped", "cents": cents, "tracking": ship(order_id)}


@asynccontextmanager
async def lifespan(api: FastAPI) -> AsyncIterator[None]:
    embedded = os.environ.get("ORDERS_EMBEDDED_WORKER", "1") != "0"
    worker = flow.worker(concurrency=4).start() if embedded else None
    try:
        yield
    finally:
        if worker is not None:
            # stop() lets in-flight steps finish; keep the event loop free meanwhile.
            await asyncio.to_thread(worker.stop, worker.grace)
        flow.close()


api = FastAPI(title="orders", lifespan=lifespan)


class NewOrder(BaseModel):
    order_id: str = Field(min_length=1, max_length=100)
    items: int = Field(ge=1)


class PaymentEvent(BaseModel):
    event_id: str = Field(min_length=1, max_length=200)  # the provider's id for this delivery
    run_id: str  # the reference this service gave the provider with the payment
    status: str


def refusal(status: int, exc: perdure.PerdureError, **extra: Any) -> JSONResponse:
    body = {"error": {"code": exc.code, "message": str(exc)}, **extra}
    return JSONResponse(jsonable_encoder(body), status)


# Endpoints are plain ``def``: FastAPI runs them in its thread pool, where
# perdure's blocking client calls belong.


@api.post("/orders", status_code=202)
def create_order(new: NewOrder) -> dict[str, Any]:
    try:
        handle = flow.start(order, new.order_id, new.items, key=f"order-{new.order_id}")
    except perdure.KeyConflict as exc:  # the same order id with other items
        raise HTTPException(409, str(exc)) from exc
    return {"run_id": handle.run_id, "created": handle.created}


@api.post("/webhooks/payments", response_model=perdure.Receipt)
def payment_webhook(event: PaymentEvent) -> perdure.Receipt | JSONResponse:
    try:
        receipt = flow.signal(
            event.run_id, "payment", {"status": event.status}, signal_id=event.event_id
        )
    except perdure.RunNotFound as exc:
        return refusal(404, exc)
    except (perdure.WaitSettled, perdure.WaitExpired) as exc:
        # Another event (or the deadline) settled the wait first: say which.
        return refusal(409, exc, receipt=exc.receipt)
    except perdure.RunFinished as exc:
        return refusal(409, exc)
    except perdure.InvalidInput as exc:
        return refusal(400, exc)
    return receipt


@api.get("/orders/{run_id}")
def read_order(run_id: str) -> dict[str, Any]:
    try:
        info = flow.get(run_id)
    except perdure.RunNotFound as exc:
        raise HTTPException(404, str(exc)) from exc
    return {"run_id": info.run_id, "state": info.state, "result": info.result, "error": info.error}
