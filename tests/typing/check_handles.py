"""Static checks of the typed handles; mypy --strict reads this file, nothing runs it.

Each ``# type: ignore[code]`` below marks a call that must stay an error:
with ``warn_unused_ignores`` (part of ``--strict``) mypy fails if the error
ever goes away.
"""

from __future__ import annotations

from collections.abc import Coroutine
from datetime import datetime
from typing import Any, assert_type

import perdure
from perdure.registry import AsyncWorkflow, SyncWorkflow
from perdure.schedules import Schedule

app = perdure.App("sqlite:///typing.db", name="typing")


@app.workflow(version="1")
def checkout(ctx: perdure.Context, order_id: str, cents: int = 0) -> dict[str, int]:
    return {order_id: cents}


@app.workflow()
async def notify(ctx: perdure.Context, user: str) -> bool:
    return bool(user)


@app.workflow
def bare(ctx: perdure.Context, n: int) -> str:
    return str(n)


@app.workflow
async def bare_async(ctx: perdure.Context) -> int:
    return 1


@app.transaction
def bare_tx(connection: Any, n: int) -> int:
    return n


def bare_decorators() -> None:
    typed: SyncWorkflow[[int], str] = bare
    assert typed
    assert_type(bare_async, AsyncWorkflow[[], int])
    assert_type(app.start(bare, 3).result(), str)
    assert_type(bare_tx(2), int)
    app.start(bare, "3")  # type: ignore[call-overload]


def typed_handles() -> None:
    typed: SyncWorkflow[[str, int], dict[str, int]] = checkout
    typed_async: AsyncWorkflow[[str], bool] = notify
    either: perdure.Workflow[[str], bool] = notify
    assert typed and typed_async and either

    handle = app.start(checkout, "o-1", cents=5)
    assert_type(handle, perdure.RunHandle[dict[str, int]])
    assert_type(handle.result(), dict[str, int])
    assert_type(app.start(checkout, "o-1", key="k-1").result(timeout=1), dict[str, int])
    assert_type(app.start(notify, "u-1").result(), bool)

    # By name: allowed, untyped.
    assert_type(app.start("checkout", "o-1"), perdure.RunHandle[Any])
    assert_type(app.start("checkout", "o-1", key="k-2").result(), Any)

    # The client's calls, through the app, keep their signatures.
    assert_type(app.get(handle.run_id), perdure.RunInfo)
    assert_type(app.signal(handle.run_id, "approval", {"ok": True}), perdure.Receipt)
    assert_type(app.cancel(handle.run_id), bool)
    assert_type(app.history(handle.run_id), list[perdure.Provenance])

    # Still callable as the functions they wrap.
    ctx: perdure.Context = Any  # type: ignore[assignment]
    assert_type(checkout(ctx, "o-1"), dict[str, int])
    assert_type(notify(ctx, "u-1"), Coroutine[Any, Any, bool]).close()


async def typed_async_twins() -> None:
    handle = await app.astart(checkout, "o-1")
    assert_type(handle, perdure.RunHandle[dict[str, int]])
    assert_type(await handle.aresult(), dict[str, int])
    assert_type(await app.aget(handle.run_id), perdure.RunInfo)
    assert_type(await app.acancel(handle.run_id), bool)


def refused_calls() -> None:
    app.start(checkout, 42, bogus=1)  # type: ignore[arg-type, call-arg]
    app.start(checkout)  # type: ignore[call-overload]
    app.start(notify, "u-1", "extra")  # type: ignore[call-overload]
    app.start(checkout, "o-1", cents="five")  # type: ignore[arg-type]
    app.start(42)  # type: ignore[call-overload]
    app.get(42)  # type: ignore[arg-type]
    app.signal("run", name=3)  # type: ignore[arg-type]


@app.workflow()
async def awaits(ctx: perdure.Context) -> str:
    """The async forms of waits type-check, and keep the record types."""
    await ctx.sleep(5)
    payload = await ctx.wait("go")
    note = await ctx.receive("notes")
    assert_type(note, perdure.Message)
    asked = await ctx.next_update("ask")
    assert_type(asked, perdure.Update)
    child = await ctx.start_child(bare, 3).result()
    return f"{payload}{note.key}{asked.update_id}{child}"


# A schedule stacked on a workflow keeps its type; the function form returns the declaration.
@app.schedule("0 6 * * *", tz="Europe/Berlin", catch_up="all")
@app.workflow()
def morning(ctx: perdure.Context, tick: datetime) -> int:
    return tick.hour


morning_typed: SyncWorkflow[[datetime], int] = morning
assert_type(app.start(morning, datetime.now()), perdure.RunHandle[int])
assert_type(app.schedule("15 * * * *", checkout, "o-1", name="hourly_checkout"), Schedule)
assert_type(app.trigger_schedule("morning"), perdure.RunHandle[Any])
assert_type(app.schedules(), list[perdure.ScheduleInfo])
app.schedule("0 6 * * *", catch_up="sometimes")  # type: ignore[call-overload]
