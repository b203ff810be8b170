"""``perdure migrate``: create or upgrade the store's schema."""

from __future__ import annotations

import click

from perdure.cli import common, output


@click.command()
@common.options
def migrate(store_url: str | None, as_json: bool) -> None:
    """Create or upgrade the store's schema."""
    with common.opened(store_url) as store:
        url = output.redact(store.url)
    if as_json:
        output.emit_json({"store": url, "migrated": True})
    else:
        click.echo(f"store {url} is migrated to this version of perdure")
