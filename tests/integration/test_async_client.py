"""The client's async forms: on PostgreSQL on the event loop (no threads), on SQLite on threads."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

import perdure
from perdure.store.postgres import bridge


def build(store_url: str) -> perdure.App:
    app = perdure.App(store_url, name=f"ac_{uuid.uuid4().hex[:8]}")

    @app.step()
    def double(x: int) -> int:
        return 2 * x

    @app.workflow()
    def flow(ctx: perdure.Context, x: int) -> int:
        return double(x)

    @app.workflow()
    def gated(ctx: perdure.Context) -> Any:
        return [ctx.wait("go"), ctx.receive("notes").payload]

    return app


@pytest.fixture
def no_threads(store_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """On PostgreSQL, fail any async client call that would fall back to a thread."""
    if not store_url.startswith("postgresql"):
        return

    async def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"a thread was used for {args[0]!r}")

    monkeypatch.setattr(asyncio, "to_thread", refuse)


@contextlib.contextmanager
def sync_connections_refused(app: perdure.App, store_url: str) -> Iterator[None]:
    """On PostgreSQL, fail any store call that takes a pooled (sync) connection."""
    if not store_url.startswith("postgresql"):
        yield
        return
    pool = app.store._pool  # type: ignore[attr-defined]
    taken = pool.connection

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("an async call took a sync connection")

    pool.connection = refuse
    try:
        yield
    finally:
        pool.connection = taken


def test_every_async_client_call(store_url: str, no_threads: None) -> None:
    app = build(store_url)
    _ = app.store  # opened outside the loop, as an application does at start-up

    async def scenario() -> dict[str, Any]:
        handle = await app.astart("flow", 21)
        again = await app.astart("flow", 21, key="k-1")
        same = await app.astart("flow", 21, key="k-1")
        gated = await app.astart("gated")
        seen = {
            "state": (await app.aget(handle.run_id)).state,
            "same_key": (again.run_id == same.run_id, same.created),
            "listed": len(await app.aruns()),
        }
        receipt = await app.asignal(gated.run_id, "go", {"ok": 1}, signal_id="s-1")
        repeat = await app.asignal(gated.run_id, "go", {"ok": 1}, signal_id="s-1")
        seen["signal"] = (receipt.signal_id, repeat == receipt)
        seen["sent"] = await app.asend(gated.run_id, "notes", "n-1", "hello")
        seen["history"] = [r.kind for r in await app.ahistory(handle.run_id)]
        seen["canceled"] = await app.acancel(again.run_id)
        with pytest.raises(perdure.RunNotFound):
            await app.aget("no-such-run")
        return seen

    with sync_connections_refused(app, store_url):
        seen = asyncio.run(scenario())
    assert seen["state"] == "queued"
    assert seen["same_key"] == (True, False)
    assert seen["listed"] == 3
    assert seen["signal"] == ("s-1", True)
    assert seen["sent"] is True
    assert seen["history"] == ["initialized"]
    assert seen["canceled"] is True

    async def finish() -> list[Any]:
        # Listed before the worker starts: it claims them at once.
        runs = await app.aruns(state="queued")
        ids = sorted(r.run_id for r in runs)
        with app.worker():
            return [await app.client.aresult(run_id, timeout=30) for run_id in ids]

    results = asyncio.run(finish())
    assert sorted(map(str, results)) == sorted(map(str, [42, [{"ok": 1}, "hello"]]))
    app.close()


def test_concurrent_async_calls_each_get_their_own_transaction(
    store_url: str, no_threads: None
) -> None:
    app = build(store_url)
    _ = app.store

    async def many() -> list[str]:
        handles = await asyncio.gather(*(app.astart("flow", n, key=f"n-{n}") for n in range(25)))
        # The same keys again, concurrently: each finds the run its key made.
        again = await asyncio.gather(*(app.astart("flow", n, key=f"n-{n}") for n in range(25)))
        assert [h.run_id for h in again] == [h.run_id for h in handles]
        assert not any(h.created for h in again)
        return [h.run_id for h in handles]

    with sync_connections_refused(app, store_url):
        ids = asyncio.run(many())
    assert len(set(ids)) == 25
    assert len(app.runs(limit=100)) == 25
    # A second event loop uses the store as well (connections belong to their loop).
    assert asyncio.run(app.aget(ids[0])).state == "queued"
    app.close()


def test_a_closed_store_refuses_async_calls(store_url: str) -> None:
    app = build(store_url)
    handle = app.start("flow", 1)
    client = app.client
    client.store.close()
    with pytest.raises(perdure.StoreError):
        asyncio.run(client.aget(handle.run_id))
    app.close()


def test_await_outside_a_bridged_call_is_refused() -> None:
    async def plain() -> int:
        return 1

    pending = plain()
    with pytest.raises(RuntimeError):
        bridge.await_(pending)
    pending.close()
