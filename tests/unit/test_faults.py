"""The fault-injecting store wrapper and the throwaway store users test with."""

from __future__ import annotations

import threading

import pytest

import perdure
from perdure.testing import faults


def test_a_failed_step_write_is_an_engine_fault_and_the_run_still_completes() -> None:
    with faults.temporary_store() as inner:
        store = faults.FaultyStore(inner)
        app = perdure.App(store, name="faulty", max_failures=3)

        @app.step()
        def add(x: int) -> int:
            return x + 1

        @app.workflow()
        def wf(ctx: perdure.Context, x: int) -> int:
            return add(x)

        reached = threading.Event()
        store.fail("finish_step", perdure.StoreUnavailable("disk gone"), times=1)
        store.after("finish", lambda returned, *args, **kwargs: reached.set())
        handle = app.start(wf, 1)
        with app.worker(lease_ttl=2, heartbeat=0.5, poll_interval=0.1):
            # The first attempt's write fails: the run is released with backoff
            # (one failure counted) and the next attempt records the step.
            assert handle.result(timeout=30) == 2
        assert reached.is_set()
        assert store.calls["finish_step"] == 2
        assert [h.kind for h in app.history(handle.run_id)].count("released") == 1


def test_rules_fire_the_given_number_of_times() -> None:
    with faults.temporary_store() as inner:
        store = faults.FaultyStore(inner)
        seen: list[str] = []
        store.before("get_run", lambda run_id: seen.append(run_id), times=2)
        store.fail("journal", KeyError("boom"), times=None)
        for run_id in ("a", "b", "c"):
            assert store.get_run(run_id) is None
        assert seen == ["a", "b"]
        for _ in range(2):
            with pytest.raises(KeyError):
                store.journal("a")
        store.clear()
        assert store.journal("a") == []
        with pytest.raises(ValueError, match="no operation"):
            store.fail("teleport", RuntimeError())


def test_a_park_that_fails_releases_the_run_instead_of_leaving_it_running() -> None:
    with faults.temporary_store() as inner:
        store = faults.FaultyStore(inner)
        app = perdure.App(store, name="parking")

        @app.workflow()
        def napper(ctx: perdure.Context) -> str:
            ctx.sleep(0.2)
            return "rested"

        store.fail("park", perdure.StoreUnavailable("database is locked"), times=1)
        handle = app.start(napper)
        with app.worker(lease_ttl=30, heartbeat=5, poll_interval=0.1):
            # Released with a 1 s backoff, not stuck until the 30 s lease lapses.
            assert handle.result(timeout=15) == "rested"
        kinds = [h.kind for h in app.history(handle.run_id)]
        assert kinds.count("released") == 1
        assert "recovered" not in kinds


def test_writes_are_counted_in_order_and_a_site_fires_at_the_kth() -> None:
    with faults.temporary_store() as inner:
        store = faults.FaultyStore(inner)
        fired: list[tuple[str, str, int]] = []
        store.at_write(2, "before", lambda op: fired.append(("before", op, len(store.writes))))
        store.at_write(2, "after", lambda op: fired.append(("after", op, len(store.writes))))
        app = perdure.App(store, name="counted")

        @app.workflow()
        def wf(ctx: perdure.Context) -> int:
            return 1

        app.start(wf, key="k")
        app.start(wf, key="k")  # a repeated start is a write too: it may create the run
        store.get_run("nothing")  # a read is not
        assert store.writes == ["create_run", "create_run"]
        assert fired == [("before", "create_run", 2), ("after", "create_run", 2)]
        assert all(name in faults.WRITES for name in ("claim", "park", "finish", "settle_wait"))
        with pytest.raises(ValueError, match="write site"):
            store.at_write(0, "before", lambda op: None)


def test_an_error_raised_after_a_write_reaches_the_caller_once_it_committed() -> None:
    with faults.temporary_store() as inner:
        store = faults.FaultyStore(inner)
        app = perdure.App(store, name="committed")

        @app.workflow()
        def wf(ctx: perdure.Context) -> int:
            return 1

        def fail(op: str) -> None:
            raise perdure.StoreUnavailable(f"after {op}")

        store.at_write(1, "after", fail)
        with pytest.raises(perdure.StoreUnavailable, match="after create_run"):
            app.start(wf, key="k")
        assert len(app.runs()) == 1  # the run exists although its caller saw an error
