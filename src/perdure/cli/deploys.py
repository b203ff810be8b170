"""``perdure check MODULE:APP``: will this code replay every live run's journal?"""

from __future__ import annotations

import dataclasses

import click

from perdure import check as check_api
from perdure import errors
from perdure.cli import common, output


@click.command()
@click.argument("target", metavar="MODULE:APP")
@common.app_options
def check(target: str, store_url: str | None, as_json: bool) -> None:
    """Replay every live run's journal against this code, before you deploy it.

    Each queued, running or waiting run whose workflow and version MODULE:APP
    registers is replayed without executing any step or writing anything, up
    to the end of its recorded journal. Prints each mismatch as the position,
    the call the journal recorded there and the call the code now makes.
    Exits 1 if any run does not replay, 0 if all do.
    """
    app = common.load_app(target)
    url = store_url or app.url
    with common.opened(url, create=False, migrate=False) as store:
        report = check_api.replay_check(app, store)
        where = output.redact(store.url)
    doc = {
        "app": app.name,
        "store": where,
        "ok": report.ok,
        "checked": len(report.checked),
        "mismatches": [dataclasses.asdict(m) for m in report.mismatches],
        "skipped": [dataclasses.asdict(s) for s in report.skipped],
    }
    lines = [m.describe() for m in report.mismatches]
    lines += [
        f"skipped run {s.run_id} ({s.workflow} v{s.version}): {s.reason}" for s in report.skipped
    ]
    summary = (
        f"checked {len(report.checked)} live runs of app {app.name}: "
        f"{len(report.mismatches)} do not replay"
    )
    if report.mismatches:
        raise output.Fail(
            errors.NonDeterminism(
                f"{len(report.mismatches)} of {len(report.checked)} live runs do not replay "
                "with this code; deploying it would stop them in needs_attention "
                "(non_determinism). Keep the old path for them with ctx.patched(...)"
            ),
            status=output.EXIT_REFUSED,
            doc=doc,
            lines=[*lines, summary],
        )
    if as_json:
        output.emit_json(doc)
    else:
        output.echo_lines([*lines, summary])
