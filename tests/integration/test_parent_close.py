"""What happens to a child run when its parent ends first: parent_close, on both stores."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

import perdure
from perdure.testing import Environment


def build(store_url: str) -> perdure.App:
    app = perdure.App(store_url, name=f"pc_{uuid.uuid4().hex[:8]}")

    @app.workflow()
    def grandchild(ctx: perdure.Context) -> Any:
        return ctx.wait("never")

    @app.workflow(parent_close="cancel")
    def bound(ctx: perdure.Context) -> Any:
        ctx.start_child(grandchild)
        return ctx.wait("never")

    @app.workflow()
    def free(ctx: perdure.Context) -> Any:
        return ctx.wait("never")

    @app.workflow()
    def parent(ctx: perdure.Context, fail: bool) -> str:
        ctx.start_child(bound)
        ctx.start_child(free)
        ctx.sleep(60)  # the children start and park meanwhile
        if fail:
            raise ValueError("the parent gives up")
        return "done"

    return app


def _children(app: perdure.App, workflow: str) -> list[perdure.RunInfo]:
    return app.runs(workflow=workflow, limit=100)


@pytest.mark.parametrize("fail", [False, True], ids=["succeeds", "fails"])
def test_a_parent_that_ends_cancels_its_cancel_children_and_leaves_the_others(
    store_url: str, fail: bool
) -> None:
    app = build(store_url)
    with Environment(app, store=store_url) as env:
        handle = env.start("parent", fail)
        env.run_until_idle()
        assert {r.workflow: r.state for r in app.runs(limit=100)} == {
            "parent": "waiting",
            "bound": "waiting",
            "free": "waiting",
            "grandchild": "waiting",
        }
        env.advance(60)
        assert app.get(handle.run_id).state == ("failed" if fail else "succeeded")
        [bound] = _children(app, "bound")
        [grandchild] = _children(app, "grandchild")
        [free] = _children(app, "free")
        # The bound child goes with its parent, its own descendants with it.
        assert (bound.state, grandchild.state) == ("canceled", "canceled")
        assert "canceled" in [r.kind for r in app.history(bound.run_id)]
        # The default is to run on.
        assert free.state == "waiting"


def test_parent_close_is_checked_at_registration(store_url: str) -> None:
    app = perdure.App(store_url, name="pc_bad")
    with pytest.raises(perdure.InvalidInput, match="parent_close"):

        @app.workflow(parent_close="terminate")  # type: ignore[arg-type]
        def nope(ctx: perdure.Context) -> None:
            return None

    app.close()
