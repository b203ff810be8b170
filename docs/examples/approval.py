"""Tutorial, part 3: a workflow that waits for a signal, with a deadline."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import perdure

app = perdure.App("sqlite:///tutorial.db", name="approval")
published: list[str] = []


@app.step()
def request_review(doc: str) -> str:
    # A real program would send a mail with a link that ends in a signal.
    return f"review of {doc} requested"


@app.step()
def publish(doc: str, reviewer: str) -> str:
    published.append(doc)
    return f"https://docs.example/{doc}?approved-by={reviewer}"


@app.workflow(version="1")
def review(ctx: perdure.Context, doc: str) -> dict[str, Any]:
    request_review(doc)
    try:
        decision = ctx.wait("decision", timeout=timedelta(days=3))
    except perdure.WaitTimedOut:
        return {"doc": doc, "status": "expired"}
    if not decision["approved"]:
        return {"doc": doc, "status": "rejected", "by": decision["by"]}
    return {"doc": doc, "status": "published", "url": publish(doc, decision["by"])}
