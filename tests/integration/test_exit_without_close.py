"""A script that starts a run and never calls ``close()`` exits, on both stores.

The README's examples end without ``app.close()``. On PostgreSQL the store's
connection pool used to be left to its finalizer during the interpreter's
teardown, when the pool's daemon threads may already be frozen; one frozen
while holding a lock of the pool made the finalizer wait forever (seen about
once in 240 such processes). The store now closes its pools from an exit hook,
before teardown: one test checks that directly, the other runs rounds of
scripts in processes of their own, where a hang shows as a process that
outlives its time bound.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

ROUND_LIMIT = 180.0  # seconds for a whole round: 20 interpreters start on a loaded host
EXIT_LIMIT = 20.0  # seconds from a script's last line to its process ending

SCRIPT = textwrap.dedent(
    """
    import sys

    import perdure

    app = perdure.App(sys.argv[1], name="exits")


    @app.workflow()
    def noop(ctx: perdure.Context, n: int) -> int:
        return n


    handle = app.start(noop, int(sys.argv[2]))
    print(handle.run_id, flush=True)
    """
)


def _round(script: Path, url: str, size: int) -> list[tuple[int, float, str]]:
    """Start ``size`` scripts at once; return (exit code, seconds from output to exit, stderr)."""
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), url, str(i)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(size)
    ]
    found: list[tuple[int, float, str]] = [(-1, 0.0, "")] * size
    deadline = time.monotonic() + ROUND_LIMIT

    def watch(i: int, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        proc.stdout.readline()
        printed = time.monotonic()
        try:
            _, err = proc.communicate(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
            found[i] = (-9, time.monotonic() - printed, f"did not exit: {err}")
            return
        found[i] = (proc.returncode, time.monotonic() - printed, err)

    watchers = [threading.Thread(target=watch, args=(i, p)) for i, p in enumerate(procs)]
    for watcher in watchers:
        watcher.start()
    for watcher in watchers:
        watcher.join()
    return found


@pytest.mark.slow
def test_scripts_that_never_close_their_app_exit(store_url: str, tmp_path: Path) -> None:
    script = tmp_path / "start_and_exit.py"
    script.write_text(SCRIPT, encoding="utf-8")
    # Create the schema once, so that the rounds measure starts and exits.
    migrate = [sys.executable, "-m", "perdure", "migrate", "--store", store_url]
    done = subprocess.run(migrate, capture_output=True, text=True, timeout=ROUND_LIMIT)
    assert done.returncode == 0, done.stderr
    rounds, size = (3, 20) if store_url.startswith("postgres") else (1, 20)
    for number in range(rounds):
        results = _round(script, store_url, size)
        stuck = [r for r in results if r[0] != 0 or r[1] > EXIT_LIMIT]
        assert stuck == [], f"round {number}: {stuck}"


AFTER_EXIT_HOOKS = textwrap.dedent(
    """
    import atexit
    import sys


    def after_perdure() -> None:
        # Registered before perdure is imported, so it runs after perdure's own
        # exit hook and before the interpreter tears anything down.
        try:
            app.runs()
        except perdure.StoreError as exc:
            print(f"closed: {exc}", flush=True)
        else:
            print("still open", flush=True)


    atexit.register(after_perdure)

    import perdure

    app = perdure.App(sys.argv[1], name="exits")


    @app.workflow()
    def noop(ctx: perdure.Context, n: int) -> int:
        return n


    app.start(noop, 1)
    """
)


def test_a_store_left_open_is_closed_before_teardown(postgres_url: str, tmp_path: Path) -> None:
    script = tmp_path / "after_exit_hooks.py"
    script.write_text(AFTER_EXIT_HOOKS, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(script), postgres_url],
        capture_output=True,
        text=True,
        timeout=ROUND_LIMIT,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("closed: "), (done.stdout, done.stderr)
    assert "is closed" in done.stdout
