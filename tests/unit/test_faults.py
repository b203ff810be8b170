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
