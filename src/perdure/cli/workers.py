"""``perdure worker MODULE:APP``: serve an app's runs."""

from __future__ import annotations

import logging
import os
import sys

import click

from perdure.cli import common, output


@click.command()
@click.argument("target", metavar="MODULE:APP")
@click.option(
    "--concurrency",
    type=click.IntRange(min=1),
    default=8,
    show_default=True,
    help="Runs executed at once.",
)
@click.option(
    "--lease-ttl",
    type=click.FloatRange(min=0, min_open=True),
    default=30.0,
    show_default=True,
    help="Seconds a claim lasts unless renewed.",
)
@click.option(
    "--heartbeat",
    type=click.FloatRange(min=0, min_open=True),
    default=5.0,
    show_default=True,
    help="Seconds between lease renewals (at most lease-ttl / 3).",
)
@common.options
def worker(
    target: str,
    concurrency: int,
    lease_ttl: float,
    heartbeat: float,
    store_url: str | None,
    as_json: bool,
) -> None:
    """Serve the app's runs until SIGINT or SIGTERM."""
    app = common.load_app(target)
    if store_url:
        app.use_store(store_url)
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        served = app.worker(concurrency=concurrency, lease_ttl=lease_ttl, heartbeat=heartbeat)
        about = {
            "worker_id": served.worker_id,
            "app": app.name,
            "store": output.redact(app.store.url),
            "pid": os.getpid(),
            "workflows": [{"name": n, "version": v} for n, v in app.workflow_versions()],
            "concurrency": concurrency,
            "lease_ttl": lease_ttl,
            "heartbeat": heartbeat,
        }
        if as_json:
            click.echo(output.compact(about))  # one line, so a supervisor can read it as it starts
        else:
            names = ", ".join(f"{n} v{v}" for n, v in app.workflow_versions()) or "none"
            click.echo(
                f"worker {served.worker_id} serving app {app.name} on "
                f"{about['store']} (workflows: {names}); Ctrl-C to stop"
            )
        sys.stdout.flush()
        served.run()
    finally:
        app.close()
