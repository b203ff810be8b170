"""``perdure migrate``: create or upgrade the store's schema, and an app's own."""

from __future__ import annotations

import click

from perdure.cli import common, output


@click.command()
@click.argument("target", metavar="[MODULE:APP]", required=False)
@common.options
def migrate(target: str | None, store_url: str | None, as_json: bool) -> None:
    """Create or upgrade the store's schema (and MODULE:APP's own, from @app.migration)."""
    applied: list[int] = []
    if target:
        app = common.load_app(target)
        if store_url:
            app.use_store(store_url)
        applied = app.migrate()
        url = output.redact(app.store.url)
    else:
        with common.opened(store_url) as store:
            url = output.redact(store.url)
    if as_json:
        doc: dict[str, object] = {"store": url, "migrated": True}
        if target:
            doc["app_migrations_applied"] = applied
        output.emit_json(doc)
    else:
        click.echo(f"store {url} is migrated to this version of perdure")
        if target:
            done = ", ".join(map(str, applied)) if applied else "none (all applied before)"
            click.echo(f"app migrations applied: {done}")
