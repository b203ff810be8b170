"""Tutorial, part 5: a step that must not run twice, and what happens when it is unsure."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import perdure

app = perdure.App("sqlite:///tutorial.db", name="payments")
GATEWAY = Path("gateway.log")  # what the payment provider was asked to do


@app.step(effect="pure")
def price(items: int) -> int:
    return items * 1250


@app.step(effect="once", retry=perdure.Retry(max_attempts=1))
def charge(order_id: str, cents: int) -> str:
    key = perdure.idempotency_key()  # "<run id>/charge": give it to the provider
    with GATEWAY.open("a", encoding="utf-8") as log:
        log.write(f"{key} {cents}\n")
    if order_id.startswith("declined"):
        raise perdure.EffectFailed("card declined")  # the provider said no: nothing happened
    if order_id.startswith("slow"):
        raise TimeoutError("no answer from the payment provider")  # charged or not?
    return f"ch_{order_id}"


@app.step()
def send_receipt(order_id: str, charge_id: str) -> str:
    return f"receipt for {order_id}: {charge_id}"


@app.workflow(version="1")
def checkout(ctx: perdure.Context, order_id: str, items: int) -> dict[str, Any]:
    cents = price(items)
    try:
        charge_id = charge(order_id, cents)
    except perdure.StepFailed as failed:
        return {"order": order_id, "status": "declined", "reason": failed.error_message}
    return {"order": order_id, "status": "paid", "receipt": send_receipt(order_id, charge_id)}
