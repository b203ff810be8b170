"""The app whose plans the plan crash and fleet tests serve from worker processes.

Every task body appends one line to the file ``PLAN_LOG`` (fsynced), so the
tests judge what ran, where and when from the tasks' own record, not from
the engine's counters:

* ``fleet``: twelve independent tasks ``t01``..``t12``; each sleeps
  ``FLEET_SLEEP`` seconds and records ``<task> <pid> <start> <end>`` (wall
  clock, so that lines of different processes compare).
* ``recover``: ``hang`` records ``hang <pid>``; its first execution across the
  fleet (the marker file ``<PLAN_LOG>.hang``) creates ``PLAN_ENTERED`` and
  blocks, so that the test kills its worker mid-task; later ones return.
  ``then`` runs after it.
* ``charge``: ``charge`` is a ``once`` task that records ``charge <pid>``,
  creates ``PLAN_ENTERED`` and blocks; ``receipt`` runs after it.
* ``poison`` (``max_recoveries=1``): ``poison`` records ``poison <pid>`` and
  kills its own worker with SIGKILL, every time.

Configuration comes from the environment, read when used: ``PERDURE_STORE``,
``PLAN_LOG``, ``PLAN_ENTERED``, ``PLAN_CONCURRENCY``, ``FLEET_SLEEP``, and
the worker timing ``CRASH_LEASE_TTL`` and ``CRASH_HEARTBEAT`` (as set by the
crash tests' ``Workers``).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from collections.abc import Callable

import perdure

FLEET = tuple(f"t{i:02d}" for i in range(1, 13))
_HOLD = 60.0  # a blocked task outlives any test; its worker is killed first


def record(line: str) -> None:
    """Append one line to ``PLAN_LOG``, durably."""
    fd = os.open(os.environ["PLAN_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{line}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def _first(marker: str) -> bool:
    """True for the one caller across processes that creates ``marker``."""
    try:
        os.close(os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    except FileExistsError:
        return False
    return True


def _entered() -> None:
    with open(os.environ["PLAN_ENTERED"], "w") as marker:
        marker.write(str(os.getpid()))


def declare(app: perdure.App) -> dict[str, perdure.Plan]:
    """Declare the four plans on ``app``; return them by name (the tests start them so)."""
    fleet = app.plan("fleet", version="1")
    for name in FLEET:
        fleet.task(_sleeper(name))

    recover = app.plan("recover", version="1")

    @recover.task()
    def hang(n: int) -> int:
        # The first execution across the fleet blocks until its worker is killed.
        record(f"hang {os.getpid()}")
        if _first(os.environ["PLAN_LOG"] + ".hang"):
            _entered()
            time.sleep(_HOLD)
        return n * 2

    @recover.task(after=[hang])
    def then(hang: int) -> int:
        record(f"then {os.getpid()}")
        return hang + 1

    charges = app.plan("charge", version="1")

    @charges.task(effect="once")
    def charge(amount: int) -> str:
        record(f"charge {os.getpid()}")
        _entered()
        time.sleep(_HOLD)
        return f"charged {amount}"

    @charges.task(after=[charge])
    def receipt(charge: str) -> str:
        record(f"receipt {os.getpid()}")
        return charge

    poisoned = app.plan("poison", version="1", max_recoveries=1)

    @poisoned.task()
    def poison() -> None:
        record(f"poison {os.getpid()}")
        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(_HOLD)  # never reached: SIGKILL is not deliverable late

    return {p.name: p for p in (fleet, recover, charges, poisoned)}


def _sleeper(name: str) -> Callable[[], str]:
    def body() -> str:
        start = time.time()
        time.sleep(float(os.environ.get("FLEET_SLEEP", "0.5")))
        end = time.time()
        record(f"{name} {os.getpid()} {start:.6f} {end:.6f}")
        return name

    body.__name__ = body.__qualname__ = name
    body.__annotations__ = {"return": str}
    return body


def serve() -> None:
    """Run one worker of the app ``plans`` until SIGTERM, logging to stderr; say when it serves."""
    app = perdure.App(name="plans")
    declare(app)
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(process)d %(threadName)s %(name)s %(levelname)s %(message)s",
    )
    worker = app.worker(
        concurrency=int(os.environ.get("PLAN_CONCURRENCY", "1")),
        lease_ttl=float(os.environ.get("CRASH_LEASE_TTL", "1.5")),
        heartbeat=float(os.environ.get("CRASH_HEARTBEAT", "0.3")),
        poll_interval=0.1,
        grace=1.0,
    )
    worker.start()
    print(f"worker {worker.worker_id} serving", file=sys.stderr, flush=True)
    worker.run()
