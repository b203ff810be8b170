"""Every spelling of the decorators registers the function; none silently replaces it."""

from __future__ import annotations

from typing import Any

import pytest

import perdure

WORKER: dict[str, Any] = {"concurrency": 2, "lease_ttl": 3, "heartbeat": 1, "poll_interval": 0.05}


def test_bare_and_called_decorators_register_and_run(store_url: str) -> None:
    app = perdure.App(store_url, name="forms")

    @app.step
    def double(n: int) -> int:
        return 2 * n

    @app.transaction
    def bare_tx(connection: Any, n: int) -> int:
        return n + 1

    @app.transaction()
    def called_tx(connection: Any, n: int) -> int:
        return n + 2

    @app.workflow
    def bare(ctx: perdure.Context, n: int) -> list[int]:
        return [double(n), bare_tx(n), called_tx(n)]

    @app.workflow(version="2")
    def called(ctx: perdure.Context) -> str:
        return "called"

    @app.workflow("named")
    def with_name(ctx: perdure.Context) -> str:
        return "named"

    @app.workflow
    async def bare_async(ctx: perdure.Context) -> str:
        return "async"

    try:
        assert sorted(app.workflows) == ["bare", "bare_async", "called", "named"]
        assert app.workflows["called"].version == "2"
        assert app.workflows["bare"].version == "1"
        # Still callable as the functions they wrap.
        assert bare_tx.__name__ == "bare_tx" and callable(bare)
        with app.worker(**WORKER):
            assert app.start(bare, 5).result(timeout=30) == [10, 6, 7]
            assert app.start(called).result(timeout=30) == "called"
            assert app.start("named").result(timeout=30) == "named"
            assert app.start(bare_async).result(timeout=30) == "async"
        steps = [(e.kind, e.name) for e in app.store.journal(app.runs(workflow="bare")[0].run_id)]
        assert steps == [("step", "double"), ("step", "bare_tx"), ("step", "called_tx")]
    finally:
        app.close()


def test_a_name_that_is_neither_a_string_nor_a_function_is_refused(sqlite_url: str) -> None:
    app = perdure.App(sqlite_url, name="forms")
    try:
        with pytest.raises(perdure.InvalidInput, match="must be a string"):
            app.workflow(42)  # type: ignore[call-overload]
        with pytest.raises(perdure.InvalidInput, match="must be a string"):
            app.transaction(42)  # type: ignore[call-overload]
        assert app.workflows == {}
    finally:
        app.close()
