"""The app of the queue fleet tests; ``python queue_app.py`` serves it until SIGTERM.

Each run's one step appends ``<run name> <queue key> <start> <end>`` (wall
clock seconds) to a file of its process under ``$QUEUE_SIDE``, so the tests
judge the limits from what the steps did, not from the engine's counters.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta
from pathlib import Path

import perdure

app = perdure.App(os.environ.get("PERDURE_STORE"), name="queued")
app.queue("pair", concurrency=2, per_key=1)
app.queue("paced", rate=perdure.Rate(10, per=timedelta(seconds=1)))


@app.step()
def hold(name: str, key: str, seconds: float) -> None:
    started = time.time()
    time.sleep(seconds)
    ended = time.time()
    side = Path(os.environ["QUEUE_SIDE"]) / f"{os.getpid()}.log"
    with side.open("a", encoding="utf-8") as out:
        out.write(f"{name} {key} {started:.6f} {ended:.6f}\n")


@app.workflow()
def job(ctx: perdure.Context, name: str, key: str, seconds: float) -> None:
    hold(name, key, seconds)


if __name__ == "__main__":
    import logging

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    app.worker(concurrency=4, poll_interval=0.05, liveness="thread").run()
