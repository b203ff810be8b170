"""An app for the console's tests: a run that fails, one that waits, one that needs attention."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from starlette.testclient import TestClient

import perdure
from perdure.store import port
from perdure.web import app as web_app
from perdure.web import auth


def build(url: str, name: str = "shop") -> perdure.App:
    app = perdure.App(url, name=name)

    @app.step()
    def reserve(order_id: str) -> dict[str, Any]:
        return {"order": order_id, "cents": 1200}

    @app.step(retry=perdure.Retry(max_attempts=2))
    def charge_card(order_id: str) -> str:
        raise RuntimeError(f"card declined for {order_id}: insufficient funds")

    @app.step(effect="once", retry=perdure.Retry(max_attempts=1))
    def ship(order_id: str) -> str:
        raise ConnectionError("carrier timed out; the parcel may have shipped")

    @app.workflow(version="1")
    def checkout(ctx: perdure.Context, order_id: str) -> str:
        reserve(order_id)
        return charge_card(order_id)

    @app.workflow(version="1")
    def approval(ctx: perdure.Context, order_id: str) -> dict[str, Any]:
        reserve(order_id)
        ok = ctx.wait("approve", timeout=timedelta(hours=24))
        return {"approved": ok}

    @app.workflow(version="1")
    def fulfil(ctx: perdure.Context, order_id: str) -> str:
        reserve(order_id)
        return ship(order_id)

    @app.workflow(version="1")
    def hostile(ctx: perdure.Context, note: str) -> str:
        return note

    return app


def settle(app: perdure.App, run_ids: list[str], timeout: float = 20.0) -> None:
    """Wait until none of the runs is queued or running (a worker must be serving)."""
    deadline = time.monotonic() + timeout
    while True:
        states = [app.get(r).state for r in run_ids]
        if all(s not in ("queued", "running") for s in states):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"runs did not settle: {states}")
        time.sleep(0.02)


@dataclass
class World:
    app: perdure.App
    failed: str
    waiting: str
    attention: str
    hostile: str

    @property
    def store(self) -> port.Store:
        return self.app.store

    def token(self, scope: str, app: str | None = None, expires: timedelta | None = None) -> str:
        held = auth.token_store(self.store)
        return auth.mint(held, app or self.app.name, scope, expires, self.store.now()).secret

    def client(
        self, *, open_local: bool = False, base_url: str = "http://127.0.0.1:8025"
    ) -> TestClient:
        asgi = web_app.create_app(self.app.client, app=self.app, open_local=open_local)
        return TestClient(asgi, base_url=base_url)


def build_world(url: str) -> Iterator[World]:
    app = build(url, name="shop")
    worker = app.worker(concurrency=4, liveness="thread", lease_ttl=3, heartbeat=1)
    worker.start()
    try:
        ids = [
            app.start("checkout", "o-1").run_id,
            app.start("approval", "o-2", key="order-2").run_id,
            app.start("fulfil", "o-3").run_id,
            app.start("hostile", "<script>alert(1)</script>", key="<script>k</script>").run_id,
        ]
        settle(app, ids)
        assert [app.get(r).state for r in ids] == [
            "failed",
            "waiting",
            "needs_attention",
            "succeeded",
        ]
        yield World(app, *ids)
    finally:
        worker.stop(timeout=10)
        app.close()
