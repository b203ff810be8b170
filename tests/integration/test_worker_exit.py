"""A process that served runs with ``with app.worker():`` exits quietly."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

SCRIPT = textwrap.dedent(
    """
    import sys

    import perdure

    app = perdure.App(sys.argv[1], name="quiet")


    @app.workflow()
    async def greet(ctx: perdure.Context, who: str) -> str:
        return f"hello {who}"


    with app.worker(lease_ttl=3, heartbeat=1):
        print(app.start(greet, "exit").result(timeout=60))
    """
)


def test_the_worker_loop_is_closed_before_the_interpreter_exits(
    store_url: str, tmp_path: Path
) -> None:
    script = tmp_path / "quiet.py"
    script.write_text(SCRIPT)
    # -X dev shows the ResourceWarning of a loop left open, which is what
    # turns into "BaseEventLoop.__del__ ... Invalid file descriptor" at exit.
    done = subprocess.run(
        [sys.executable, "-X", "dev", str(script), store_url],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "hello exit"
    for complaint in ("unclosed event loop", "BaseEventLoop.__del__", "Invalid file descriptor"):
        assert complaint not in done.stderr, done.stderr


def test_sigusr1_prints_every_threads_stack_and_the_worker_serves_on(tmp_path: Path) -> None:
    (tmp_path / "stacks_app.py").write_text("import perdure\napp = perdure.App(name='stacks')\n")
    log = tmp_path / "worker.log"
    url = f"sqlite:///{tmp_path / 's.db'}"
    command = [sys.executable, "-m", "perdure", "worker", "stacks_app:app", "--store", url]
    with open(log, "wb") as out:
        proc = subprocess.Popen(command, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_for_text(log, "INFO perdure.worker: worker ")
        proc.send_signal(signal.SIGUSR1)
        _wait_for_text(log, "most recent call first")
        assert proc.poll() is None  # it serves on
        assert "perdure-claim" in log.read_text() or "_claim_loop" in log.read_text()
        proc.terminate()
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def _wait_for_text(path: Path, text: str, limit: float = 30.0) -> None:
    deadline = time.monotonic() + limit
    while text not in path.read_text(errors="replace"):
        assert time.monotonic() < deadline, path.read_text(errors="replace")
        time.sleep(0.05)
