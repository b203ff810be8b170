"""Tutorial, part 2: a workflow whose worker is killed in the middle of a step."""

from __future__ import annotations

import time
from pathlib import Path

import perdure

app = perdure.App("sqlite:///tutorial.db", name="crash")
LOG = Path("steps.log")


def note(line: str) -> None:
    """Append a line to steps.log, so that every execution of a step shows."""
    with LOG.open("a", encoding="utf-8") as log:
        log.write(line + "\n")


@app.step()
def download(batch: str) -> int:
    note(f"download {batch}")
    return 3


@app.step()
def process(batch: str, count: int, seconds: float) -> int:
    note(f"process {batch} started")
    time.sleep(seconds)  # slow work: time enough to kill the worker
    note(f"process {batch} done")
    return count * 2


@app.step()
def publish(batch: str, total: int) -> str:
    note(f"publish {batch}")
    return f"{batch}: {total} records"


@app.workflow(version="1")
def nightly(ctx: perdure.Context, batch: str, seconds: float = 20) -> str:
    count = download(batch)
    total = process(batch, count, seconds)
    return publish(batch, total)
