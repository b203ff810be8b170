"""What the in-process measurements share: the ten-step app, and a profiler of every thread.

The scripts that import this (``step_cpu.py``, ``step_cpu_w3.py``,
``w1_split.py``, ``sqlite_write_lock.py``) run W1's or W3's shape inside one
process. They move this folder to the end of ``sys.path`` first: its
``profile.py`` would otherwise shadow the standard library's module of that
name, which ``cProfile`` imports.
"""

from __future__ import annotations

import cProfile
import threading
import time

import perdure


def _noop(i: int) -> int:
    return i


def ten_step_app(url: str, name: str = "bench") -> perdure.App:
    """An app with the workflow ``ten_steps(k)``: ``k`` no-op steps in a row, returning ``k``."""
    app = perdure.App(url, name=name)
    noop = app.step(name="noop")(_noop)

    @app.workflow(name="ten_steps")
    def ten_steps(ctx: perdure.Context, k: int) -> int:
        for i in range(k):
            noop(i)
        return k

    return app


def profile_threads(cpu: bool) -> list[cProfile.Profile]:
    """Profile every thread started from now on; return their profiles (filled as they run).

    With ``cpu``, each function's time is its thread's CPU time, not wall time.
    """
    profiles: list[cProfile.Profile] = []
    original = threading.Thread.run

    def run(self: threading.Thread) -> None:
        profile = cProfile.Profile(time.thread_time) if cpu else cProfile.Profile()
        profiles.append(profile)
        profile.enable()
        try:
            original(self)
        finally:
            profile.disable()

    threading.Thread.run = run  # type: ignore[method-assign]
    return profiles
