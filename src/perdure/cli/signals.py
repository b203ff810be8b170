"""Signals and messages to waiting runs: ``signal``, ``send``, ``waits`` and ``resume``."""

from __future__ import annotations

from typing import Any

import click

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
    with common.opened(store_url, create=False) as store:
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
    with common.opened(store_url, create=False) as store:
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


KINDS = ("signal", "channel", "child", "sleep", "timer")


@click.command()
@common.app_option
@click.option("--run", "run_id", default=None, metavar="RUN_ID", help="Only this run's waits.")
@click.option(
    "--kind",
    type=click.Choice([*KINDS, "all"]),
    default="all",
    show_default=True,
    help="signal: ctx.wait; channel: ctx.receive; child: a child's result; sleep: "
    "ctx.sleep; timer: a queued run held back (a retry's backoff).",
)
@common.read_options
def waits(
    target: str | None,
    app_name: str | None,
    run_id: str | None,
    kind: str,
    store_url: str | None,
    as_json: bool,
) -> None:
    """List what runs wait for: signals, messages, children, sleeps and timers.

    The app is --app, else the app of MODULE:APP, else $PERDURE_APP, else
    every app in the store (--run finds its run's app). DEADLINE is when a
    wait times out, a sleep ends or a held-back run becomes claimable. Waits
    whose deadline has passed are settled as timed out on the way.
    """
    url, name = common.read_scope(target, app_name, store_url)
    found: list[tuple[str, records.Wait]] = []
    with common.opened(url, create=False) as store:
        if run_id is not None:
            clients = [common.client_for_run(store, run_id)]
        else:
            clients = [common.client(store, app) for app in common.apps_in(store, name)]
        for client in clients:
            listed = client.waits(run_id) + client.timers(run_id)
            found += [(client.app, w) for w in listed if kind in ("all", w.kind)]
    if as_json:
        output.emit_json([w for _, w in found])
    elif not found:
        click.echo("no open waits" if kind == "all" else f"no open waits of kind {kind}")
    else:
        # Listing every app's waits, the table names each one's app.
        every = run_id is None and name is None
        output.echo_lines(
            output.table(
                ["WAIT", "KIND", "DEADLINE", *(["APP"] if every else [])],
                [
                    [w.wait_id, w.kind, output.when(w.deadline), *([app] if every else [])]
                    for app, w in found
                ],
            )
        )


@click.command()
@click.argument("run_id")
@common.options
def resume(run_id: str, store_url: str | None, as_json: bool) -> None:
    """Resume a suspended run, or re-queue a waiting run whose waits all have outcomes.

    A suspended run returns to queued or waiting (re-queued at once if a wait
    is met or a deadline passed meanwhile).
    """
    with common.opened(store_url, create=False) as store:
        client = common.client_for_run(store, run_id)
        before = client.get(run_id)
        requeued = client.resume(run_id)
        info = client.get(run_id)
    if as_json:
        output.emit_json({"run_id": run_id, "requeued": requeued, "state": info.state})
    elif requeued and (before.state == "suspended" or before.suspend_requested):
        click.echo(f"run {run_id} resumed (now {info.state})")
    elif requeued:
        click.echo(f"run {run_id} re-queued (now {info.state})")
    else:
        click.echo(f"run {run_id} is {info.state}; nothing to resume")
