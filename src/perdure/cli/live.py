"""Talking to live runs: ``update``, ``query``, ``events`` and ``stream``."""

from __future__ import annotations

from typing import Any

import click

from perdure.cli import common, output


@click.command()
@click.argument("run_id")
@click.argument("name")
@click.option(
    "--payload",
    type=common.JsonValue(),
    default=None,
    metavar="JSON",
    help="The update's payload (a JSON value).",
)
@click.option(
    "--update-id",
    default=None,
    metavar="ID",
    help="Deduplication id: a repeat is applied once and gets the stored answer.",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0),
    default=None,
    metavar="S",
    help="Give up waiting for the answer after S seconds (exit 1).",
)
@click.option(
    "--validate",
    "target",
    default=None,
    metavar="MODULE:APP",
    help="Run the workflow's validator from this app first (the store alone has no code).",
)
@common.options
def update(
    run_id: str,
    name: str,
    payload: Any,
    update_id: str | None,
    timeout: float | None,
    target: str | None,
    store_url: str | None,
    as_json: bool,
) -> None:
    """Send an update to a live run and print the run's answer.

    Exits 1 when the validator rejects it, the run ended (before or without
    answering) or no answer came within --timeout.
    """
    if target is not None:
        app = common.load_app(target)
        if store_url and app.url != store_url:
            app.use_store(store_url)
        try:
            answer = app.update(run_id, name, payload, update_id, timeout)
        finally:
            app.close()
    else:
        with common.opened(store_url) as store:
            client = common.client_for_run(store, run_id)
            answer = client.update(run_id, name, payload, update_id, timeout)
    if as_json:
        output.emit_json({"run_id": run_id, "name": name, "response": answer})
    else:
        click.echo(output.compact(answer))


@click.command()
@click.argument("target", metavar="MODULE:APP")
@click.argument("run_id")
@click.argument("name")
@common.options
def query(target: str, run_id: str, name: str, store_url: str | None, as_json: bool) -> None:
    """Answer a workflow's query about a run, from its journal (no worker needed)."""
    app = common.load_app(target)
    if store_url and app.url != store_url:
        app.use_store(store_url)
    try:
        answer = app.query(run_id, name)
    finally:
        app.close()
    if as_json:
        output.emit_json({"run_id": run_id, "query": name, "answer": answer})
    else:
        click.echo(output.compact(answer))


@click.command()
@click.argument("run_id")
@common.options
def events(run_id: str, store_url: str | None, as_json: bool) -> None:
    """Print a run's events: the latest value of each key it set."""
    with common.opened(store_url) as store:
        found = common.client_for_run(store, run_id).events(run_id)
    if as_json:
        output.emit_json(found)
    elif not found:
        click.echo("no events")
    else:
        output.echo_lines(
            output.table(["KEY", "VALUE"], [[k, output.compact(v)] for k, v in found.items()])
        )


@click.command()
@click.argument("run_id")
@click.argument("key")
@click.option(
    "--after",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    metavar="N",
    help="Skip the first N items.",
)
@common.options
def stream(run_id: str, key: str, after: int, store_url: str | None, as_json: bool) -> None:
    """Follow a run's stream like tail -f: print each item, exit when it closes.

    Also exits when the run ends. Each item is printed on one line (with
    --json, one JSON value per line).
    """
    with common.opened(store_url) as store:
        client = common.client_for_run(store, run_id)
        for item in client.read_stream(run_id, key, after=after):
            if as_json or not isinstance(item, str):
                click.echo(output.compact(item))
            else:
                click.echo(item)
