"""Schedules: cron ticks turned into runs, exactly one run per tick.

A schedule names a workflow, a cron expression read in a time zone, and what
to do with ticks missed while nothing ran (``catch_up``). Cron text is read
by ``cronsim`` (five fields, or six with seconds first), which follows
Debian cron across daylight saving changes: a job at a fixed hour and minute
whose local time does not exist (spring forward) runs at the first minute
after the gap, and one whose local time happens twice (fall back) runs at
the first of them only; a job with a wildcard or stepped hour or minute
runs on its ticks in real time.

A tick's run is created under the key ``schedule:<name>:<tick, UTC ISO>``,
so every worker that evaluates the same tick, and a worker that evaluates it
again after a crash, finds the one run already created. The store's row of
the schedule (:mod:`perdure.store.scheduleport`) records the instant through
which ticks are settled, so workers do not start a settled tick's run again
and missed ticks are known after a gap. Everything reads the store's clock.
"""

from __future__ import annotations

import logging
import uuid
import zoneinfo
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import cronsim

from perdure import codec, errors, records
from perdure.store import port, scheduleport

log = logging.getLogger("perdure.schedules")

ALL_BATCH = 100
"""Ticks of one schedule started per evaluation at most under ``catch_up="all"``."""

ON_TIME = timedelta(seconds=60)
"""Under ``catch_up="none"``, a tick still starts when evaluated up to this late."""

# An evaluation's look for the next tick stops this far ahead (cron text like
# "0 0 30 2 *" never matches, and cronsim would search for years).
_HORIZON = timedelta(days=366 * 5)


@dataclass(frozen=True)
class Schedule:
    """A schedule declared in code: ``@app.schedule(...)`` or ``app.schedule(cron, wf, ...)``."""

    name: str
    workflow: str
    cron: str
    tz: str
    catch_up: scheduleport.CatchUp
    args: tuple[Any, ...]
    tick_arg: bool

    def spec(self, version: str) -> scheduleport.ScheduleSpec:
        """Return the declaration the store keeps, for the workflow's ``version``."""
        return scheduleport.ScheduleSpec(
            name=self.name,
            workflow=self.workflow,
            version=version,
            cron=self.cron,
            tz=self.tz,
            catch_up=self.catch_up,
            input=codec.encode(list(self.args), envelope=2),
            tick_arg=self.tick_arg,
        )


def zone(tz: str) -> zoneinfo.ZoneInfo:
    """Return the time zone named ``tz``.

    Raises:
        errors.InvalidInput: no such time zone.
    """
    if not isinstance(tz, str) or not tz:
        raise errors.InvalidInput(f"a schedule's tz is a time zone name, got {tz!r}")
    try:
        return zoneinfo.ZoneInfo(tz)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise errors.InvalidInput(
            f"unknown time zone {tz!r}; use an IANA name such as 'UTC' or 'Europe/Berlin'"
        ) from None


def check(cron: str, tz: str, catch_up: str) -> None:
    """Refuse a cron expression, time zone or catch_up a schedule cannot use.

    Raises:
        errors.InvalidInput: saying which and why.
    """
    if catch_up not in scheduleport.CATCH_UPS:
        raise errors.InvalidInput(
            f"catch_up must be one of {', '.join(scheduleport.CATCH_UPS)}, got {catch_up!r}"
        )
    where = zone(tz)
    if not isinstance(cron, str):
        raise errors.InvalidInput(f"a cron expression is text, got {type(cron).__name__}")
    try:
        cronsim.CronSim(cron, datetime.now(where))
    except (cronsim.CronSimError, ValueError, IndexError) as exc:
        raise errors.InvalidInput(
            f"bad cron expression {cron!r}: {exc}; expected five fields "
            "(minute hour day-of-month month day-of-week) or six with seconds first"
        ) from None


def ticks_after(cron: str, tz: str, after: datetime) -> Iterator[datetime]:
    """Yield the ticks strictly after ``after``, oldest first, as UTC instants."""
    where = zone(tz)
    # cronsim works in whole seconds: ticks after the second holding `after`.
    base = after.astimezone(where)
    for tick in cronsim.CronSim(cron, base):
        found = tick.astimezone(UTC)
        if found > after:
            yield found


def next_tick(cron: str, tz: str, after: datetime) -> datetime | None:
    """Return the first tick strictly after ``after``, or None within the horizon."""
    for tick in ticks_after(cron, tz, after):
        return tick if tick - after <= _HORIZON else None
    return None


def latest_tick(cron: str, tz: str, at: datetime, since: datetime) -> datetime | None:
    """Return the latest tick in ``(since, at]``, or None."""
    where = zone(tz)
    # Backwards from the second after `at`: every tick it yields is at or before `at`.
    upper = at.replace(microsecond=0) + timedelta(seconds=1)
    for tick in cronsim.CronSim(cron, upper.astimezone(where), reverse=True):
        found = tick.astimezone(UTC)
        if found <= since:
            return None
        if found <= at:
            return found
    return None


def run_key(name: str, tick: datetime) -> str:
    """Return the key of the run of ``name``'s tick: one run per tick, whoever starts it."""
    return f"schedule:{name}:{tick.astimezone(UTC).isoformat()}"


