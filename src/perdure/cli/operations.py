"""What an operator does to runs from the store alone: list, show, cancel, resolve, fork."""

from __future__ import annotations

from typing import Any

import click

from perdure import client as client_api
from perdure.cli import console, plumbing
from perdure.store import port


@click.command()
@click.option(
    "--state", type=click.Choice(port.RUN_STATES), default=None, help="Only runs in this state."
)
@click.option("--workflow", default=None, metavar="NAME", help="Only runs of this workflow.")
@click.option("--limit", type=click.IntRange(min=1), default=100, show_default=True)
@click.option(
    "--app",
    "app_name",
    default="default",
    show_default=True,
    metavar="NAME",
    help="The app whose runs to list.",
)
@plumbing._common
def runs(
    state: str | None,
    workflow: str | None,
    limit: int,
    app_name: str,
    store_url: str | None,
    as_json: bool,
) -> None:
    """List an app's runs, newest first.

    Failed and needs_attention runs say why they stopped.
    """
    with plumbing._opened(store_url) as store:
        found = client_api.Client(store, app_name).runs(state=state, workflow=workflow, limit=limit)
    if as_json:
        console._emit_json([console._run_doc(info, app_name) for info in found])
        return
    if not found:
        click.echo(f"no runs in app {app_name}" + (f" in state {state}" if state else ""))
        return
    lines = console._table(
        ["RUN", "WORKFLOW", "VERSION", "STATE", "ATTEMPT", "UPDATED"],
        [
            [i.run_id, i.workflow, i.version, i.state, str(i.attempt), console._when(i.updated_at)]
            for i in found
        ],
    )
    click.echo(lines[0])
    for info, line in zip(found, lines[1:], strict=True):
        click.echo(line)
        if info.error and info.state in ("failed", "needs_attention"):
            click.echo(f"    {console._why(info.error)}")


@click.command()
@click.argument("run_id")
@click.option("--history", is_flag=True, help="Also print the run's provenance ledger.")
@plumbing._common
def show(run_id: str, history: bool, store_url: str | None, as_json: bool) -> None:
    """Print a run (with --history, its provenance ledger)."""
    with plumbing._opened(store_url) as store:
        client = plumbing._client_for_run(store, run_id)
        info = client.get(run_id)
        children = client.children(run_id)
        ledger = client.history(run_id) if history else None
    if as_json:
        doc = console._run_doc(info, client.app)
        doc["children"] = children
        if ledger is not None:
            doc["history"] = ledger
        console._emit_json(doc)
        return
    rows = [
        ("run", info.run_id),
        ("app", client.app),
        ("workflow", f"{info.workflow} (version {info.version})"),
        (
            "state",
            info.state
            + (
                " (cancel requested)"
                if info.cancel_requested and (not info.done or info.state == "needs_attention")
                else ""
            ),
        ),
        ("attempt", f"{info.attempt} (consecutive failures: {info.failures})"),
        ("created", console._when(info.created_at)),
        ("updated", console._when(info.updated_at)),
        ("key", info.key or "-"),
        ("parent", info.parent_id or "-"),
    ]
    if children:
        rows.append(("children", ", ".join(f"{n} {s}" for s, n in sorted(children.items()))))
    if info.state == "succeeded":
        rows.append(("result", console._compact(info.result)))
    if info.error:
        rows.append(("error", console._why(info.error)))
    width = max(len(k) for k, _ in rows)
    for name, value in rows:
        click.echo(f"{name.ljust(width)}  {value}")
    if ledger is not None:
        click.echo("")
        console._echo_lines(
            console._table(
                ["SEQ", "AT", "KIND", "GEN", "WORKER", "STEP", "DIGEST", "NOTE"],
                [
                    [
                        str(p.sequence),
                        console._when(p.at),
                        p.kind,
                        str(p.generation),
                        p.worker or "-",
                        p.step or "-",
                        (p.digest or "-")[:12],
                        p.note or "",
                    ]
                    for p in ledger
                ],
            )
        )


@click.command()
@click.argument("run_id")
@plumbing._common
def cancel(run_id: str, store_url: str | None, as_json: bool) -> None:
    """Cancel a run and its descendants.

    Queued and waiting runs end at once; a running one stops at its next step.
    Exits 1 if the cancel took no effect (the run had already ended).
    """
    with plumbing._opened(store_url) as store:
        client = plumbing._client_for_run(store, run_id)
        took = client.cancel(run_id)
        info = client.get(run_id)
    doc = {
        "run_id": run_id,
        "canceled": took,
        "state": info.state,
        "cancel_requested": info.cancel_requested,
    }
    if not took:
        raise console.Fail(
            "not_canceled",
            f"cancel of run {run_id} took no effect: it is {info.state}",
            console.EXIT_REFUSED,
            doc=doc,
        )
    if as_json:
        console._emit_json(doc)
    elif info.state == "canceled":
        click.echo(f"run {run_id} canceled")
    elif info.state == "needs_attention":
        click.echo(
            f"cancel recorded for run {run_id}; it needs attention "
            f"({console._why(info.error)}): resolving the step with an output ends it "
            "canceled, with an error fails it"
        )
    else:
        click.echo(f"cancel requested for run {run_id} ({info.state}); it stops at its next step")


@click.command()
@click.argument("run_id")
@click.argument("step")
@click.option(
    "--output",
    type=plumbing.JsonValue(),
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
@plumbing._common
def resolve(
    run_id: str,
    step: str,
    output: Any,
    error_: str | None,
    note: str | None,
    store_url: str | None,
    as_json: bool,
) -> None:
    """Settle the ambiguous STEP of a needs_attention run."""
    ctx = click.get_current_context()
    given_output = ctx.get_parameter_source("output") == click.core.ParameterSource.COMMANDLINE
    if given_output == (error_ is not None):
        raise console.Fail(
            "invalid_input",
            "give exactly one of --output JSON or --error MSG",
            console.EXIT_BAD_INPUT,
        )
    with plumbing._opened(store_url) as store:
        client = plumbing._client_for_run(store, run_id)
        if given_output:
            info = client.resolve(run_id, step, output=output, note=note)
        else:
            info = client.resolve(run_id, step, error=error_, note=note)
    if as_json:
        console._emit_json(console._run_doc(info, client.app))
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
@plumbing._common
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
    with plumbing._opened(store_url) as store:
        client = plumbing._client_for_run(store, run_id)
        forked = client.fork(run_id, from_step, live=live)
        reused = len(store.journal(forked.run_id))
        info = client.get(forked.run_id)
    if as_json:
        console._emit_json(
            {"forked_from": run_id, "reused_entries": reused, **console._run_doc(info, client.app)}
        )
    else:
        click.echo(
            f"run {forked.run_id} forked from {run_id}: {reused} journal entries reused, "
            f"the run is {info.state}"
        )
