"""``perdure tasks``: the tasks of a plan run, from the store alone.

The task table printed here is also the one ``perdure show`` prints after a
plan run's fields, so the two always agree.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence
from typing import Any

import click

from perdure import records
from perdure.cli import common, output

HEADERS = (
    "TASK",
    "STATE",
    "ATTEMPT",
    "EFFECT",
    "WORKER",
    "STARTED",
    "ENDED",
    "BLOCKED_BY",
    "ERROR",
)


def doc(info: records.TaskInfo) -> dict[str, Any]:
    """Return a task as the JSON object ``--json`` prints (every TaskInfo field)."""
    return dataclasses.asdict(info)


def _code(info: records.TaskInfo) -> str:
    # A task that succeeded after a failed attempt keeps that attempt's error:
    # it is history, not the task's state, so the table leaves it out.
    if not info.error or info.state == "succeeded":
        return "-"
    return str(info.error.get("code") or "?")


def table(tasks: Sequence[records.TaskInfo]) -> list[str]:
    """Return the task table's lines: one row per task, and each error's message under it."""
    rows = [
        [
            t.name,
            t.state,
            str(t.attempt),
            t.effect,
            t.worker or "-",
            output.when(t.started_at),
            output.when(t.ended_at),
            t.blocked_by or "-",
            _code(t),
        ]
        for t in tasks
    ]
    lines = output.table(HEADERS, rows)
    found = [lines[0]]
    for info, line in zip(tasks, lines[1:], strict=True):
        found.append(line)
        if _code(info) != "-" and info.error is not None:
            kind = f" ({info.error['type']})" if info.error.get("type") else ""
            message = " ".join(str(info.error.get("message", "")).split())
            found.append(f"    {_code(info)}{kind}: {message}")
    return found


def summary(tasks: Sequence[records.TaskInfo]) -> str:
    """Return ``6 (3 succeeded, 1 failed, 2 blocked)``: how many tasks are in each state."""
    counts = Counter(t.state for t in tasks)
    return f"{len(tasks)} (" + ", ".join(f"{n} {s}" for s, n in counts.items()) + ")"


@click.command()
@click.argument("run_id")
@common.options
def tasks(run_id: str, store_url: str | None, as_json: bool) -> None:
    """List the tasks of a plan run, in declaration order.

    ATTEMPT counts the attempts started; WORKER is the worker that last
    claimed the task (host and pid); BLOCKED_BY names the failed (or
    needs_attention) ancestor that holds a blocked task; ERROR is the code of
    a task that did not succeed, its message on the line below. With --json,
    a list of TaskInfo objects (instants in ISO 8601). A workflow run has no
    tasks: the list is empty.
    """
    with common.opened(store_url, create=False) as store:
        client = common.client_for_run(store, run_id)
        found = client.tasks(run_id)
        info = client.get(run_id)
    if as_json:
        output.emit_json([doc(t) for t in found])
        return
    if not found:
        click.echo(f"run {run_id} is a run of workflow {info.workflow}, not of a plan: no tasks")
        return
    output.echo_lines(table(found))
