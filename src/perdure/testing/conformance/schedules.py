"""Conformance: schedule rows (:mod:`perdure.store.scheduleport`)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from perdure import errors
from perdure.store import port, scheduleport
from perdure.testing import clock as clocks
from perdure.testing.conformance.harness import APP, OTHER_APP, Suite


def _schedules(store: port.Store) -> scheduleport.ScheduleStore:
    assert isinstance(store, scheduleport.ScheduleStore), "the store keeps no schedules"
    return store


def _spec(name: str = "nightly", **changes: object) -> scheduleport.ScheduleSpec:
    fields: dict[str, object] = {
        "name": name,
        "workflow": "report",
        "version": "1",
        "cron": "0 3 * * *",
        "tz": "Europe/Berlin",
        "catch_up": "latest",
        "input": '["eu"]',
        "tick_arg": True,
    }
    fields.update(changes)
    return scheduleport.ScheduleSpec(**fields)  # type: ignore[arg-type]


class ScheduleTests(Suite):
    """The conformance tests of the schedule rows."""

    def test_save_creates_rows_settled_until_now_and_keeps_their_state(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        rows = _schedules(store)
        first = clock.now()
        [saved] = rows.save_schedules(APP, [_spec()])
        assert saved == scheduleport.ScheduleRecord(
            app=APP,
            name="nightly",
            workflow="report",
            version="1",
            cron="0 3 * * *",
            tz="Europe/Berlin",
            catch_up="latest",
            input='["eu"]',
            tick_arg=True,
            paused=False,
            settled_until=first,
            last_tick=None,
            last_run_id=None,
            created_at=first,
            updated_at=first,
        )
        clock.advance(60)
        rows.settle_schedule(APP, "nightly", first + timedelta(seconds=30), first, "r1")
        rows.pause_schedule(APP, "nightly", True)
        clock.advance(60)
        # A new deploy: another version and cron; the state stays.
        [again] = rows.save_schedules(APP, [_spec(version="2", cron="0 4 * * *", tick_arg=False)])
        assert (again.version, again.cron, again.tick_arg) == ("2", "0 4 * * *", False)
        assert again.paused and again.last_tick == first and again.last_run_id == "r1"
        assert again.settled_until == first + timedelta(seconds=30)
        assert again.created_at == first and again.updated_at == clock.now()

    def test_list_by_app_and_name(self, store: port.Store) -> None:
        rows = _schedules(store)
        rows.save_schedules(APP, [_spec("b"), _spec("a")])
        rows.save_schedules(OTHER_APP, [_spec("c", catch_up="all")])
        assert [r.name for r in rows.list_schedules(APP)] == ["a", "b"]
        assert [(r.app, r.name) for r in rows.list_schedules()] == [
            (APP, "a"),
            (APP, "b"),
            (OTHER_APP, "c"),
        ]
        assert rows.list_schedules("nobody") == []

    def test_settle_only_moves_forward(self, store: port.Store, clock: clocks.FakeClock) -> None:
        rows = _schedules(store)
        rows.save_schedules(APP, [_spec()])
        t0 = clock.now()
        later, earlier = t0 + timedelta(hours=2), t0 + timedelta(hours=1)
        rows.settle_schedule(APP, "nightly", later, later, "r2")
        rows.settle_schedule(APP, "nightly", earlier, earlier, "r1")
        [row] = rows.list_schedules(APP)
        assert (row.settled_until, row.last_tick, row.last_run_id) == (later, later, "r2")
        # A skipped tick settles without a run.
        skipped = t0 + timedelta(hours=3)
        rows.settle_schedule(APP, "nightly", skipped, None, None)
        [row] = rows.list_schedules(APP)
        assert (row.settled_until, row.last_tick, row.last_run_id) == (skipped, later, "r2")
        rows.settle_schedule(APP, "unknown", skipped, skipped, "r9")
        assert [r.name for r in rows.list_schedules(APP)] == ["nightly"]

    def test_resume_settles_the_ticks_passed_while_paused(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        rows = _schedules(store)
        rows.save_schedules(APP, [_spec()])
        t0 = clock.now()
        paused = rows.pause_schedule(APP, "nightly", True)
        assert paused is not None and paused.paused and paused.settled_until == t0
        clock.advance(3600)
        again = rows.pause_schedule(APP, "nightly", True)
        assert again is not None and again.settled_until == t0
        resumed = rows.pause_schedule(APP, "nightly", False)
        assert resumed is not None and not resumed.paused
        assert resumed.settled_until == clock.now()
        assert rows.pause_schedule(APP, "unknown", True) is None

    def test_refuses_what_it_cannot_hold(self, store: port.Store) -> None:
        rows = _schedules(store)
        with pytest.raises(errors.InvalidInput, match="catch_up"):
            rows.save_schedules(APP, [_spec(catch_up="sometimes")])
        assert rows.list_schedules(APP) == []
        assert rows.save_schedules(APP, []) == []
