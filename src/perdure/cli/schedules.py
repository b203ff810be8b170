"""``perdure schedules [pause|resume|trigger NAME]``: an app's schedules, from the store alone.

A schedule is declared in code; its row is stored when a worker first serves
the app, and that row is what these commands read and change.
"""

from __future__ import annotations

import os
from typing import Any

import click

from perdure import errors, records, schedules
from perdure.cli import common, output


def _doc(info: records.ScheduleInfo) -> dict[str, Any]:
    return {
        "app": info.app,
        "name": info.name,
        "workflow": info.workflow,
        "cron": info.cron,
        "tz": info.tz,
        "catch_up": info.catch_up,
        "paused": info.paused,
        "last_tick": info.last_tick,
        "last_run_id": info.last_run_id,
        "next_tick": info.next_tick,
    }


def _given(
    app_name: str | None, store_url: str | None, as_json: bool
) -> tuple[str, str | None, bool]:
    """Return the app, store and --json of a subcommand, those of the group filling gaps."""
    up: dict[str, Any] = click.get_current_context().find_object(dict) or {}
    return (
        _app(app_name or up.get("app_name")),
        store_url or up.get("store_url"),
        as_json or bool(up.get("as_json")),
    )


def _app(app_name: str | None) -> str:
    name = app_name or os.environ.get("PERDURE_APP")
    if not name:
        raise errors.InvalidInput("say which app: --app NAME (or set $PERDURE_APP)")
    return name


def _app_option(fn: Any) -> Any:
    return click.option(
        "--app",
        "app_name",
        default=None,
        metavar="NAME",
        help="The app (default: $PERDURE_APP; the listing shows every app without it).",
    )(fn)


@click.group(invoke_without_command=True)
@_app_option
@common.options
@click.pass_context
def schedules_(
    ctx: click.Context, app_name: str | None, store_url: str | None, as_json: bool
) -> None:
    """List the schedules: cron, time zone, catch_up, paused, last tick and next tick.

    With a subcommand, pause, resume or trigger one schedule by name.
    """
    if ctx.invoked_subcommand is not None:
        # `perdure schedules --app A pause NAME` means what `pause NAME --app A` does.
        ctx.obj = {"app_name": app_name, "store_url": store_url, "as_json": as_json}
        return
    name = app_name or os.environ.get("PERDURE_APP") or None
    with common.opened(store_url) as store:
        found = schedules.listing(store, name)
    if as_json:
        output.emit_json([_doc(i) for i in found])
        return
    if not found:
        click.echo("no schedules (a schedule is stored when a worker first serves its app)")
        return
    headers = ["APP", "NAME", "WORKFLOW", "CRON", "TZ", "CATCH_UP", "PAUSED", "LAST", "NEXT"]
    rows = [
        [
            i.app,
            i.name,
            i.workflow,
            i.cron,
            i.tz,
            i.catch_up,
            "yes" if i.paused else "no",
            output.when(i.last_tick),
            output.when(i.next_tick),
        ]
        for i in found
    ]
    output.echo_lines(output.table(headers, rows))


def _change(
    name: str, app_name: str | None, store_url: str | None, as_json: bool, paused: bool
) -> None:
    app, store_url, as_json = _given(app_name, store_url, as_json)
    with common.opened(store_url) as store:
        info = schedules.info(schedules.pause(store, app, name, paused), store.now())
    if as_json:
        output.emit_json(_doc(info))
    else:
        state = "paused" if paused else f"resumed; next tick {output.when(info.next_tick)}"
        click.echo(f"schedule {name} of app {app}: {state}")


@schedules_.command()
@click.argument("name")
@_app_option
@common.options
def pause(name: str, app_name: str | None, store_url: str | None, as_json: bool) -> None:
    """Stop starting the schedule's ticks, on every worker, until it is resumed."""
    _change(name, app_name, store_url, as_json, True)


@schedules_.command()
@click.argument("name")
@_app_option
@common.options
def resume(name: str, app_name: str | None, store_url: str | None, as_json: bool) -> None:
    """Start the schedule's ticks again; ticks passed while paused are skipped."""
    _change(name, app_name, store_url, as_json, False)


@schedules_.command()
@click.argument("name")
@_app_option
@common.options
def trigger(name: str, app_name: str | None, store_url: str | None, as_json: bool) -> None:
    """Start one run of the schedule now, with this instant as its tick (each call, a run)."""
    app, store_url, as_json = _given(app_name, store_url, as_json)
    with common.opened(store_url) as store:
        run = schedules.trigger(store, app, name)
    if as_json:
        output.emit_json({"app": app, "schedule": name, "run_id": run.run_id, "key": run.key})
    else:
        click.echo(run.run_id)


schedules_.name = "schedules"
