"""Runs: ``start`` (imports MODULE:APP), ``runs`` and ``show`` (from the store alone)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import click

from perdure import errors, records
from perdure.cli import common, journals, output, tasks
from perdure.store import port


@click.command()
@click.argument("target", metavar="MODULE:APP")
@click.argument("workflow")
@click.option(
    "--args",
    "args_",
    type=common.JsonValue(list),
    default=None,
    metavar="JSON",
    help="Positional arguments as a JSON array.",
)
@click.option(
    "--kwargs",
    "kwargs_",
    type=common.JsonValue(dict),
    default=None,
    metavar="JSON",
    help="Keyword arguments as a JSON object.",
)
@click.option(
    "--key",
    default=None,
    help="Idempotency key: the same key with the same workflow and arguments returns the "
    "same run; with another workflow or other arguments the start is refused (exit 1).",
)
@click.option(
    "--deadline",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    metavar="SECONDS",
    help="Cancel the run (deadline_exceeded) if it has not ended SECONDS from now.",
)
@click.option(
    "--queue",
    default=None,
    metavar="NAME",
    help="Start the run in this queue of the app (declared with app.queue).",
)
@click.option(
    "--queue-key",
    default=None,
    metavar="KEY",
    help="With --queue: what the queue's per-key limit counts (a customer, a tenant).",
)
@click.option(
    "--priority",
    type=int,
    default=None,
    help="With --queue: lower numbers are claimed first (default 0).",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Start a dry run: only `perdure worker --dry-run` claims it, and its once and "
    "idempotent steps are described in the journal, not performed.",
)
@click.option("--wait", is_flag=True, help="Wait for the run to end (a worker must be running).")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0),
    default=None,
    metavar="S",
    help="With --wait, give up after S seconds.",
)
@common.app_options
def start(
    target: str,
    workflow: str,
    args_: list[Any] | None,
    kwargs_: dict[str, Any] | None,
    key: str | None,
    deadline: float | None,
    queue: str | None,
    queue_key: str | None,
    priority: int | None,
    dry_run: bool,
    wait: bool,
    timeout: float | None,
    store_url: str | None,
    as_json: bool,
) -> None:
    """Start a run of a workflow.

    With --key, the run already started under that key is returned instead;
    exits 1 (key_conflict) if that run has another workflow or other arguments.
    With --wait, exits 1 unless the run succeeds.
    """
    if timeout is not None and not wait:
        raise errors.InvalidInput("--timeout only makes sense with --wait")
    app = common.load_app(target)
    if store_url:
        app.use_store(store_url)
    try:
        if app.plan_def(workflow) is not None and (
            deadline is not None or dry_run or queue or queue_key or priority is not None
        ):
            raise errors.InvalidInput(
                f"plan {workflow!r}: a plan run takes no --deadline, --queue, --queue-key, "
                "--priority or --dry-run (its tasks are claimed one by one)"
            )
        extra: dict[str, Any] = {}
        if deadline is not None:
            name = app.workflow_ref(workflow)[0]
            if "deadline" in app.workflows[name].params:
                raise errors.InvalidInput(
                    f"workflow {name} takes an argument named deadline: pass it in --kwargs; "
                    "--deadline cannot be used with it"
                )
            extra["deadline"] = timedelta(seconds=deadline)
        placed = {
            name: value
            for name, value in (("queue", queue), ("queue_key", queue_key), ("priority", priority))
            if value is not None
        }
        if dry_run:
            extra["dry_run"] = True
        given: dict[str, Any] = {**(kwargs_ or {}), **extra, **placed}
        handle = app.start(workflow, *(args_ or []), key=key, **given)
        info = app.get(handle.run_id)
        if not wait:
            if as_json:
                output.emit_json(output.run_doc(info, app.name))
            else:
                click.echo(
                    f"{'dry run' if info.dry_run else 'run'} {info.run_id} {info.state} "
                    f"(workflow {info.workflow} v{info.version}, app {app.name})"
                )
            return
        if not as_json:
            click.echo(f"run {info.run_id} {info.state}; waiting for it to end")
        try:
            handle.result(timeout=timeout)
        except (errors.RunFailed, errors.ResultTimeout) as exc:
            info = app.get(handle.run_id)
            raise output.Fail(
                exc,
                doc={"run": output.run_doc(info, app.name)},
                lines=[f"run {info.run_id} is {info.state}: {output.why(info.error)}"]
                if info.error
                else [],
            ) from exc
        info = app.get(handle.run_id)
        if as_json:
            output.emit_json(output.run_doc(info, app.name))
        else:
            click.echo(f"run {info.run_id} succeeded: {output.compact(info.result)}")
    finally:
        app.close()


@click.command()
@common.app_option
@click.option(
    "--state", type=click.Choice(port.RUN_STATES), default=None, help="Only runs in this state."
)
@click.option("--workflow", default=None, metavar="NAME", help="Only runs of this workflow.")
@click.option("--limit", type=click.IntRange(min=1), default=100, show_default=True)
@click.option(
    "--dry-run/--no-dry-run",
    "dry_run",
    default=None,
    help="Only dry runs, or only real ones (default: both; a dry run's state says so).",
)
@common.read_options
def runs(
    target: str | None,
    app_name: str | None,
    state: str | None,
    workflow: str | None,
    limit: int,
    dry_run: bool | None,
    store_url: str | None,
    as_json: bool,
) -> None:
    """List runs, newest first: every app's, or one app's.

    The app is --app, else the app of MODULE:APP, else $PERDURE_APP, else
    every app in the store. Failed and needs_attention runs say why they
    stopped. CLAIMS counts how many times a worker took the run.
    """
    url, name = common.read_scope(target, app_name, store_url)
    with common.opened(url, create=False) as store:
        apps = common.apps_in(store, name)
        found: list[tuple[str, records.RunInfo]] = []
        for app in apps:
            listed = common.client(store, app).runs(
                state=state, workflow=workflow, limit=limit, dry_run=dry_run
            )
            found += [(app, info) for info in listed]
        # An app named but empty: say which apps the store does have.
        known = store.apps() if name and not found else apps
    # Each app's list is newest first; merged, the newest ``limit`` of them all.
    found.sort(key=lambda pair: (pair[1].created_at, pair[1].run_id), reverse=True)
    found = found[:limit]
    if as_json:
        output.emit_json([output.run_doc(info, app) for app, info in found])
        return
    if not found:
        where = f"app {name}" if name else "the store"
        others = f" (apps in the store: {', '.join(known)})" if name and known else ""
        click.echo(f"no runs in {where}" + (f" in state {state}" if state else "") + others)
        return
    lines = output.table(
        ["RUN", "APP", "WORKFLOW", "VERSION", "STATE", "CLAIMS", "UPDATED"],
        [
            [
                i.run_id,
                app,
                i.workflow,
                i.version,
                f"{i.state} (dry)" if i.dry_run else i.state,
                str(i.attempt),
                output.when(i.updated_at),
            ]
            for app, i in found
        ],
    )
    click.echo(lines[0])
    for (_, info), line in zip(found, lines[1:], strict=True):
        click.echo(line)
        if info.error and info.state in ("failed", "needs_attention"):
            click.echo(f"    {output.why(info.error)}")


@click.command()
@click.argument("run_id")
@click.option("--history", is_flag=True, help="Also print the run's provenance ledger.")
@click.option(
    "--journal",
    is_flag=True,
    help="Also print the run's journal: each position with its attempts, duration, "
    "output (truncated) and error.",
)
@common.options
def show(run_id: str, history: bool, journal: bool, store_url: str | None, as_json: bool) -> None:
    """Print a run (with --history, its provenance ledger; with --journal, its journal).

    A plan run's tasks follow its fields, as ``perdure tasks`` lists them
    (with --json, under "tasks"; a workflow run's document has no "tasks").
    "claims" counts how many times a worker took the run (a first claim, and
    one more after every wait, sleep, release or recovery); "failures" counts
    the consecutive attempts that failed (a crash, a lost lease, a store
    fault), which reset when a step is recorded.
    """
    with common.opened(store_url, create=False) as store:
        client = common.client_for_run(store, run_id)
        info = client.get(run_id)
        # A run that continued as new is shown by its chain's current run.
        run_id = info.run_id
        children = client.children(run_id)
        ledger = client.history(run_id) if history or journal else None
        entries = journals.rows(store.journal(run_id), ledger or []) if journal else None
        attempts = client.attempts(run_id)
        # A plan declares at least one task: an empty list is a workflow run.
        planned = client.tasks(run_id)
    if as_json:
        doc = output.run_doc(info, client.app)
        doc["claims"] = info.attempt
        doc["children"] = children
        doc["failed_attempts"] = attempts
        if planned:
            doc["tasks"] = [tasks.doc(t) for t in planned]
        if history and ledger is not None:
            doc["history"] = ledger
        if entries is not None:
            doc["journal"] = entries
        output.emit_json(doc)
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
        ("claims", f"{info.attempt} (times a worker took the run)"),
        ("failures", f"{info.failures} (consecutive failed attempts)"),
        ("created", output.when(info.created_at)),
        ("updated", output.when(info.updated_at)),
        ("key", info.key or "-"),
        ("parent", info.parent_id or "-"),
    ]
    if info.chain:
        rows.append(("chain", " -> ".join(info.chain)))
    if planned:
        rows.append(("tasks", tasks.summary(planned)))
    if info.dry_run:
        rows.append(("dry run", "yes (once and idempotent steps are described, not performed)"))
    if children:
        rows.append(("children", ", ".join(f"{n} {s}" for s, n in sorted(children.items()))))
    if info.state == "succeeded":
        rows.append(("result", output.compact(info.result)))
    if info.error:
        rows.append(("error", output.why(info.error)))
    width = max(len(k) for k, _ in rows)
    for name, value in rows:
        click.echo(f"{name.ljust(width)}  {value}")
    if planned:
        click.echo("")
        output.echo_lines(tasks.table(planned))
    output.echo_attempts(attempts)
    if entries is not None:
        click.echo("")
        output.echo_lines(journals.table(entries) if entries else ["the journal is empty"])
    if history and ledger is not None:
        click.echo("")
        output.echo_lines(
            output.table(
                ["SEQ", "AT", "KIND", "GEN", "WORKER", "STEP", "DIGEST", "NOTE"],
                [
                    [
                        str(p.sequence),
                        output.when(p.at),
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
