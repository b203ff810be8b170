"""The app the failover test runs in real worker processes.

``PERDURE_STORE`` names the store (a multi-host URL); ``FAILOVER_EFFECTS_LOG``
is a file every step body appends ``<step> <n> <i>`` to (O_APPEND, fsynced)
before it returns, so that the test can count executions across processes.
"""

from __future__ import annotations

import logging
import os
import sys
import time

import perdure

app = perdure.App(name="failover")

TICKS = 4


def effect(line: str) -> None:
    """Append one line to the effects log, durably."""
    fd = os.open(os.environ["FAILOVER_EFFECTS_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{line}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)


@app.step()
def tick(n: int, i: int) -> str:
    time.sleep(0.02)  # a step in flight when the primary goes
    effect(f"tick {n} {i}")
    return f"tick:{n}:{i}"


@app.step(effect="once")
def charge(n: int) -> str:
    time.sleep(0.1)
    effect(f"charge {n} 0")
    return f"charge:{n}"


@app.step()
def confirm(n: int, got: str) -> str:
    effect(f"confirm {n} 0")
    return f"confirm:{n}:{got}"


@app.workflow(version="1")
def order(ctx: perdure.Context, n: int) -> list[str]:
    """Idempotent steps, a once step, a signal, an idempotent step."""
    done = [tick(n, i) for i in range(TICKS)]
    done.append(charge(n))
    got = ctx.wait("go")
    done.append(confirm(n, str(got)))
    return done


def serve() -> None:
    """Run a worker until SIGTERM, logging to stderr."""
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(process)d %(threadName)s %(name)s %(levelname)s %(message)s",
    )
    worker = app.worker(concurrency=4, lease_ttl=3.0, heartbeat=0.5, poll_interval=0.2)
    print(f"worker {worker.worker_id} serving", file=sys.stderr, flush=True)
    worker.run()
