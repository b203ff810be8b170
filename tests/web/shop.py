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

    @app.workflow(version="1")
    def parcel(ctx: perdure.Context, n: int) -> int:
        return n

    @app.workflow(version="1")
    def batch(ctx: perdure.Context, size: int) -> int:
        return sum(h.result() for h in ctx.map(parcel, range(size)))

    @app.workflow(version="1")
    def family(ctx: perdure.Context, order_id: str, parcels: int = 3) -> dict[str, Any]:
        ctx.set_event("status", "<script>open</script>")
        ctx.map(parcel, range(parcels))
        ctx.start_child(batch, 12, key="batch")
        for i in range(3):
            ctx.write_stream("progress", {"packed": i})
        items: list[Any] = []
        while len(items) < 2:
            upd = ctx.next_update("add_item", timeout=timedelta(hours=1))
            items.append(upd.payload)
            ctx.respond(upd, {"count": len(items)})
            ctx.set_event("count", len(items))
        ctx.close_stream("progress")
        return {"items": items}

    # A plan whose transform fails for good: load and publish are blocked by it,
    # while audit and report, on another branch, run to the end.
    nightly = app.plan("nightly", version="1")

    @nightly.task()
    def extract(day: str) -> list[str]:
        return [day, "orders", "refunds"]

    @nightly.task(after=[extract], retry=perdure.Retry(max_attempts=2, initial_delay=0.01))
    def transform(extract: list[str]) -> int:
        raise RuntimeError("the warehouse is unreachable")

    @nightly.task(after=[extract], effect="pure")
    def audit(extract: list[str]) -> bool:
        return len(extract) == 3

    @nightly.task(after=[transform])
    def load(transform: int) -> int:
        return transform

    @nightly.task(after=[audit])
    def report(audit: bool) -> str:
        return "audit passed" if audit else "audit failed"

    @nightly.task(after=[load, report], effect="once", retry=perdure.Retry(max_attempts=1))
    def publish(load: int, report: str) -> str:
        return f"published {load} rows ({report})"

    @family.validator("add_item")
    def check_item(payload: Any) -> None:
        if not isinstance(payload, dict) or payload.get("qty", 0) <= 0:
            raise ValueError("qty must be positive")

    @family.query("item_count")
    def item_count(view: perdure.RunView) -> int:
        return len(view.updates("add_item"))

    @family.query("broken")
    def broken(view: perdure.RunView) -> int:
        raise KeyError("no such thing")

    return app


def start_family(app: perdure.App, parcels: int = 3, timeout: float = 30.0) -> str:
    """Start a ``family`` run and wait until it and its descendants rest (it waits for updates)."""
    run_id = app.start("family", "o-fam", parcels=parcels).run_id
    deadline = time.monotonic() + timeout
    while True:
        tree = [run_id]
        i = 0
        while i < len(tree):
            tree += [c.run_id for c in app.client.store.page_children(tree[i], limit=500)]  # type: ignore[attr-defined]
            i += 1
        states = [app.get(r).state for r in tree]
        if len(tree) == 1 + parcels + 1 + 12 and all(
            s not in ("queued", "running") for s in states
        ):
            return run_id
        if time.monotonic() > deadline:
            raise AssertionError(f"the family did not settle: {states}")
        time.sleep(0.05)


def start_nightly(app: perdure.App, day: str = "2026-11-30") -> str:
    """Start a ``nightly`` plan run and wait until it ends (failed: its transform fails)."""
    run_id = app.start("nightly", day).run_id
    settle(app, [run_id], states=("running",))
    return run_id


def settle(
    app: perdure.App,
    run_ids: list[str],
    timeout: float = 20.0,
    states: tuple[str, ...] = ("queued", "running"),
) -> None:
    """Wait until none of the runs is in ``states`` (a worker must be serving)."""
    held = states
    deadline = time.monotonic() + timeout
    while True:
        states = tuple(app.get(r).state for r in run_ids)
        if all(s not in held for s in states):
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
