"""``perdure demo``: the embedded example, end to end."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from perdure import errors
from perdure.cli import common, output


@click.command()
@common.options
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
        output.emit_json(report)
    if code:
        problem = str(report.get("problem") or "the demo failed")
        raise output.Fail(errors.DemoFailed(problem), status=code, doc=report)
