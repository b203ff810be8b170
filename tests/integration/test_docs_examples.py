"""The tutorial's programs (docs/examples/) run as its pages say, with its commands, on SQLite.

Each test copies a program into a fresh directory, serves it with a real
``perdure worker`` process and drives it with the ``perdure`` commands the
page shows (``PERDURE_STORE`` names the tutorial's store, as the first page
tells the reader to set it). The timeout path of the signals page runs in a
``perdure.testing.Environment``, where three days pass at once.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import perdure
from perdure.testing import Environment

DOCS = Path(__file__).resolve().parents[2] / "docs"
EXAMPLES = DOCS / "examples"
STORE = "sqlite:///tutorial.db"
LIMIT = 30.0


class Tutorial:
    """A directory holding the tutorial's programs, its store and its worker processes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.env = {**os.environ, "PERDURE_STORE": STORE}
        self.env.pop("PERDURE_APP", None)
        self.procs: list[subprocess.Popen[bytes]] = []

    def copy(self, name: str) -> None:
        shutil.copy(EXAMPLES / name, self.path / name)

    def perdure(self, *args: str, status: int = 0) -> str:
        """Run one ``perdure`` command here; check its exit status; return its stdout."""
        done = subprocess.run(
            [sys.executable, "-m", "perdure", *args],
            cwd=self.path,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=LIMIT * 2,
        )
        assert done.returncode == status, (args, done.stdout, done.stderr)
        return done.stdout

    def json(self, *args: str, status: int = 0) -> Any:
        return json.loads(self.perdure(*args, "--json", status=status))

    def python(self, code: str) -> str:
        done = subprocess.run(
            [sys.executable, "-c", code],
            cwd=self.path,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=LIMIT * 2,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    def worker(self, target: str, *options: str) -> subprocess.Popen[bytes]:
        log = open(self.path / f"worker-{len(self.procs)}.log", "wb")  # noqa: SIM115 - closed below
        proc = subprocess.Popen(
            [sys.executable, "-m", "perdure", "worker", target, *options],
            cwd=self.path,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        self.procs.append(proc)
        return proc

    def logs(self) -> str:
        return "\n".join(p.read_text() for p in sorted(self.path.glob("worker-*.log")))

    def stop(self, proc: subprocess.Popen[bytes]) -> int:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        return proc.wait(timeout=LIMIT * 2)


@pytest.fixture
def tutorial(tmp_path: Path) -> Iterator[Tutorial]:
    place = Tutorial(tmp_path)
    try:
        yield place
    finally:
        for proc in place.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=LIMIT)


def wait_for(check: Callable[[], Any], what: str) -> Any:
    deadline = time.monotonic() + LIMIT
    while not (value := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {LIMIT}s waiting for {what}")
        time.sleep(0.02)
    return value


def lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines() if path.exists() else []


def load(name: str) -> ModuleType:
    """Import docs/examples/NAME.py under a name of its own."""
    spec = importlib.util.spec_from_file_location(f"docs_example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# -- the pages show the programs as they are --------------------------------------

PROGRAM = re.compile(r"```python\n# (\w+\.py)\n(.*?)```", re.S)


@pytest.mark.parametrize(
    ("page", "program"),
    [
        ("first-workflow.md", "hello.py"),
        ("crash-and-recover.md", "crash.py"),
        ("signals.md", "approval.py"),
        ("children.md", "album.py"),
        ("effects.md", "payments.py"),
    ],
)
def test_a_tutorial_page_shows_its_program_as_it_is(page: str, program: str) -> None:
    shown = dict(PROGRAM.findall((DOCS / "tutorial" / page).read_text(encoding="utf-8")))
    assert shown == {program: (EXAMPLES / program).read_text(encoding="utf-8")}


# -- 1. A first workflow ------------------------------------------------------


def test_first_workflow(tutorial: Tutorial) -> None:
    tutorial.copy("hello.py")
    worker = tutorial.worker("hello:app")

    out = tutorial.perdure("start", "hello:app", "greet", "--args", '["ada"]', "--wait")
    assert 'succeeded: "Hello, Ada!"' in out

    [run] = tutorial.json("runs", "--app", "hello")
    assert (run["workflow"], run["state"], run["result"]) == ("greet", "succeeded", "Hello, Ada!")
    shown = tutorial.json("show", run["run_id"], "--journal")
    assert [(e["name"], e["status"]) for e in shown["journal"]] == [
        ("fetch_user", "ok"),
        ("compose", "ok"),
    ]

    first = tutorial.json("start", "hello:app", "greet", "--args", '["grace"]', "--key", "grace")
    again = tutorial.json("start", "hello:app", "greet", "--args", '["grace"]', "--key", "grace")
    assert first["run_id"] == again["run_id"]

    printed = tutorial.python(
        "from hello import app, greet\n"
        "\n"
        'handle = app.start(greet, "linus")\n'
        "print(handle.result(timeout=30))  # Hello, Linus! (once the worker has run it)\n"
    )
    assert printed == "Hello, Linus!\n"
    assert tutorial.stop(worker) == 0, tutorial.logs()


# -- 2. Crash and recover -----------------------------------------------------


@pytest.mark.slow
def test_crash_and_recover(tutorial: Tutorial) -> None:
    tutorial.copy("crash.py")
    timing = ("--lease-ttl", "3", "--heartbeat", "1")
    first = tutorial.worker("crash:app", *timing)
    # Three seconds of work: the test kills the worker as soon as the step starts.
    started = tutorial.json("start", "crash:app", "nightly", "--args", '["b-1", 3]', "--key", "b-1")
    log = tutorial.path / "steps.log"
    wait_for(lambda: "process b-1 started" in lines(log), "the process step to start")
    first.kill()
    assert first.wait(timeout=LIMIT) == -signal.SIGKILL
    assert lines(log) == ["download b-1", "process b-1 started"]
    assert tutorial.json("show", started["run_id"])["state"] == "running"

    second = tutorial.worker("crash:app", *timing)
    out = tutorial.perdure(
        "start", "crash:app", "nightly", "--args", '["b-1", 3]', "--key", "b-1", "--wait"
    )
    assert 'succeeded: "b-1: 6 records"' in out, tutorial.logs()
    assert lines(log) == [
        "download b-1",
        "process b-1 started",
        "process b-1 started",
        "process b-1 done",
        "publish b-1",
    ]
    shown = tutorial.json("show", started["run_id"], "--journal")
    assert shown["claims"] == 2
    assert [e["name"] for e in shown["journal"]] == ["download", "process", "publish"]
    assert tutorial.stop(second) == 0, tutorial.logs()


# -- 3. Signals -----------------------------------------------------------------


def test_signals(tutorial: Tutorial) -> None:
    tutorial.copy("approval.py")
    worker = tutorial.worker("approval:app")
    run = tutorial.json("start", "approval:app", "review", "--args", '["q3-report"]', "--key", "q3")
    run_id = run["run_id"]
    wait_for(
        lambda: tutorial.json("waits", "--app", "approval"),
        "the run to wait for its decision",
    )
    [wait] = tutorial.json("waits", "--app", "approval")
    assert wait["wait_id"] == f"{run_id}/decision"

    approve = ("signal", run_id, "decision", "--payload", '{"approved": true, "by": "grace"}')
    receipt = tutorial.json(*approve, "--signal-id", "mail-1")
    assert tutorial.json(*approve, "--signal-id", "mail-1") == receipt  # a retry: same receipt
    assert receipt["outcome"] == "signaled"
    tutorial.perdure(
        "signal",
        run_id,
        "decision",
        "--payload",
        '{"approved": false, "by": "bob"}',
        "--signal-id",
        "mail-2",
        status=1,  # wait_settled: the first decision stands
    )

    out = tutorial.perdure(
        "start", "approval:app", "review", "--args", '["q3-report"]', "--key", "q3", "--wait"
    )
    assert '"status": "published"' in out and "approved-by=grace" in out
    assert tutorial.json(*approve, "--signal-id", "mail-1") == receipt  # after the end too
    shown = tutorial.json("show", run_id, "--journal")
    publishes = [e for e in shown["journal"] if e["name"].startswith("publish")]
    assert [(e["name"], e["attempts"]) for e in publishes] == [("publish", 1)]
    assert tutorial.stop(worker) == 0, tutorial.logs()


def test_signals_deadline() -> None:
    approval = load("approval")
    app, review = approval.app, approval.review
    # As the page shows it:
    with Environment(app) as env:
        handle = env.start(review, "draft")
        env.advance(timedelta(days=3))  # wakes the wait at its deadline, at once
        assert handle.result(timeout=0) == {"doc": "draft", "status": "expired"}
        with pytest.raises(perdure.WaitSettled) as late:
            env.app.signal(handle.run_id, "decision", {"approved": True, "by": "late"})
        assert late.value.receipt.outcome == "timed_out"


# -- 4. Child runs ------------------------------------------------------------------


def test_children(tutorial: Tutorial) -> None:
    tutorial.copy("album.py")
    worker = tutorial.worker("album:app")
    out = tutorial.perdure(
        "start", "album:app", "album", "--args", '["summer", ["a.png", "b.png"]]', "--wait"
    )
    assert 'succeeded: "https://photos.example/summer (4 files)"' in out
    runs = tutorial.json("runs", "--app", "album")
    assert sorted(r["workflow"] for r in runs) == [
        "album",
        "publish_album",
        "thumbnails",
        "thumbnails",
    ]
    assert {r["state"] for r in runs} == {"succeeded"}

    out = tutorial.perdure(
        "start", "album:app", "album", "--args", '["winter", ["a.png", "c.jpg"]]', "--wait"
    )
    assert "not published: ValueError: c.jpg is not a PNG file" in out
    failed = tutorial.json("runs", "--app", "album", "--state", "failed")
    assert [(r["workflow"], r["error"]["code"]) for r in failed] == [
        ("thumbnails", "workflow_failed")
    ]
    assert tutorial.stop(worker) == 0, tutorial.logs()


# -- 5. Effects and resolve -------------------------------------------------------------


def test_effects_and_resolve(tutorial: Tutorial) -> None:
    tutorial.copy("payments.py")
    worker = tutorial.worker("payments:app")

    def checkout(order: str, *more: str, status: int = 0) -> Any:
        args = ("start", "payments:app", "checkout", "--args", json.dumps([order, 2]), *more)
        return tutorial.perdure(*args, "--key", order, status=status)

    assert '"status": "paid"' in checkout("o-1", "--wait")
    assert '"status": "declined", "reason": "card declined"' in checkout("declined-1", "--wait")
    checkout("slow-1", "--wait", status=1)
    checkout("slow-2", "--wait", status=1)

    stuck = tutorial.json("runs", "--app", "payments", "--state", "needs_attention")
    assert {(r["error"]["code"], r["error"]["step"]) for r in stuck} == {
        ("effect_outcome_unknown", "charge")
    }
    slow1, slow2 = (
        json.loads(checkout(order, "--json"))["run_id"] for order in ("slow-1", "slow-2")
    )
    assert {slow1, slow2} == {r["run_id"] for r in stuck}

    tutorial.perdure(
        "resolve",
        slow1,
        "charge",
        "--output",
        '"ch_slow-1"',
        "--note",
        "seen in the provider's dashboard",
    )
    tutorial.perdure("resolve", slow2, "charge", "--error", "not charged, per the provider")
    app = perdure.App(f"sqlite:///{tutorial.path / 'tutorial.db'}", name="payments")
    try:
        assert app.handle(slow1).result(timeout=LIMIT) == {
            "order": "slow-1",
            "status": "paid",
            "receipt": "receipt for slow-1: ch_slow-1",
        }
        with pytest.raises(perdure.RunFailed) as failed:
            app.handle(slow2).result(timeout=LIMIT)
        assert failed.value.state == "failed"
    finally:
        app.close()

    # One request per run reached the provider: nothing was charged twice.
    charged = [line.split()[0] for line in lines(tutorial.path / "gateway.log")]
    assert len(charged) == len(set(charged)) == 4
    assert tutorial.stop(worker) == 0, tutorial.logs()
