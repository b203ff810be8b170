"""Signals and messages to waiting runs: ``signal``, ``send``, ``waits`` and ``resume``."""

from __future__ import annotations

from typing import Any

import click

from perdure import client as client_api
from perdure import errors, records
from perdure.cli import common, output


def receipt_lines(receipt: records.Receipt) -> list[str]:
    return [
        f"wait     {receipt.wait_id}",
        f"outcome  {receipt.outcome}",
        f"at       {output.when(receipt.at)}",
        f"signal   {receipt.signal_id or '-'}",
        f"digest   {receipt.payload_digest or '-'}",
    ]


@click.command()
@click.argument("run_id")
@click.argument("name")
@click.option(
    "--payload",
    type=common.JsonValue(),
    default=None,
    metavar="JSON",
    help="The signal's payload (a JSON value).",
)
@click.option(
    "--signal-id",
    default=None,
    metavar="ID",
    help="Deduplication id: a repeat returns the original receipt.",
)
@common.options
def signal(
    run_id: str,
    name: str,
    payload: Any,
    signal_id: str | None,
    store_url: str | None,
    as_json: bool,
) -> None:
    """Signal a run's wait and print the receipt.

    Exits 1, printing the stored receipt, when the wait was already settled
    by another signal, a timeout or a cancel.
    """
    with common.opened(store_url) as store:
        client = common.client_for_run(store, run_id)
        try:
            receipt = client.signal(run_id, name, payload, signal_id)
        except (errors.WaitSettled, errors.WaitExpired) as exc:
            stored: records.Receipt = exc.receipt
            raise output.Fail(exc, doc={"receipt": stored}, lines=receipt_lines(stored)) from exc
    if as_json:
        output.emit_json(receipt)
    else:
        output.echo_lines(receipt_lines(receipt))


@click.command()
@click.argument("run_id")
@click.argument("channel")
@click.argument("key")
@click.option(
    "--payload",
    type=common.JsonValue(),
    default=None,
    metavar="JSON",
    help="The message's payload (a JSON value).",
)
@common.options
def send(
    run_id: str, channel: str, key: str, payload: Any, store_url: str | None, as_json: bool
) -> None:
    """Send a message to a run's channel.

    A repeated KEY is not stored again: the first payload wins.
    """
    with common.opened(store_url) as store:
        stored = common.client_for_run(store, run_id).send(run_id, channel, key, payload)
    if as_json:
        output.emit_json({"run_id": run_id, "channel": channel, "key": key, "stored": stored})
    elif stored:
        click.echo(f"message {key} stored on channel {channel} of run {run_id}")
    else:
        click.echo(
            f"message {key} was already sent on channel {channel} of run {run_id}; "
            "the first payload is kept"
        )


@click.command()
@click.option("--run", "run_id", default=None, metavar="RUN_ID", help="Only this run's waits.")
@click.option(
    "--app",
    "app_name",
    default="default",
    show_default=True,
    metavar="NAME",
    help="The app whose waits to list (ignored with --run).",
)
@common.options
def waits(run_id: str | None, app_name: str, store_url: str | None, as_json: bool) -> None:
    """List open waits.

    Waits whose deadline has passed are settled as timed out on the way.
    """
    with common.opened(store_url) as store:
        if run_id is not None:
            client = common.client_for_run(store, run_id)
        else:
            client = client_api.Client(store, app_name)
        found = client.waits(run_id)
    if as_json:
        output.emit_json(found)
    elif not found:
        click.echo("no open waits")
    else:
        output.echo_lines(
            output.table(
                ["WAIT", "KIND", "DEADLINE"],
                [[w.wait_id, w.kind, output.when(w.deadline)] for w in found],
            )
        )


@click.command()
@click.argument("run_id")
@common.options
def resume(run_id: str, store_url: str | None, as_json: bool) -> None:
    """Re-queue a waiting run whose waits all have outcomes."""
    with common.opened(store_url) as store:
        client = common.client_for_run(store, run_id)
        requeued = client.resume(run_id)
        info = client.get(run_id)
    if as_json:
        output.emit_json({"run_id": run_id, "requeued": requeued, "state": info.state})
    elif requeued:
        click.echo(f"run {run_id} re-queued (now {info.state})")
    else:
        click.echo(f"run {run_id} is {info.state}; nothing to resume")
