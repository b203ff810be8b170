"""Tutorial, part 1: a first workflow of two steps."""

from __future__ import annotations

import perdure

app = perdure.App("sqlite:///tutorial.db", name="hello")


@app.step()
def fetch_user(user_id: str) -> dict[str, str]:
    # A real program would call a user service here.
    return {"id": user_id, "name": user_id.title()}


@app.step()
def compose(name: str) -> str:
    return f"Hello, {name}!"


@app.workflow(version="1")
def greet(ctx: perdure.Context, user_id: str) -> str:
    user = fetch_user(user_id)
    return compose(user["name"])
