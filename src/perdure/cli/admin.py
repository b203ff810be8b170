"""Commands about the store and the installation: ``migrate`` and ``demo``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from perdure.cli import console, plumbing


@click.command()
@plumbing._common
def migrate(store_url: str | None, as_json: bool) -> None:
    """Create or upgrade the store's schema."""
    with plumbing._opened(store_url) as store:
        url = console._redact(store.url)
    if as_json:
        console._emit_json({"store": url, "migrated": True})
    else:
        click.echo(f"store {url} is migrated to this version of perdure")


@click.command()
@plumbing._common
def demo(store_url: str | None, as_json: bool) -> None:
    """Run the embedded example end to end.

    A worker process is killed with SIGKILL in the middle of a run; a second
    one finishes it, and no finished step runs again.
    """
    from perdure import demo as demo_api

    report: dict[str, Any] = {}
    out: Callable[[str], None] = (
        (lambda line: click.echo(line, err=True)) if as_json else click.echo
    )
    code = demo_api.run_demo(out, store=store_url, report=report)
    if as_json and not code:
        console._emit_json(report)
    if code:
        fail = console.Fail("demo_failed", str(report.get("problem") or "the demo failed"), code)
        fail.label = "error"
        fail.doc = report
        raise fail
