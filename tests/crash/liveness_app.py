"""The app of the liveness tests: steps that hold the GIL, and steps the test holds.

Configuration comes from the environment, read when used:

* ``PERDURE_STORE``: the store URL (``App()`` reads it).
* ``CRASH_EFFECTS_LOG``: every step body appends ``<step> <pid>`` to it when it starts.
* ``LIVENESS_HOG_SECONDS``: how long a ``hog`` step holds the GIL (default 4).
* ``LIVENESS_GATE``: the ``gated`` steps block (without holding the GIL) until this
  file exists.
"""

from __future__ import annotations

import math
import os
import re
import time

import perdure

app = perdure.App(name="liveness")

_BACKTRACK = re.compile(r"(a+)+$")


def effect(step: str) -> None:
    """Append ``<step> <pid>`` to the effects log, durably."""
    fd = os.open(os.environ["CRASH_EFFECTS_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{step} {os.getpid()}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def hold_gil(seconds: float) -> float:
    """Hold the GIL for at least ``seconds`` in one C call (a backtracking regex).

    The regex's time doubles with every ``a``: time a short one, then pick the
    length that lasts long enough. No Python bytecode runs meanwhile, so no
    other thread of the process runs either.
    """
    n = 16
    started = time.perf_counter()
    _BACKTRACK.match("a" * n + "b")
    unit = max(time.perf_counter() - started, 1e-6)
    n += max(0, math.ceil(math.log2(seconds / unit)))
    started = time.perf_counter()
    _BACKTRACK.match("a" * n + "b")
    return time.perf_counter() - started


def _hog_seconds() -> float:
    return float(os.environ.get("LIVENESS_HOG_SECONDS", "4"))


@app.step()
def hog_idempotent(tag: str) -> float:
    effect("hog_idempotent")
    return hold_gil(_hog_seconds())


@app.step(effect="once", retry=perdure.Retry(max_attempts=1))
def hog_once(tag: str) -> float:
    effect("hog_once")
    return hold_gil(_hog_seconds())


def _gate() -> None:
    gate = os.environ["LIVENESS_GATE"]
    while not os.path.exists(gate):
        time.sleep(0.02)


@app.step()
def gated_idempotent(tag: str) -> str:
    effect("gated_idempotent")
    _gate()
    return f"done:{tag}"


@app.step(effect="once", retry=perdure.Retry(max_attempts=1))
def gated_once(tag: str) -> str:
    effect("gated_once")
    _gate()
    return f"done:{tag}"


@app.step()
def after(tag: str) -> str:
    effect("after")
    return f"after:{tag}"


@app.workflow(version="1")
def hog(ctx: perdure.Context, effect_class: str) -> list[object]:
    held = hog_once("x") if effect_class == "once" else hog_idempotent("x")
    return [held > 0, after("x")]


@app.workflow(version="1")
def gated(ctx: perdure.Context, effect_class: str) -> list[str]:
    done = gated_once("x") if effect_class == "once" else gated_idempotent("x")
    return [done, after("x")]
