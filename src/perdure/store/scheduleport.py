"""The schedules section of the store port: one row per schedule of an app.

A schedule is declared in code (``@app.schedule``); a worker serving the app
saves its declaration here (:meth:`ScheduleStore.save_schedules`), so that a
process without the code can list, pause, resume and trigger it. The row
also holds what the code cannot: whether the schedule is paused, and
``settled_until``, the instant through which every tick is settled (its run
started, or skipped by the schedule's ``catch_up``). Settling only moves
forward, so two workers settling the same tick agree; the run of a tick is
made once by its run key, not by this row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal, Protocol, runtime_checkable

CatchUp = Literal["none", "latest", "all"]
CATCH_UPS: tuple[CatchUp, ...] = ("none", "latest", "all")


@dataclass(frozen=True)
class ScheduleSpec:
    """A schedule as the code declares it.

    ``input`` is the run input of a tick without the tick (the encoded fixed
    arguments); ``tick_arg`` says whether the tick instant is passed as the
    workflow's one argument.
    """

    name: str
    workflow: str
    version: str
    cron: str
    tz: str
    catch_up: CatchUp
    input: str
    tick_arg: bool


@dataclass(frozen=True)
class ScheduleRecord:
    """A stored schedule: its declaration and its state."""

    app: str
    name: str
    workflow: str
    version: str
    cron: str
    tz: str
    catch_up: CatchUp
    input: str
    tick_arg: bool
    paused: bool
    settled_until: datetime
    last_tick: datetime | None
    last_run_id: str | None
    created_at: datetime
    updated_at: datetime


@runtime_checkable
class ScheduleStore(Protocol):
    """The store's schedule operations."""

    def save_schedules(self, app: str, specs: Sequence[ScheduleSpec]) -> list[ScheduleRecord]:
        """Create or update the app's schedules from their declarations, in one transaction.

        A new row is settled until the store's clock (a schedule never
        starts ticks from before it was first served); an existing row keeps
        its state (paused, settled, last tick). Rows of schedules no longer
        declared are left alone. Returns the saved rows.
        """
        ...

    def list_schedules(self, app: str | None = None) -> list[ScheduleRecord]:
        """Return the schedules of ``app`` (or of every app), by app and name."""
        ...

    def settle_schedule(
        self, app: str, name: str, through: datetime, tick: datetime | None, run_id: str | None
    ) -> None:
        """Record that the schedule's ticks up to ``through`` are settled.

        ``settled_until`` only moves forward; ``tick`` and ``run_id`` (the
        tick last started, and its run) are recorded when ``tick`` is later
        than the recorded one. A call for an unknown schedule changes nothing.
        """
        ...

    def pause_schedule(self, app: str, name: str, paused: bool) -> ScheduleRecord | None:
        """Pause or resume the schedule; None when it is unknown.

        Resuming settles the ticks that passed while it was paused: the
        next tick started is the first after the resume.
        """
        ...
