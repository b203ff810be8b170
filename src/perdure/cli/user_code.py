"""The commands that import user code (``MODULE:APP``): ``worker`` and ``start``."""

from __future__ import annotations

import importlib
import logging
import os
import sys
from typing import Any

import click

from perdure import app as app_api
from perdure import errors
from perdure.cli import console, plumbing


def _load_app(target: str) -> app_api.App:
    """Import ``MODULE:APP`` (the current directory first on the path) and return the App."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise console.Fail(
            "invalid_input",
            f"expected MODULE:APP (like shop:app), got {target!r}",
            console.EXIT_BAD_INPUT,
        )
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # SyntaxError, ImportError, whatever its top level raised
        raise console.Fail(
            "import_failed",
            f"cannot import module {module_name!r}: {type(exc).__name__}: {exc}",
            console.EXIT_BAD_INPUT,
        ) from exc
    found: Any = module
    for part in attr.split("."):
        try:
            found = getattr(found, part)
        except AttributeError:
            raise console.Fail(
                "app_not_found",
                f"module {module_name!r} has no attribute {attr!r}",
                console.EXIT_BAD_INPUT,
            ) from None
    if not isinstance(found, app_api.App):
        raise console.Fail(
            "app_not_found",
            f"{target} is a {type(found).__name__}, not a perdure.App",
            console.EXIT_BAD_INPUT,
        )
    return found


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
    "--liveness",
    type=click.Choice(["process", "thread"]),
    default="process",
    show_default=True,
    help="Renew leases from a keeper process (a step holding the GIL cannot starve it) "
    "or from a thread of the worker.",
)
@plumbing._common
def worker(
    target: str,
    concurrency: int,
    lease_ttl: float,
    heartbeat: float,
    grace: float,
    liveness: str,
    store_url: str | None,
    as_json: bool,
) -> None:
    """Serve the app's runs until SIGINT or SIGTERM.

    The first signal stops claiming and lets in-flight steps record their
    outcomes (up to --grace seconds); a second one stops at once. Exits 1
    when it left a run in flight.
    """
    app = _load_app(target)
    if store_url:
        app.use_store(store_url)
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        served = app.worker(
            concurrency=concurrency,
            lease_ttl=lease_ttl,
            heartbeat=heartbeat,
            grace=grace,
            liveness=liveness,
        )
        about = {
            "worker_id": served.worker_id,
            "app": app.name,
            "store": console._redact(app.store.url),
            "pid": os.getpid(),
            "workflows": [{"name": n, "version": v} for n, v in app.workflow_versions()],
            "concurrency": concurrency,
            "lease_ttl": lease_ttl,
            "heartbeat": heartbeat,
            "grace": grace,
            "liveness": served.liveness,
        }
        if as_json:
            click.echo(
                console._compact(about)
            )  # one line, so a supervisor can read it as it starts
        else:
            names = ", ".join(f"{n} v{v}" for n, v in app.workflow_versions()) or "none"
            click.echo(
                f"worker {served.worker_id} serving app {app.name} on "
                f"{about['store']} (workflows: {names}); Ctrl-C to stop"
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


@click.command()
@click.argument("target", metavar="MODULE:APP")
@click.argument("workflow")
@click.option(
    "--args",
    "args_",
    type=plumbing.JsonValue(list),
    default=None,
    metavar="JSON",
    help="Positional arguments as a JSON array.",
)
@click.option(
    "--kwargs",
    "kwargs_",
    type=plumbing.JsonValue(dict),
    default=None,
    metavar="JSON",
    help="Keyword arguments as a JSON object.",
)
@click.option(
    "--key",
    default=None,
    help="Idempotency key: the same key with the same workflow and arguments returns the "
    "same run; with another workflow or other arguments the start is refused (exit 1).",
)
@click.option("--wait", is_flag=True, help="Wait for the run to end (a worker must be running).")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0),
    default=None,
    metavar="S",
    help="With --wait, give up after S seconds.",
)
@plumbing._common
def start(
    target: str,
    workflow: str,
    args_: list[Any] | None,
    kwargs_: dict[str, Any] | None,
    key: str | None,
    wait: bool,
    timeout: float | None,
    store_url: str | None,
    as_json: bool,
) -> None:
    """Start a run of a workflow.

    With --key, the run already started under that key is returned instead;
    exits 1 (key_conflict) if that run has another workflow or other arguments.
    With --wait, exits 1 unless the run succeeds.
    """
    if timeout is not None and not wait:
        raise console.Fail(
            "invalid_input", "--timeout only makes sense with --wait", console.EXIT_BAD_INPUT
        )
    app = _load_app(target)
    if store_url:
        app.use_store(store_url)
    try:
        handle = app.start(workflow, *(args_ or []), key=key, **(kwargs_ or {}))
        info = app.get(handle.run_id)
        if not wait:
            if as_json:
                console._emit_json(console._run_doc(info, app.name))
            else:
                click.echo(
                    f"run {info.run_id} {info.state} "
                    f"(workflow {info.workflow} v{info.version}, app {app.name})"
                )
            return
        if not as_json:
            click.echo(f"run {info.run_id} {info.state}; waiting for it to end")
        try:
            handle.result(timeout=timeout)
        except (errors.RunFailed, errors.ResultTimeout) as exc:
            info = app.get(handle.run_id)
            raise console.Fail.of(
                exc,
                doc={"run": console._run_doc(info, app.name)},
                lines=[f"run {info.run_id} is {info.state}: {console._why(info.error)}"]
                if info.error
                else [],
            ) from exc
        info = app.get(handle.run_id)
        if as_json:
            console._emit_json(console._run_doc(info, app.name))
        else:
            click.echo(f"run {info.run_id} succeeded: {console._compact(info.result)}")
    finally:
        app.close()
