"""``perdure prune``: delete an app's runs that ended long ago, by hand."""

from __future__ import annotations

from datetime import timedelta

import click

from perdure import errors
from perdure.cli import common, output
from perdure.cli.tokens import Duration
from perdure.store import retention


@click.command()
@click.option("--app", "app_name", required=True, help="The app whose runs are pruned.")
@click.option(
    "--older-than",
    "older_than",
    type=Duration(),
    required=True,
    help="Prune runs that ended longer ago than this (90m, 12h, 30d, 2w).",
)
@click.option(
    "--batch",
    type=click.IntRange(1, 10_000),
    default=500,
    show_default=True,
    help="Runs deleted per transaction.",
)
@common.options
def prune(
    app_name: str, older_than: timedelta, batch: int, store_url: str | None, as_json: bool
) -> None:
    """Delete the app's runs that ended (succeeded, failed, canceled) before now - OLDER_THAN.

    Each run goes with its journal, ledger, waits, outcomes and messages. Live
    runs and runs in needs_attention are never pruned. Workers prune on their
    own when the app sets a retention (App(retention=...), 30 days by default).
    """
    with common.opened(store_url) as store:
        if not isinstance(store, retention.PrunableStore):
            raise errors.StoreError(f"the store {store.url} cannot prune runs")
        cutoff = store.now() - older_than
        total = 0
        while True:
            pruned = store.prune(app_name, cutoff, batch)
            total += pruned
            if pruned < batch:
                break
        if as_json:
            output.emit_json({"app": app_name, "ended_before": cutoff, "pruned": total})
        else:
            click.echo(
                f"pruned {total} runs of app {app_name} that ended before {output.when(cutoff)}"
            )
