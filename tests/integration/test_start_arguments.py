"""Run keys that cannot collide with a parameter, and children's arguments checked at creation."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

import perdure
from perdure.testing import Environment


def build(store_url: str) -> tuple[perdure.App, dict[str, Any]]:
    app = perdure.App(store_url, name=f"sa_{uuid.uuid4().hex[:8]}")

    @app.workflow()
    def lookup(ctx: perdure.Context, key: str) -> str:
        return f"value of {key}"

    @app.workflow()
    def add(ctx: perdure.Context, a: int, b: int = 0) -> int:
        return a + b

    @app.workflow()
    def fan(ctx: perdure.Context, items: list[Any]) -> list[int]:
        args = [tuple(i) if isinstance(i, list) else i for i in items]
        return [h.result() for h in ctx.map(add, args)]

    @app.workflow()
    def parent(ctx: perdure.Context, how: str) -> Any:
        if how == "keyed":
            return ctx.start_child(lookup.keyed("child-1"), key="k9").result()
        if how == "bad":
            return ctx.start_child(add, "not a number").result()
        return ctx.start_child(lookup, key="k8").result()

    return app, {"lookup": lookup, "add": add}


def test_key_is_the_argument_of_a_workflow_that_has_a_key_parameter(store_url: str) -> None:
    app, refs = build(store_url)
    with Environment(app, store=store_url) as env:
        plain = env.start("lookup", key="a")
        env.run_until_idle()
        assert plain.result(timeout=5) == "value of a"
        assert app.get(plain.run_id).key is None

        ref = refs["lookup"]
        first = app.start(ref.keyed("run-1"), key="b")
        again = app.start(ref.keyed("run-1"), key="b")
        assert (first.run_id, again.created) == (again.run_id, False)
        assert app.get(first.run_id).key == "run-1"
        env.run_until_idle()
        assert first.result(timeout=5) == "value of b"


def test_key_stays_the_run_key_elsewhere_and_two_keys_are_refused(store_url: str) -> None:
    app, refs = build(store_url)
    add = refs["add"]
    with Environment(app, store=store_url):
        handle = app.start(add, 1, 2, key="sum-1")
        assert app.get(handle.run_id).key == "sum-1"
        assert app.start(add.keyed("sum-1"), 1, 2).run_id == handle.run_id
        with pytest.raises(perdure.InvalidInput, match="two run keys"):
            app.start(add.keyed("sum-2"), 1, 2, key="sum-3")
        with pytest.raises(perdure.InvalidInput):
            add.keyed("")


def test_children_get_their_key_argument_and_bad_arguments_fail_the_parent(
    store_url: str,
) -> None:
    app, _ = build(store_url)
    with Environment(app, store=store_url) as env:
        keyed = env.start("parent", "keyed")
        plain = env.start("parent", "plain")
        bad = env.start("parent", "bad")
        env.run_until_idle()
        assert keyed.result(timeout=5) == "value of k9"
        assert plain.result(timeout=5) == "value of k8"
        [child] = [r for r in app.runs(workflow="lookup") if r.key and r.key.endswith("child-1")]
        assert child.key == f"{keyed.run_id}/child-1"
        info = app.get(bad.run_id)
        assert info.state == "failed" and info.error is not None
        assert "argument 'a' of workflow add" in info.error["message"]
        assert app.children(bad.run_id) == {}


def test_map_takes_tuples_dicts_and_single_values_and_checks_them_first(store_url: str) -> None:
    app, _ = build(store_url)
    with Environment(app, store=store_url) as env:
        good = env.start("fan", [[1, 2], {"a": 3, "b": 4}, 5])
        bad = env.start("fan", [[1, 2], {"a": "x"}])
        env.run_until_idle()
        assert good.result(timeout=5) == [3, 7, 5]
        info = app.get(bad.run_id)
        assert info.state == "failed" and info.error is not None
        # The first item was fine, but no child was created: all are checked first.
        assert app.children(bad.run_id) == {}
