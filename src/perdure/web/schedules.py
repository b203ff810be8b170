"""An app's schedules as the console and the API list and steer them.

The logic is the schedule layer's (:mod:`perdure.schedules`); this module only
picks the door. Served with the app's code (``perdure console MODULE:APP``)
the calls go through the :class:`~perdure.app.App`, which also knows the
schedules its code declares that no worker has stored yet (pausing or
triggering one stores it). From the store alone (``perdure console --store``)
they go through :mod:`perdure.schedules` on the client's store: only the
stored rows exist.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from perdure import client as client_api
from perdure import errors, records, schedules

if TYPE_CHECKING:
    from perdure.web.app import Console


def listing(console: Console) -> list[records.ScheduleInfo]:
    """Return the app's schedules by name, each with its next tick."""
    if console.app is not None:
        return console.app.schedules()
    found = schedules.listing(console.client.store, console.name)
    return sorted(found, key=lambda s: s.name)


def one(console: Console, name: str) -> records.ScheduleInfo:
    """Return the app's schedule ``name``.

    Raises:
        errors.ScheduleNotFound: the app has no such schedule.
    """
    for found in listing(console):
        if found.name == name:
            return found
    store = console.client.store
    # Raises the schedule layer's own refusal; a row stored in between is shown.
    return schedules.info(schedules.find(store, console.name, name), store.now())


def pause(console: Console, name: str, paused: bool) -> records.ScheduleInfo:
    """Pause (``paused``) or resume the schedule; return it as it now is.

    Raises:
        errors.ScheduleNotFound: the app has no such schedule.
    """
    app = console.app
    if app is not None:
        return app.pause_schedule(name) if paused else app.resume_schedule(name)
    store = console.client.store
    return schedules.info(schedules.pause(store, console.name, name, paused), store.now())


def trigger(console: Console, name: str) -> records.RunInfo:
    """Start one run of the schedule now, with this instant as its tick; return the run.

    Raises:
        errors.ScheduleNotFound: the app has no such schedule.
    """
    app = console.app
    if app is not None:
        return app.trigger_schedule(name).info()
    started = schedules.trigger(console.client.store, console.name, name)
    return client_api.run_info(started, console.client.payloads.reveal)


def last_runs(console: Console, found: list[records.ScheduleInfo]) -> dict[str, records.RunInfo]:
    """Return the last run of each schedule that has one, by run id.

    A run removed since (by retention) is left out: the page shows its id alone.
    """
    runs: dict[str, records.RunInfo] = {}
    for info in found:
        if info.last_run_id is None or info.last_run_id in runs:
            continue
        try:
            runs[info.last_run_id] = console.client.get(info.last_run_id)
        except errors.RunNotFound:
            continue
    return runs


def now(console: Console) -> datetime:
    """Return the store's instant: the clock every schedule runs off."""
    return console.client.store.now()
