"""``perdure queues``: an app's queues, their limits and their runs, from the store alone.

A queue is declared in code (``app.queue``); its row is stored when the app
first needs it there (a start in it, a worker), and that row is what this
command reads.
"""

from __future__ import annotations

import os
from typing import Any

import click

from perdure import queues
from perdure.cli import common, output


def _doc(info: queues.QueueInfo) -> dict[str, Any]:
    rate = None
    if info.rate is not None:
        rate = {"n": info.rate.n, "per_seconds": info.rate.per.total_seconds()}
    return {
        "app": info.app,
        "name": info.name,
        "concurrency": info.concurrency,
        "per_key": info.per_key,
        "rate": rate,
        "running": info.running,
        "waiting": info.waiting,
    }


def _limit(value: int | None) -> str:
    return "-" if value is None else str(value)


@click.command("queues")
@click.option(
    "--app",
    "app_name",
    default=None,
    metavar="NAME",
    help="Only this app (default: $PERDURE_APP, else every app in the store).",
)
@common.options
def queues_(app_name: str | None, store_url: str | None, as_json: bool) -> None:
    """List the queues: limits (concurrency, per key, rate), running and waiting runs.

    Waiting runs are queued for a slot (or held back by a retry's backoff);
    parked runs hold no slot and are not counted.
    """
    name = app_name or os.environ.get("PERDURE_APP") or None
    with common.opened(store_url, create=False) as store:
        found = queues.listing(store, name)
    if as_json:
        output.emit_json([_doc(i) for i in found])
        return
    if not found:
        click.echo("no queues (a queue is stored when its app first starts a run in it)")
        return
    headers = ["APP", "NAME", "CONCURRENCY", "PER_KEY", "RATE", "RUNNING", "WAITING"]
    rows = [
        [
            i.app,
            i.name,
            _limit(i.concurrency),
            _limit(i.per_key),
            "-" if i.rate is None else f"{i.rate.n}/{i.rate.per.total_seconds():g}s",
            str(i.running),
            str(i.waiting),
        ]
        for i in found
    ]
    output.echo_lines(output.table(headers, rows))