def _input(record: scheduleport.ScheduleRecord, tick: datetime) -> str:
    fixed = codec.decode(record.input)
    if not isinstance(fixed, list):
        raise errors.CorruptState(None, "schedule_input", f"schedule {record.name!r}")
    args = [tick.astimezone(UTC), *fixed] if record.tick_arg else fixed
    return codec.encode({"args": args, "kwargs": {}}, envelope=2)


def start(
    store: port.Store, record: scheduleport.ScheduleRecord, tick: datetime, key: str
) -> port.Run:
    """Create (or find, by ``key``) the run of ``record``'s ``tick``."""
    new = port.NewRun(
        run_id=uuid.uuid4().hex,
        app=record.app,
        workflow=record.workflow,
        version=record.version,
        input=_input(record, tick),
        key=key,
    )
    run, _ = store.create_run(new)
    return run


def _schedule_store(store: port.Store) -> scheduleport.ScheduleStore:
    if not isinstance(store, scheduleport.ScheduleStore):
        raise errors.StoreError(f"the store {store.url} keeps no schedules")
    return store


def save(store: port.Store, app: str, specs: Sequence[scheduleport.ScheduleSpec]) -> None:
    """Save the app's declared schedules in its store (a worker does it when it starts)."""
    if specs:
        _schedule_store(store).save_schedules(app, specs)


def _evaluate(
    store: port.Store, record: scheduleport.ScheduleRecord, now: datetime, limit: int
) -> datetime | None:
    """Start the record's due ticks; return when it is due next."""
    saved = _schedule_store(store)
    if record.catch_up == "all":
        due: list[datetime] = []
        for tick in ticks_after(record.cron, record.tz, record.settled_until):
            if tick > now or len(due) >= limit:
                break
            due.append(tick)
        for tick in due:
            run = start(store, record, tick, run_key(record.name, tick))
            saved.settle_schedule(record.app, record.name, tick, tick, run.run_id)
        if len(due) >= limit:
            return now
    else:
        latest = latest_tick(record.cron, record.tz, now, record.settled_until)
        if latest is not None:
            if record.catch_up == "latest" or now - latest <= ON_TIME:
                run = start(store, record, latest, run_key(record.name, latest))
                saved.settle_schedule(record.app, record.name, latest, latest, run.run_id)
            else:
                saved.settle_schedule(record.app, record.name, latest, None, None)
    return next_tick(record.cron, record.tz, max(now, record.settled_until))


def evaluate(
    store: port.Store, app: str, names: Collection[str], *, limit: int = ALL_BATCH
) -> datetime | None:
    """Start the runs of due ticks of the app's schedules ``names``; return when one is due next.

    Only the schedules the caller's code declares are evaluated: a schedule
    removed from the code keeps its row (and is listed) but no longer ticks.
    A schedule whose row cannot be evaluated (a time zone this host does not
    know) is logged and skipped; the others go on.
    """
    saved = _schedule_store(store)
    now = store.now()
    soonest: datetime | None = None
    for record in saved.list_schedules(app):
        if record.paused or record.name not in names:
            continue
        try:
            due = _evaluate(store, record, now, limit)
        except errors.InvalidInput as exc:
            log.warning("schedule %s of app %s cannot be evaluated: %s", record.name, app, exc)
            continue
        if due is not None and (soonest is None or due < soonest):
            soonest = due
    return soonest


def find(store: port.Store, app: str, name: str) -> scheduleport.ScheduleRecord:
    """Return the app's stored schedule ``name``.

    Raises:
        errors.ScheduleNotFound: the app has no schedule of that name in the store.
    """
    for record in _schedule_store(store).list_schedules(app):
        if record.name == name:
            return record
    raise errors.ScheduleNotFound(
        f"app {app!r} has no schedule named {name!r} in the store "
        "(a schedule is stored when a worker first serves the app)"
    )


def trigger(store: port.Store, app: str, name: str) -> port.Run:
    """Start one run of the schedule now, with the store's instant as its tick.

    Each call starts its own run, even two at the same instant.
    """
    record = find(store, app, name)
    tick = store.now()
    key = f"{run_key(name, tick)}:trigger:{uuid.uuid4().hex[:12]}"
    return start(store, record, tick, key)


def pause(store: port.Store, app: str, name: str, paused: bool) -> scheduleport.ScheduleRecord:
    """Pause or resume the app's schedule ``name``; return its row."""
    record = _schedule_store(store).pause_schedule(app, name, paused)
    if record is None:
        find(store, app, name)  # raises: unknown
        raise AssertionError("unreachable")
    return record


def info(record: scheduleport.ScheduleRecord, now: datetime) -> records.ScheduleInfo:
    """Describe a stored schedule, with its next tick after ``now``."""
    try:
        upcoming = None if record.paused else next_tick(record.cron, record.tz, now)
    except errors.InvalidInput:
        upcoming = None
    return records.ScheduleInfo(
        app=record.app,
        name=record.name,
        workflow=record.workflow,
        cron=record.cron,
        tz=record.tz,
        catch_up=record.catch_up,
        paused=record.paused,
        last_tick=record.last_tick,
        last_run_id=record.last_run_id,
        next_tick=upcoming,
    )


def listing(store: port.Store, app: str | None) -> list[records.ScheduleInfo]:
    """Describe the stored schedules of ``app`` (or of every app)."""
    now = store.now()
    return [info(r, now) for r in _schedule_store(store).list_schedules(app)]
