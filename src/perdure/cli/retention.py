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
    default=retention.DEFAULT_BATCH,
    show_default=True,
    help="Runs deleted per transaction.",
)
@click.option(
    "--pause-factor",
    "pause_factor",
    type=click.FloatRange(0, 100),
    default=retention.DEFAULT_PAUSE_FACTOR,
    show_default=True,
    help="After each batch, rest this many times as long as the batch took "
    "(0: no rest), bounding pruning's share of the store's time.",
)
@common.options
def prune(
    app_name: str,
    older_than: timedelta,
    batch: int,
    pause_factor: float,
    store_url: str | None,
    as_json: bool,
) -> None:
    """Delete the app's runs that ended (succeeded, failed, canceled) before now - OLDER_THAN.

    Each run goes with its journal, ledger, waits, outcomes, messages and updates. Live
    runs and runs in needs_attention are never pruned. Batches are paced: after
    each one the command rests --pause-factor times as long as it took (at
    most 5 s), which bounds the share of the store's time that pruning a
    large backlog takes. Workers prune on their
    own when the app sets a retention (App(retention=...), 30 days by default).
    """
    with common.opened(store_url) as store:
        if not isinstance(store, retention.PrunableStore):
            raise errors.StoreError(f"the store {store.url} cannot prune runs")
        cutoff = store.now() - older_than
        total = retention.prune_paced(
            store, app_name, cutoff, batch=batch, pause_factor=pause_factor
        )
        if as_json:
            output.emit_json({"app": app_name, "ended_before": cutoff, "pruned": total})
        else:
            click.echo(
                f"pruned {total} runs of app {app_name} that ended before {output.when(cutoff)}"
            )
