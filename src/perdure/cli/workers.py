"""``perdure worker MODULE:APP``: serve an app's runs."""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import sys

import click

from perdure import logs
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
@click.option(
    "--grace",
    type=click.FloatRange(min=0),
    default=30.0,
    show_default=True,
    help="Seconds a stopping worker lets in-flight steps finish before it releases their runs.",
)
@click.option(
    "--warm",
    type=click.IntRange(min=0),
    default=None,
    metavar="N",
    help="Parked runs kept in memory to go on without a replay when woken here "
    "(default: --concurrency; 0: none).",
)
@click.option(
    "--warm-for",
    type=click.FloatRange(min=0),
    default=5.0,
    show_default=True,
    metavar="S",
    help="Seconds a parked run is kept in memory.",
)
@click.option(
    "--liveness",
    type=click.Choice(["process", "thread"]),
    default="process",
    show_default=True,
    help="Renew leases from a keeper process (a step holding the GIL cannot starve it) "
    "or from a thread of the worker.",
)
@click.option(
    "--ownership",
    type=click.Choice(["run-lease", "store-lease", "none"]),
    default="run-lease",
    show_default=True,
    help="run-lease: any number of workers, each run leased and renewed; store-lease: one "
    "active worker holds the app's lease, others stand by and take over within --lease-ttl "
    "of its end; none: this worker alone serves the app (any other worker is refused), with "
    "no run lease to renew.",
)
@click.option(
    "--lease-wait",
    type=click.FloatRange(min=0),
    default=60.0,
    show_default=True,
    metavar="S",
    help="store-lease: seconds a standby waits before it logs which worker holds the app "
    "(it stands by after that too).",
)
@click.option(
    "--no-standby",
    is_flag=True,
    help="store-lease: exit 1 at once if another worker holds the app, instead of standing by.",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Claim only dry runs (started with --dry-run), and no other: their once and "
    "idempotent steps are described in the journal, not performed.",
)
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="Log lines on stderr as text, or as one JSON object per line (ts, level, logger, "
    "message, and run_id, app, workflow, step, attempt when known).",
)
@common.serve_options
def worker(
    target: str,
    concurrency: int,
    lease_ttl: float,
    heartbeat: float,
    grace: float,
    warm: int | None,
    warm_for: float,
    liveness: str,
    ownership: str,
    lease_wait: float,
    no_standby: bool,
    dry_run: bool,
    log_format: logs.LogFormat,
    store_url: str | None,
) -> None:
    """Serve the app's runs until SIGINT or SIGTERM.

    The first signal stops claiming and lets in-flight steps record their
    outcomes (up to --grace seconds); a second one stops at once. SIGUSR1
    prints every thread's stack on stderr and changes nothing. Exits 1
    when it left a run in flight. It first prints one line naming the worker,
    the app, the store it serves and the workflows it has. It never ends by
    itself, so it prints no JSON document: see its log on stderr.
    """
    app = common.load_app(target)
    if store_url:
        app.use_store(store_url)
    logs.configure(log_format)
    # `kill -USR1 PID` prints every thread's stack on stderr: what a worker
    # that does not answer is doing, without stopping it. (Only where stderr
    # is a file: a worker run inside another program may not have one.)
    with contextlib.suppress(AttributeError, OSError, ValueError):
        faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
    try:
        served = app.worker(
            concurrency=concurrency,
            lease_ttl=lease_ttl,
            heartbeat=heartbeat,
            grace=grace,
            warm=warm,
            warm_for=warm_for,
            liveness=liveness,
            dry_run=dry_run,
            ownership=ownership,
            lease_wait=lease_wait,
            standby=not no_standby,
        )
        served.acquire()  # refused before it says it serves
        names = ", ".join(f"{n} v{v}" for n, v in app.workflow_versions()) or "none"
        click.echo(
            f"{'dry-run worker' if dry_run else 'worker'} {served.worker_id} "
            f"serving app {app.name} on "
            f"{output.redact(app.store.url)} (workflows: {names}, pid {os.getpid()}); "
            + ("standing by for the app's store lease; " if served.standing_by else "")
            + "Ctrl-C to stop"
        )
        sys.stdout.flush()
        clean = served.run()
        if not clean:
            # A step left in flight still runs in a thread that would hold the
            # process open; its run was handed over, so nothing it does counts.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(1)
    finally:
        app.close()
