"""Schedules: one run per tick, catch_up after a gap, DST, pause/resume/trigger, bad input."""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from click.testing import CliRunner

import perdure
from perdure import cli, errors
from perdure.testing import Environment, FakeClock

START = datetime(2030, 1, 1, tzinfo=UTC)


def _app(**options: Any) -> tuple[perdure.App, list[datetime]]:
    """An app whose workflow ``tick`` records each tick it runs for, on a schedule."""
    app = perdure.App(name=f"sched_{uuid.uuid4().hex[:8]}")
    seen: list[datetime] = []
    cron = options.pop("cron", "0 * * * *")

    @app.schedule(cron, **options)
    @app.workflow()
    def tick(ctx: perdure.Context, at: datetime) -> str:
        seen.append(at)
        return at.isoformat()

    return app, seen


def _until(check: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def _ticks(app: perdure.App) -> list[datetime]:
    """The tick of every run the app holds, oldest first (from the runs' results)."""
    runs = app.runs(workflow="tick", limit=1000)
    assert all(r.state == "succeeded" for r in runs), runs
    return sorted(datetime.fromisoformat(r.result) for r in runs)


def test_one_run_per_tick_over_several_ticks(store_url: str) -> None:
    app, seen = _app()
    with Environment(app, store=store_url, start=START) as env:
        env.advance(timedelta(hours=5))
        # Evaluating again at the same instant starts nothing new.
        env.run_until_idle()
        env.advance(0)
        expected = [START + timedelta(hours=h) for h in range(1, 6)]
        assert _ticks(app) == expected
        assert sorted(seen) == expected
        assert all(t.tzinfo is not None for t in seen)
        [info] = app.schedules()
        assert info.name == "tick" and info.last_tick == expected[-1]
        assert info.next_tick == START + timedelta(hours=6)


@pytest.mark.parametrize(
    ("catch_up", "started"),
    [
        ("none", []),
        ("latest", [START + timedelta(hours=5)]),
        ("all", [START + timedelta(hours=h) for h in range(1, 6)]),
    ],
)
def test_catch_up_after_a_gap(store_url: str, catch_up: str, started: list[datetime]) -> None:
    app, _ = _app(catch_up=catch_up)
    with Environment(app, store=store_url, start=START) as env:
        env.run_until_idle()  # a worker serves the app: the schedule's row is made
        # No worker runs for five and a half hours.
        env.clock.set(START + timedelta(hours=5, minutes=30))
        env.run_until_idle()
        assert _ticks(app) == started
        # Then the ticks come on time again, whatever catch_up says.
        env.advance(timedelta(hours=1))
        assert _ticks(app) == [*started, START + timedelta(hours=6)]


def test_catch_up_all_is_bounded_per_evaluation_and_goes_on(store_url: str) -> None:
    app, _ = _app(cron="* * * * *", catch_up="all")
    with Environment(app, store=store_url, start=START) as env:
        env.run_until_idle()
        env.clock.set(START + timedelta(minutes=250))
        env.run_until_idle()
        assert _ticks(app) == [START + timedelta(minutes=m) for m in range(1, 251)]


def test_catch_up_none_starts_a_tick_evaluated_a_little_late(store_url: str) -> None:
    app, _ = _app(catch_up="none")
    with Environment(app, store=store_url, start=START) as env:
        env.run_until_idle()
        env.clock.set(START + timedelta(hours=1, seconds=20))
        env.run_until_idle()
        assert _ticks(app) == [START + timedelta(hours=1)]


BERLIN = "Europe/Berlin"


def test_spring_forward_a_daily_0230_job_runs_at_0300(store_url: str) -> None:
    # 2030-03-31: Berlin's clocks jump from 02:00 to 03:00 (CET to CEST).
    app, _ = _app(cron="30 2 * * *", tz=BERLIN)
    with Environment(app, store=store_url, start=datetime(2030, 3, 29, 12, tzinfo=UTC)) as env:
        env.advance(timedelta(days=3))
        assert _ticks(app) == [
            datetime(2030, 3, 30, 1, 30, tzinfo=UTC),  # 02:30 CET
            datetime(2030, 3, 31, 1, 0, tzinfo=UTC),  # no 02:30 that day: 03:00 CEST
            datetime(2030, 4, 1, 0, 30, tzinfo=UTC),  # 02:30 CEST
        ]


def test_fall_back_a_daily_0230_job_runs_once(store_url: str) -> None:
    # 2030-10-27: Berlin's clocks go from 03:00 back to 02:00: 02:30 happens twice.
    app, _ = _app(cron="30 2 * * *", tz=BERLIN)
    with Environment(app, store=store_url, start=datetime(2030, 10, 25, 12, tzinfo=UTC)) as env:
        env.advance(timedelta(days=3))
        assert _ticks(app) == [
            datetime(2030, 10, 26, 0, 30, tzinfo=UTC),  # 02:30 CEST
            datetime(2030, 10, 27, 0, 30, tzinfo=UTC),  # the first 02:30 only
            datetime(2030, 10, 28, 1, 30, tzinfo=UTC),  # 02:30 CET
        ]


def test_fall_back_an_hourly_job_runs_every_real_hour(store_url: str) -> None:
    # A job with a wildcard hour runs on real hours: the repeated 02:xx hour too.
    app, _ = _app(cron="15 * * * *", tz=BERLIN)
    begin = datetime(2030, 10, 26, 23, tzinfo=UTC)  # 01:00 CEST on the 27th
    with Environment(app, store=store_url, start=begin) as env:
        env.advance(timedelta(hours=4))
        assert _ticks(app) == [begin + timedelta(hours=h, minutes=15) for h in range(4)]


def test_pause_resume_and_trigger(store_url: str) -> None:
    app, _ = _app()
    with Environment(app, store=store_url, start=START) as env:
        env.advance(timedelta(hours=1))
        assert app.pause_schedule("tick").paused
        env.advance(timedelta(hours=3))
        assert _ticks(app) == [START + timedelta(hours=1)]
        assert app.schedules()[0].next_tick is None
        # Two triggers, two runs, each with its instant as its tick.
        first = app.trigger_schedule("tick")
        second = app.trigger_schedule("tick")
        assert first.run_id != second.run_id
        env.run_until_idle()
        assert first.result() == second.result() == env.now().isoformat()
        # Resuming skips the ticks passed while paused.
        env.clock.set(env.now() + timedelta(minutes=30))
        resumed = app.resume_schedule("tick")
        assert not resumed.paused and resumed.next_tick == START + timedelta(hours=5)
        env.advance(timedelta(hours=1))
        assert _ticks(app) == [START + timedelta(hours=h) for h in (1, 4, 4, 5)]


def test_fixed_arguments_and_a_name(store_url: str) -> None:
    app = perdure.App(name=f"sched_{uuid.uuid4().hex[:8]}")

    @app.workflow()
    def report(ctx: perdure.Context, region: str, top: int) -> str:
        return f"{region}:{top}"

    app.schedule("0 6 * * *", report, "eu", 3, name="eu_report", tz=BERLIN)
    app.schedule("0 7 * * *", report, "us", 5, name="us_report", catch_up="all")
    with Environment(app, store=store_url, start=START) as env:
        env.advance(timedelta(days=1))
        results = Counter(r.result for r in app.runs(workflow="report"))
        assert results == {"eu:3": 1, "us:5": 1}
        assert [s.name for s in app.schedules()] == ["eu_report", "us_report"]
        keys = {r.key for r in app.runs(workflow="report")}
        assert keys == {
            "schedule:eu_report:2030-01-01T05:00:00+00:00",
            "schedule:us_report:2030-01-01T07:00:00+00:00",
        }


@pytest.mark.parametrize(
    ("cron", "tz", "words"),
    [
        ("61 * * * *", "UTC", "bad cron expression '61 * * * *'"),
        ("every day", "UTC", "bad cron expression"),
        ("* * *", "UTC", "five fields"),
        ("0 6 * * *", "Mars/Olympus", "unknown time zone 'Mars/Olympus'"),
        ("0 6 * * *", "", "time zone name"),
    ],
)
def test_bad_cron_or_tz_is_refused_at_registration(cron: str, tz: str, words: str) -> None:
    app = perdure.App(name="bad_sched")
    with pytest.raises(errors.InvalidInput) as caught:

        @app.schedule(cron, tz=tz)
        @app.workflow()
        def job(ctx: perdure.Context, at: datetime) -> None: ...

    assert words in str(caught.value)
    assert caught.value.code == "invalid_input"


def test_registration_refusals() -> None:
    app = perdure.App(name="bad_sched")

    @app.schedule("0 6 * * *")
    @app.workflow()
    def job(ctx: perdure.Context, at: datetime) -> None: ...

    with pytest.raises(errors.InvalidInput, match="declared twice"):
        app.schedule("0 7 * * *", job)
    with pytest.raises(errors.InvalidInput, match="catch_up must be one of"):
        app.schedule("0 7 * * *", job, name="other", catch_up="some")  # type: ignore[call-overload]

    @app.workflow()
    def two(ctx: perdure.Context, a: int, b: int) -> None: ...

    with pytest.raises(errors.InvalidInput, match="takes 2 arguments"):
        app.schedule("0 6 * * *")(two)
    with pytest.raises(errors.InvalidInput, match="bad arguments"):
        app.schedule("0 6 * * *", two, 1)
    with pytest.raises(errors.InvalidInput, match=r"above @app\.workflow"):
        app.schedule("0 6 * * *", name="raw")(lambda ctx, at: None)  # type: ignore[type-var]
    with pytest.raises(errors.InvalidInput, match="no schedule named"), Environment(app):
        app.pause_schedule("nope")


def _cli(*args: str) -> Any:
    return CliRunner().invoke(cli.cli, list(args))


def test_command_line_lists_pauses_resumes_and_triggers(store_url: str) -> None:
    app, _ = _app(tz=BERLIN)
    with Environment(app, store=store_url, start=START) as env:
        env.advance(timedelta(hours=2))
        listed = _cli("schedules", "--store", store_url, "--json")
        assert listed.exit_code == 0, listed.output
        [doc] = json.loads(listed.output)
        assert doc["name"] == "tick" and doc["workflow"] == "tick" and doc["app"] == app.name
        assert (doc["cron"], doc["tz"], doc["catch_up"], doc["paused"]) == (
            "0 * * * *",
            BERLIN,
            "latest",
            False,
        )
        assert doc["last_tick"] == "2030-01-01T02:00:00+00:00"
        # The command reads the store's own clock (not the test's fake one).
        upcoming = datetime.fromisoformat(doc["next_tick"])
        assert upcoming > datetime.now(UTC) and (upcoming.minute, upcoming.second) == (0, 0)
        table = _cli("schedules", "--store", store_url, "--app", app.name)
        assert table.exit_code == 0 and "NEXT" in table.output
        assert "2030-01-01 02:00:00Z" in table.output

        on = ["--store", store_url, "--app", app.name]
        paused = _cli("schedules", "pause", "tick", *on, "--json")
        assert paused.exit_code == 0 and json.loads(paused.output)["paused"] is True
        env.advance(timedelta(hours=2))
        assert _ticks(app) == [START + timedelta(hours=h) for h in (1, 2)]
        runs = [_cli("schedules", "trigger", "tick", *on) for _ in range(2)]
        assert [r.exit_code for r in runs] == [0, 0]
        triggered = {r.output.strip() for r in runs}
        assert len(triggered) == 2
        env.run_until_idle()
        assert {app.get(run_id).state for run_id in triggered} == {"succeeded"}
        resumed = _cli("schedules", *on, "--json", "resume", "tick")
        assert resumed.exit_code == 0 and json.loads(resumed.output)["paused"] is False

        unknown = _cli("schedules", "pause", "nope", *on)
        assert unknown.exit_code == 2
        assert "no schedule named 'nope'" in unknown.output
        no_app = _cli("schedules", "trigger", "tick", "--store", store_url)
        assert no_app.exit_code == 2 and "--app NAME" in no_app.output


def test_a_worker_on_a_fake_clock_starts_the_ticks(store_url: str) -> None:
    clock = FakeClock(START)
    app = perdure.App(store_url, name=f"sched_{uuid.uuid4().hex[:8]}", clock=clock)

    @app.schedule("0 * * * *")
    @app.workflow()
    def tick(ctx: perdure.Context, at: datetime) -> str:
        return at.isoformat()

    def ended(count: int) -> bool:
        runs = app.runs(workflow="tick")
        return len(runs) == count and all(r.state == "succeeded" for r in runs)

    with app.worker(concurrency=2, liveness="thread", poll_interval=0.05) as worker:
        _until(lambda: worker._schedules_saved)
        for hour in range(1, 4):
            clock.set(START + timedelta(hours=hour, seconds=5))
            _until(lambda h=hour: ended(h))  # type: ignore[misc]
    app.close()
    assert _ticks(app) == [START + timedelta(hours=h) for h in range(1, 4)]


def test_a_schedule_removed_from_the_code_stops_ticking(store_url: str) -> None:
    app = perdure.App(name=f"sched_{uuid.uuid4().hex[:8]}")

    @app.workflow()
    def tick(ctx: perdure.Context, at: datetime) -> str:
        return at.isoformat()

    app.schedule("0 * * * *", name="hourly")(tick)
    with Environment(app, store=store_url, start=START) as env:
        env.advance(timedelta(hours=1))
        # The next deploy declares another schedule instead.
        app._schedules.clear()
        app.schedule("30 * * * *", name="half")(tick)
        env.advance(timedelta(hours=2))
        # The old one is still listed (its row stays) but starts no run.
        assert {s.name for s in app.schedules()} == {"hourly", "half"}
        minutes = [(1, 0), (1, 30), (2, 30)]
        assert _ticks(app) == [START + timedelta(hours=h, minutes=m) for h, m in minutes]
