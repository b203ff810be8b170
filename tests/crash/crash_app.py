"""The app the crash tests run in real worker processes.

Configuration comes from the environment, read when used (so that importing
this module touches nothing):

* ``PERDURE_STORE``: the store URL (``App()`` reads it).
* ``CRASH_EFFECTS_LOG``: a file every step appends ``<step name>\\n`` to.
* ``PERDURE_CRASH_AT=<step>:<before|after>``: the failpoint. The process dies
  right before the step's body runs, or right after the body returned (its
  effect is in the log, its outcome not yet recorded).
* ``PERDURE_CRASH_MODE``: ``exit`` (``os._exit(137)``) or ``kill`` (SIGKILL to itself).
* ``ZOMBIE_ENTERED`` / ``ZOMBIE_RELEASE``: marker files of the ``blocker`` step:
  it creates the first, then blocks until the second exists.
* ``CRASH_LEASE_TTL``, ``CRASH_HEARTBEAT``, ``CRASH_POLL``: worker timing for ``serve()``.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

import perdure

app = perdure.App(name="crash")

FIVE = ("s1", "s2", "s3", "s4", "s5")


def failpoint(step: str, when: str) -> None:
    """Die here if ``PERDURE_CRASH_AT`` names this point."""
    if os.environ.get("PERDURE_CRASH_AT") != f"{step}:{when}":
        return
    if os.environ.get("PERDURE_CRASH_MODE", "exit") == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)  # never reached: SIGKILL is not deliverable late
    os._exit(137)


def effect(step: str) -> None:
    """Append the step's name to the effects log, durably."""
    fd = os.open(os.environ["CRASH_EFFECTS_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{step}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def _logged_step(name: str, effect_class: str) -> Callable[..., str]:
    def body(n: int) -> str:
        failpoint(name, "before")
        effect(name)
        failpoint(name, "after")
        return f"{name}:{n}"

    body.__name__ = body.__qualname__ = name
    body.__annotations__ = {"n": int, "return": str}
    decorated: Callable[..., str] = app.step(name=name, effect=effect_class)(body)  # type: ignore[call-overload]
    return decorated


s1, s2, s3, s4, s5 = (_logged_step(name, "idempotent") for name in FIVE)
prepare = _logged_step("prepare", "idempotent")
charge = _logged_step("charge", "once")
confirm = _logged_step("confirm", "idempotent")


@app.workflow(version="1")
def five(ctx: perdure.Context, n: int) -> list[str]:
    """Five idempotent steps in a row."""
    return [s1(n), s2(n), s3(n), s4(n), s5(n)]


@app.workflow(version="1")
def once_flow(ctx: perdure.Context, n: int) -> list[str]:
    """An idempotent step, a once step, an idempotent step."""
    return [prepare(n), charge(n), confirm(n)]


def _effects_so_far(step: str) -> int:
    try:
        with open(os.environ["CRASH_EFFECTS_LOG"]) as log:
            return log.read().split().count(step)
    except FileNotFoundError:
        return 0


# park_after above the delay: the pause is spent inside the execution.
@app.step(
    effect="once",
    retry=perdure.Retry(max_attempts=3, initial_delay=30, jitter=False, park_after=60),
)
def refusing_charge(n: int) -> str:
    """Refuse (certainly without effect) the first time, across processes; then charge."""
    earlier = _effects_so_far("refusing_charge")
    effect("refusing_charge")
    if earlier == 0:
        raise perdure.EffectFailed("the gateway refused before charging")
    return f"refusing_charge:{n}"


@app.workflow(version="1")
def refused_once(ctx: perdure.Context, n: int) -> list[str]:
    """A once step whose first attempt is refused (a long retry delay follows), then confirm."""
    return [refusing_charge(n), confirm(n)]


@app.step(
    effect="once",
    retry=perdure.Retry(max_attempts=3, initial_delay=2, jitter=False, park_after=0.5),
)
def parking_charge(n: int) -> str:
    """Refuse the first time, across processes; the 2 s backoff parks the run."""
    earlier = _effects_so_far("parking_charge")
    effect("parking_charge")
    if earlier == 0:
        raise perdure.EffectFailed("the gateway refused before charging")
    return f"parking_charge:{n}"


@app.workflow(version="1")
def parked_retry(ctx: perdure.Context, n: int) -> list[str]:
    """A once step whose refused first attempt parks the run for its backoff, then confirm."""
    return [parking_charge(n), confirm(n)]


@app.step(effect="once")
def blocker(n: int) -> str:
    """Say "I am inside" with a marker file, then block until released."""
    # Written beside and renamed into place: the test sees the file whole or not at all.
    entered = os.environ["ZOMBIE_ENTERED"]
    with open(entered + ".part", "w") as marker:
        marker.write(str(os.getpid()))
    os.replace(entered + ".part", entered)
    release = os.environ["ZOMBIE_RELEASE"]
    deadline = time.monotonic() + 60
    while not os.path.exists(release):
        if time.monotonic() > deadline:
            raise TimeoutError("the test never released the blocker")
        time.sleep(0.01)
    effect("blocker")
    return f"blocker:{n}"


@app.step()
def after_blocker(n: int) -> str:
    effect("after_blocker")
    return f"after_blocker:{n}"


@app.workflow(version="1")
def zombie_flow(ctx: perdure.Context, n: int) -> list[str]:
    """An idempotent step, a once step that blocks, an idempotent step."""
    return [s1(n), blocker(n), after_blocker(n)]


def serve(**overrides: Any) -> None:
    """Run a worker until SIGTERM, logging to stderr (timing from the environment)."""
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(process)d %(threadName)s %(name)s %(levelname)s %(message)s",
    )
    options: dict[str, Any] = {
        "concurrency": 1,
        "lease_ttl": float(os.environ.get("CRASH_LEASE_TTL", "1")),
        "heartbeat": float(os.environ.get("CRASH_HEARTBEAT", "0.3")),
        "poll_interval": float(os.environ.get("CRASH_POLL", "0.1")),
        **overrides,
    }
    worker = app.worker(**options)
    print(f"worker {worker.worker_id} serving", file=sys.stderr, flush=True)
    worker.run()


def start_beside(n: int) -> None:
    """Serve the app and start ``five`` from this process: the worker takes it as it is created.

    Prints ``eager-started run <run id>``, then waits for the run (a failpoint ends the
    process first).
    """
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    with app.worker(
        concurrency=1,
        lease_ttl=float(os.environ.get("CRASH_LEASE_TTL", "1")),
        heartbeat=float(os.environ.get("CRASH_HEARTBEAT", "0.3")),
        poll_interval=60,
    ) as worker:
        deadline = time.monotonic() + 30
        while not worker.takes_starts:
            assert time.monotonic() < deadline, "the worker never took starts"
            time.sleep(0.01)
        handle = app.start(five, n)
        print(f"eager-started run {handle.run_id}", file=sys.stderr, flush=True)
        handle.result(timeout=60)
