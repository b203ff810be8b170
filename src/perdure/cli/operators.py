"""What an operator does to one run: ``cancel``, ``suspend``, ``resolve`` and ``fork``."""

from __future__ import annotations

from typing import Any

import click

from perdure import errors
from perdure.cli import common, output


@click.command()
@click.argument("run_id")
@common.options
def cancel(run_id: str, store_url: str | None, as_json: bool) -> None:
    """Cancel a run and its descendants.

    Queued and waiting runs end at once; a running one stops at its next step.
    Exits 1 if the cancel took no effect (the run had already ended).
    """
    with common.opened(store_url, create=False) as store:
        client = common.client_for_run(store, run_id)
        took = client.cancel(run_id)
        info = client.get(run_id)
    doc = {
        "run_id": run_id,
        "canceled": took,
        "state": info.state,
        "cancel_requested": info.cancel_requested,
    }
    if not took:
        raise output.Fail(
            errors.NotCanceled(f"cancel of run {run_id} took no effect: it is {info.state}"),
            doc=doc,
        )
    if as_json:
        output.emit_json(doc)
    elif info.state == "canceled":
        click.echo(f"run {run_id} canceled")
    elif info.state == "needs_attention":
        click.echo(
            f"cancel recorded for run {run_id}; it needs attention "
            f"({output.why(info.error)}): resolving the step with an output ends it "
            "canceled, with an error fails it"
        )
    else:
        click.echo(f"cancel requested for run {run_id} ({info.state}); it stops at its next step")


@click.command()
@click.argument("run_id")
@common.options
def suspend(run_id: str, store_url: str | None, as_json: bool) -> None:
    """Suspend a run: no worker claims it until `perdure resume RUN`.

    Queued and waiting runs are suspended at once; a running one at its next
    journal write (its current step's outcome is still recorded). Its
    deadlines are kept and fire after the resume. Suspending it again changes
    nothing. Exits 1 if the run has ended or needs attention.
    """
    with common.opened(store_url, create=False) as store:
        client = common.client_for_run(store, run_id)
        took = client.suspend(run_id)
        info = client.get(run_id)
    doc = {
        "run_id": run_id,
        "suspended": took,
        "state": info.state,
        "suspend_requested": info.suspend_requested,
    }
    if as_json:
        output.emit_json(doc)
    elif info.suspend_requested:
        click.echo(f"suspend requested for run {run_id}; it stops at its next journal write")
    elif took:
        click.echo(f"run {run_id} suspended")
    else:
        click.echo(f"run {run_id} is already {info.state}")


@click.command()
@click.argument("run_id")
@click.argument("step")
@click.option(
    "--output",
    "output_",
    type=common.JsonValue(),
    default=None,
    metavar="JSON",
    help="The step succeeded with this output (a JSON value); the run resumes.",
)
@click.option(
    "--error",
    "error_",
    default=None,
    metavar="MSG",
    help="The step failed with this message; the run fails.",
)
@click.option("--note", default=None, metavar="TEXT", help="Why, for the provenance ledger.")
@common.options
def resolve(
    run_id: str,
    step: str,
    output_: Any,
    error_: str | None,
    note: str | None,
    store_url: str | None,
    as_json: bool,
) -> None:
    """Settle the ambiguous STEP of a needs_attention run."""
    ctx = click.get_current_context()
    given_output = ctx.get_parameter_source("output_") == click.core.ParameterSource.COMMANDLINE
    if given_output == (error_ is not None):
        raise errors.InvalidInput("give exactly one of --output JSON or --error MSG")
    with common.opened(store_url, create=False) as store:
        client = common.client_for_run(store, run_id)
        if given_output:
            info = client.resolve(run_id, step, output=output_, note=note)
        else:
            info = client.resolve(run_id, step, error=error_, note=note)
    if as_json:
        output.emit_json(output.run_doc(info, client.app))
    elif given_output:
        click.echo(f"step {step} of run {run_id} resolved as succeeded; the run is {info.state}")
    else:
        click.echo(f"step {step} of run {run_id} resolved as failed; the run is {info.state}")


@click.command()
@click.argument("run_id")
@click.option(
    "--from-step",
    default=None,
    metavar="STEP",
    help="Re-execute from this step (its key, e.g. charge or charge#2); "
    "default: from the first entry that did not succeed.",
)
@click.option(
    "--live",
    is_flag=True,
    help="Fork a run that is still queued, running or waiting (needs --from-step "
    "before its in-flight step).",
)
@common.options
def fork(
    run_id: str, from_step: str | None, live: bool, store_url: str | None, as_json: bool
) -> None:
    """Start a new run of RUN_ID's workflow and inputs that reuses its journal.

    The new run replays the recorded steps before the cut and executes from
    there: the way to retry a failed run once its code is fixed. Exits 1 for a
    run still live (unless --live with --from-step before its in-flight step)
    and for a default cut on a once step whose outcome is unknown (resolve it
    first, or name --from-step).
    """
    with common.opened(store_url, create=False) as store:
        client = common.client_for_run(store, run_id)
        forked = client.fork(run_id, from_step, live=live)
        reused = len(store.journal(forked.run_id))
        info = client.get(forked.run_id)
    if as_json:
        output.emit_json(
            {"forked_from": run_id, "reused_entries": reused, **output.run_doc(info, client.app)}
        )
    else:
        click.echo(
            f"run {forked.run_id} forked from {run_id}: {reused} journal entries reused, "
            f"the run is {info.state}"
        )
