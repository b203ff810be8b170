"""The app the live-run tests use, in the test's process and in spawned ones.

``PERDURE_STORE`` names the store (``App()`` reads it when first used). A
process that runs :func:`main` performs one call given on its command line
and prints one JSON line per result, so the tests read what each process saw.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta
from typing import Any

import perdure

app = perdure.App(name="live")


@app.workflow(version="1")
def order(ctx: perdure.Context, order_id: str, wanted: int = 3) -> dict[str, Any]:
    """The design's example: answer ``wanted`` add_item updates, reporting progress."""
    ctx.set_event("status", "open")
    items: list[Any] = []
    while len(items) < wanted:
        upd = ctx.next_update("add_item", timeout=timedelta(hours=1))
        items.append(upd.payload)
        ctx.respond(upd, {"count": len(items)})
        ctx.write_stream("progress", {"items": len(items)})
    ctx.close_stream("progress")
    ctx.set_event("status", "done")
    return {"items": items}


@order.validator("add_item")
def check_item(payload: Any) -> None:
    if not isinstance(payload, dict) or payload.get("qty", 0) <= 0:
        raise ValueError("qty must be positive")


@order.query("item_count")
def item_count(view: perdure.RunView) -> int:
    return len(view.updates("add_item"))


@order.query("summary")
def summary(view: perdure.RunView) -> dict[str, Any]:
    return {
        "order_id": view.inputs["args"][0],
        "items": [u.payload for u in view.updates("add_item")],
        "answers": view.responses,
        "status": view.event("status"),
        "progress": view.stream("progress"),
    }


@order.query("broken")
def broken(view: perdure.RunView) -> int:
    raise KeyError("no such thing")


@app.workflow(version="1")
def gated(ctx: perdure.Context, first: int, then: int) -> int:
    """Write ``first`` stream items, wait for ``go``, set an event, write ``then`` more."""
    for i in range(first):
        ctx.write_stream("numbers", i)
    ctx.wait("go")
    ctx.set_event("gate", "open")
    for i in range(first, first + then):
        ctx.write_stream("numbers", i)
    ctx.close_stream("numbers")
    return first + then


@app.workflow(version="1")
def ignores_updates(ctx: perdure.Context) -> str:
    """Never reads an update: it ends when the signal ``finish`` arrives."""
    ctx.wait("finish")
    return "finished"


def main() -> None:
    """Do the call named by ``argv[1]`` with the JSON arguments ``argv[2]``; print the result."""
    call, args = sys.argv[1], json.loads(sys.argv[2])
    print(json.dumps({"ready": os.getpid()}), flush=True)
    try:
        if call == "update":
            result: Any = app.update(*args)
        elif call == "get_event":
            result = app.get_event(*args)
        elif call == "read_stream":
            result = []
            for item in app.read_stream(*args):
                result.append(item)
                print(json.dumps({"item": item}), flush=True)
        elif call == "query":
            result = app.query(*args)
        else:
            raise SystemExit(f"unknown call {call}")
        print(json.dumps({"ok": result}), flush=True)
    except perdure.PerdureError as exc:
        print(json.dumps({"error": exc.code, "message": str(exc)}), flush=True)
    finally:
        app.close()


if __name__ == "__main__":
    main()
