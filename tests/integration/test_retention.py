"""Retention: a worker's sweep and ``perdure prune`` delete runs that ended long ago."""

from __future__ import annotations

import json
import time
from datetime import timedelta
from typing import Any

from click.testing import CliRunner

import perdure
from perdure import cli
from perdure.testing.clock import FakeClock

WORKER: dict[str, Any] = {
    "concurrency": 2,
    "lease_ttl": 3,
    "heartbeat": 1,
    "poll_interval": 0.05,
    "sweep_interval": 0.05,
}


def make(url: str, clock: FakeClock, retention: timedelta | None) -> perdure.App:
    app = perdure.App(url, name="kept", clock=clock, retention=retention)

    @app.workflow()
    def quick(ctx: perdure.Context, n: int) -> int:
        return n

    @app.workflow()
    def gate(ctx: perdure.Context) -> Any:
        return ctx.wait("go")

    return app


def test_a_workers_sweep_prunes_runs_past_the_apps_retention(store_url: str) -> None:
    clock = FakeClock()
    app = make(store_url, clock, timedelta(days=30))
    try:
        with app.worker(**WORKER):
            done = [app.start("quick", i) for i in range(3)]
            assert [h.result(timeout=30) for h in done] == [0, 1, 2]
            waiting = app.start("gate")
            deadline = time.monotonic() + 30
            while app.get(waiting.run_id).state != "waiting":
                assert time.monotonic() < deadline
                time.sleep(0.02)
            clock.advance(timedelta(days=29).total_seconds())
            fresh = app.start("quick", 9)
            assert fresh.result(timeout=30) == 9
            clock.advance(timedelta(days=2).total_seconds())
            # The next sweeps delete the three old runs, never the waiting one
            # (however old) nor the one that ended a day ago.
            deadline = time.monotonic() + 30
            while {r.run_id for r in app.runs(limit=100)} != {waiting.run_id, fresh.run_id}:
                assert time.monotonic() < deadline, app.runs(limit=100)
                time.sleep(0.05)
        for handle in done:
            assert app.store.get_run(handle.run_id) is None
            assert app.store.journal(handle.run_id) == []
            assert app.store.history(handle.run_id) == []
        assert app.get(waiting.run_id).state == "waiting"
    finally:
        app.close()


def test_a_workers_prune_follows_the_apps_retention(sqlite_url: str) -> None:
    """The sweep's prune step, driven by hand: None keeps every run, however old."""
    clock = FakeClock()
    kept = make(sqlite_url, clock, None)
    try:
        with kept.worker(**WORKER):
            assert kept.start("quick", 1).result(timeout=30) == 1
        clock.advance(timedelta(days=3650).total_seconds())
        worker = perdure.Worker(kept, kept.store, concurrency=1, lease_ttl=3, heartbeat=1)
        worker._prune()
        assert len(kept.runs(limit=10)) == 1
        # The same store and run, under an app that keeps 30 days: pruned.
        pruning = make(sqlite_url, clock, timedelta(days=30))
        try:
            worker = perdure.Worker(pruning, pruning.store, concurrency=1, lease_ttl=3, heartbeat=1)
            worker._prune()
            assert pruning.runs(limit=10) == []
        finally:
            pruning.close()
    finally:
        kept.close()


def test_perdure_prune_deletes_by_hand(store_url: str) -> None:
    app = perdure.App(store_url, name="kept", retention=None)

    @app.workflow()
    def quick(ctx: perdure.Context, n: int) -> int:
        return n

    try:
        with app.worker(**WORKER):
            done = app.start(quick, 1)
            assert done.result(timeout=30) == 1
        waiting = app.start(quick, 2).run_id  # queued: no worker runs it
        runner = CliRunner()
        args = ["prune", "--app", "kept", "--store", store_url, "--json"]
        young = runner.invoke(cli.cli, [*args, "--older-than", "1h"])
        assert young.exit_code == 0, young.output
        assert json.loads(young.stdout)["pruned"] == 0
        # Real time is the point here: the run must have ended over a second ago.
        time.sleep(1.1)
        old = runner.invoke(cli.cli, [*args, "--older-than", "1s"])
        assert old.exit_code == 0, old.output
        assert json.loads(old.stdout)["pruned"] == 1
        assert app.store.get_run(done.run_id) is None
        assert app.get(waiting).state == "queued"
        bad = runner.invoke(cli.cli, [*args, "--older-than", "0d"])
        assert bad.exit_code == 2
        unpaced = runner.invoke(cli.cli, [*args, "--older-than", "1s", "--pause-factor", "0"])
        assert unpaced.exit_code == 0, unpaced.output
        assert json.loads(unpaced.stdout)["pruned"] == 0
        bad = runner.invoke(cli.cli, [*args, "--older-than", "1s", "--pause-factor", "-1"])
        assert bad.exit_code == 2
    finally:
        app.close()


def test_a_bad_retention_is_refused(sqlite_url: str) -> None:
    import pytest

    with pytest.raises(perdure.InvalidInput, match="retention"):
        perdure.App(sqlite_url, name="kept", retention=timedelta(0))
