"""In async workflows waits, sleeps, receives and child results are awaited, on both stores."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections import Counter
from datetime import timedelta
from typing import Any

import perdure
from perdure.testing import Environment


def build(store_url: str) -> tuple[perdure.App, Counter[str]]:
    app = perdure.App(store_url, name=f"aw_{uuid.uuid4().hex[:8]}")
    ran: Counter[str] = Counter()

    @app.step()
    async def fetch(x: int) -> int:
        ran["fetch"] += 1
        await asyncio.sleep(0)
        return x * 2

    @app.workflow()
    async def child(ctx: perdure.Context, n: int) -> int:
        await ctx.sleep(60)
        return n + 1

    @app.workflow()
    async def flow(ctx: perdure.Context, n: int) -> dict[str, Any]:
        doubled = await asyncio.gather(fetch(n), fetch(n + 1))
        await ctx.sleep(timedelta(hours=1))
        approval = await ctx.wait("approve", timeout=timedelta(days=1))
        try:
            await ctx.wait("never", timeout=timedelta(minutes=5))
            late = "signaled"
        except perdure.WaitTimedOut:
            late = "timed out"
        note = await ctx.receive("notes")
        asked = await ctx.next_update("ask")
        ctx.respond(asked, asked.payload * 2)
        grown = await ctx.start_child(child, n).result()
        return {
            "doubled": doubled,
            "approval": approval,
            "late": late,
            "note": [note.key, note.payload],
            "grown": grown,
        }

    @app.workflow()
    async def forgetful(ctx: perdure.Context) -> Any:
        approval = ctx.wait("approve")  # the sync form: a Ready, not the payload
        return approval["ok"]

    return app, ran


def test_an_async_workflow_awaits_every_kind_of_wait(store_url: str) -> None:
    app, ran = build(store_url)
    with Environment(app, store=store_url) as env:
        handle = env.start("flow", 5)
        env.run_until_idle()
        assert app.get(handle.run_id).state == "waiting"  # the one-hour sleep
        env.advance(timedelta(hours=1))
        assert [w.name for w in app.waits(handle.run_id)] == ["approve"]

        app.signal(handle.run_id, "approve", {"by": "ada"})
        env.run_until_idle()
        assert [w.name for w in app.waits(handle.run_id)] == ["never"]
        env.advance(timedelta(minutes=5))  # the second wait times out

        app.send(handle.run_id, "notes", "n-1", "ship it")
        env.run_until_idle()

        # The update is answered by the run; its sender blocks meanwhile.
        answered: list[Any] = []
        sender = threading.Thread(
            target=lambda: answered.append(app.update(handle.run_id, "ask", 21, timeout=30))
        )
        sender.start()
        deadline = time.monotonic() + 30
        while app.get(handle.run_id).state != "queued" and time.monotonic() < deadline:
            time.sleep(0.01)  # until the update is delivered and wakes the run
        env.run_until_idle()
        sender.join(30)
        env.advance(60)  # the child's sleep
        env.run_until_idle()
        assert handle.result(timeout=5) == {
            "doubled": [10, 12],
            "approval": {"by": "ada"},
            "late": "timed out",
            "note": ["n-1", "ship it"],
            "grown": 6,
        }
        assert answered == [42]
        # Replays after each rest did not run the steps again.
        assert ran == Counter({"fetch": 2})


def test_using_a_wait_without_await_fails_the_run_with_a_clear_error(store_url: str) -> None:
    app, _ = build(store_url)
    with Environment(app, store=store_url) as env:
        handle = env.start("forgetful")
        env.run_until_idle()
        app.signal(handle.run_id, "approve", {"ok": True})
        env.run_until_idle()
        info = app.get(handle.run_id)
        assert info.state == "failed"
        assert info.error is not None
        assert "await" in info.error["message"]


def test_a_sync_workflow_keeps_the_sync_forms(store_url: str) -> None:
    app = perdure.App(store_url, name=f"sw_{uuid.uuid4().hex[:8]}")

    @app.workflow()
    def plain(ctx: perdure.Context) -> Any:
        ctx.sleep(30)
        return ctx.wait("go")

    with Environment(app, store=store_url) as env:
        handle = env.start("plain")
        env.advance(30)
        app.signal(handle.run_id, "go", [1, 2])
        env.run_until_idle()
        assert handle.result(timeout=5) == [1, 2]
