"""A process that served runs with ``with app.worker():`` exits quietly."""

from __future__ import annotations

import subprocess
import sys
import textwrap
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
