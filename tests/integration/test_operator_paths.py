"""What an operator does to runs that are not simply finished: fork, cancel, keys.

The workflows live in a user module written into the test's directory, so the
command line can import it in a process of its own (``python -m perdure``);
its exit codes are checked. A worker thread serves the runs in this process.
Steps append a line to an effects file for every execution of their body; a
``once`` step that must stay in flight waits for a gate file the test creates.
Every test runs on SQLite and PostgreSQL (``store_url``).
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import perdure

WORKER: dict[str, Any] = {"concurrency": 4, "lease_ttl": 2, "heartbeat": 0.5, "poll_interval": 0.2}
LIMIT = 30.0  # seconds: an upper bound for anything to happen, never a pause
CLI_LIMIT = 120.0  # a CLI process imports perdure and the module on a loaded host

OPS = textwrap.dedent(
    """
    import os
    import time
    from pathlib import Path

    import perdure

    app = perdure.App(os.environ["PERDURE_STORE"], name=os.environ["OPS_APP"])
    HERE = Path(os.environ["OPS_DIR"])


    def record(what: str) -> None:
        with (HERE / "effects.log").open("a", encoding="utf-8") as out:
            out.write(f"{what} {os.getpid()}\\n")


    def hold() -> None:
        deadline = time.monotonic() + 60
        while not (HERE / "gate").exists():
            if time.monotonic() > deadline:
                raise TimeoutError("the test never opened the gate")
            time.sleep(0.01)


    @app.step()
    def reserve(order: str) -> int:
        record("reserve")
        return 250


    @app.step(effect="once", retry=perdure.Retry(max_attempts=1))
    def charge_held(order: str, cents: int) -> str:
        record("charge")
        hold()
        return f"ch-{order}-{cents}"


    @app.step(effect="once", retry=perdure.Retry(max_attempts=1))
    def charge(order: str, cents: int) -> str:
        record("charge")
        raise ConnectionError("the gateway hung up")


    @app.step()
    def ship(order: str) -> str:
        record("ship")
        return f"shipped {order}"


    @app.workflow()
    def held_order(ctx: perdure.Context, order: str) -> str:
        return charge_held(order, reserve(order))


    @app.workflow()
    def ambiguous_order(ctx: perdure.Context, order: str) -> str:
        charge(order, reserve(order))
        return ship(order)


    @app.workflow()
    def forever(ctx: perdure.Context, order: str) -> object:
        return ctx.wait("never")


    @app.workflow()
    def ambiguous_child(ctx: perdure.Context, order: str) -> str:
        ctx.start_child(forever, order)
        charge(order, 250)
        return ship(order)


    @app.workflow()
    def parent_of(ctx: perdure.Context, order: str) -> str:
        return ctx.start_child(ambiguous_child, order).result()


    @app.workflow()
    def pay(ctx: perdure.Context, cents: int) -> int:
        return cents


    @app.workflow()
    def other(ctx: perdure.Context, n: int) -> int:
        return n


    @app.workflow()
    def pay_kw(ctx: perdure.Context, cents: int = 0, currency: str = "eur") -> str:
        return f"{cents} {currency}"


    @app.workflow()
    def same_child_twice(ctx: perdure.Context) -> list[str]:
        first = ctx.start_child(pay, 1, key="k")
        again = ctx.start_child(pay, 1, key="k")
        return [first.run_id, again.run_id]


    @app.workflow()
    def colliding_children(ctx: perdure.Context) -> str:
        ctx.start_child(pay, 1, key="k")
        return ctx.start_child(other, 1, key="k").run_id
    """
)


@dataclass
class Ops:
    """The user module, its directory and store, and what its steps recorded."""

    path: Path
    module: ModuleType
    url: str

    @property
    def app(self) -> perdure.App:
        app: perdure.App = self.module.app
        return app

    @property
    def target(self) -> str:
        return f"{self.module.__name__}:app"

    def effects(self) -> list[str]:
        log = self.path / "effects.log"
        if not log.exists():
            return []
        return [line.split()[0] for line in log.read_text(encoding="utf-8").splitlines()]

    def open_gate(self) -> None:
        (self.path / "gate").touch()

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        """Run ``python -m perdure ARGS --json`` in a process of its own."""
        return subprocess.run(
            [sys.executable, "-m", "perdure", *args, "--json"],
            cwd=self.path,
            env={**os.environ, "PERDURE_STORE": self.url},
            capture_output=True,
            text=True,
            timeout=CLI_LIMIT,
        )


@pytest.fixture
def ops(store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Ops]:
    name = f"ops_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(OPS, encoding="utf-8")
    monkeypatch.setenv("PERDURE_STORE", store_url)
    monkeypatch.setenv("OPS_DIR", str(tmp_path))
    monkeypatch.setenv("OPS_APP", name)
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    module = importlib.import_module(name)
    found = Ops(tmp_path, module, store_url)
    try:
        yield found
    finally:
        found.open_gate()  # never leave a step holding on a failed test
        found.app.close()
        sys.modules.pop(name, None)


def wait_for(check: Callable[[], Any], what: str, timeout: float = LIMIT) -> Any:
    """Poll ``check`` until it returns something truthy; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


def wait_state(app: perdure.App, run_id: str, *states: str) -> perdure.RunInfo:
    info: perdure.RunInfo = wait_for(
        lambda: (i := app.get(run_id)).state in states and i,
        f"run {run_id} to reach {'/'.join(states)}",
    )
    return info


def refused(done: subprocess.CompletedProcess[str], code: str) -> dict[str, Any]:
    """Assert that the CLI refused (exit 1) with ``code``; return the JSON refusal."""
    assert done.returncode == 1, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    doc: dict[str, Any] = json.loads(done.stdout)["refused"]
    assert doc["code"] == code, doc
    return doc


# -- fork ------------------------------------------------------------------------


def test_fork_of_a_running_run_never_repeats_its_in_flight_once_step(ops: Ops) -> None:
    app = ops.app
    attempts: list[tuple[str, BaseException | str]] = []

    def attempt(what: str, call: Callable[[], Any]) -> None:
        try:
            attempts.append((what, f"forked {call().run_id}"))
        except perdure.PerdureError as exc:
            attempts.append((what, exc))

    with app.worker(**WORKER):
        run_id = app.start("held_order", "o-1").run_id
        wait_for(lambda: ops.effects() == ["reserve", "charge"], "charge to be in flight")
        assert app.get(run_id).state == "running"
        try:
            attempt("default", lambda: app.fork(run_id))
            attempt(
                "in-flight step, live", lambda: app.fork(run_id, from_step="charge_held", live=True)
            )
            attempt("earlier step, not live", lambda: app.fork(run_id, from_step="reserve"))
            by_cli = ops.cli("fork", run_id)
            by_cli_live = ops.cli("fork", run_id, "--from-step", "charge_held", "--live")
        finally:
            ops.open_gate()
        assert app.get(run_id).state in ("running", "succeeded")
        wait_for(
            lambda: all(r.done for r in app.runs(workflow="held_order")),
            "every run of held_order to end",
        )

    # The effect ran once: no fork executed it again.
    assert ops.effects() == ["reserve", "charge"]
    assert [r.run_id for r in app.runs(workflow="held_order")] == [run_id]
    assert app.get(run_id).result == "ch-o-1-250"
    for what, outcome in attempts:
        assert isinstance(outcome, perdure.RunNotFinished), (what, outcome)
        assert outcome.code == "run_not_finished"
        assert outcome.state == "running"
    assert "live=True" in str(attempts[0][1])
    assert "charge" in str(attempts[1][1])
    refused(by_cli, "run_not_finished")
    refused(by_cli_live, "run_not_finished")


def test_fork_of_a_live_run_from_an_earlier_step_when_asked_explicitly(ops: Ops) -> None:
    app = ops.app
    with app.worker(**WORKER):
        run_id = app.start("held_order", "o-2").run_id
        wait_for(lambda: ops.effects() == ["reserve", "charge"], "charge to be in flight")
        try:
            done = ops.cli("fork", run_id, "--from-step", "reserve", "--live")
        finally:
            ops.open_gate()
        assert done.returncode == 0, (done.stdout, done.stderr)
        doc = json.loads(done.stdout)
        assert (doc["forked_from"], doc["reused_entries"]) == (run_id, 0)
        forked = app.handle(doc["run_id"])
        assert forked.result(timeout=LIMIT) == "ch-o-2-250"
        assert app.handle(run_id).result(timeout=LIMIT) == "ch-o-2-250"
    # Running the effect again was the operator's decision.
    assert sorted(ops.effects()) == ["charge", "charge", "reserve", "reserve"]


def test_fork_of_a_run_stopped_on_an_ambiguous_once_step(ops: Ops) -> None:
    app = ops.app
    with app.worker(**WORKER):
        run_id = app.start("ambiguous_order", "o-3").run_id
        info = wait_state(app, run_id, "needs_attention", "failed", "succeeded")
        assert info.state == "needs_attention"
        assert ops.effects() == ["reserve", "charge"]

        with pytest.raises(perdure.EffectUnsettled) as unsettled:
            app.fork(run_id)
        assert (unsettled.value.code, unsettled.value.step) == ("effect_unsettled", "charge")
        assert "resolve" in str(unsettled.value)
        doc = refused(ops.cli("fork", run_id), "effect_unsettled")
        assert "resolve" in doc["message"]
        assert [r.run_id for r in app.runs(workflow="ambiguous_order")] == [run_id]

        # Naming the step explicitly is the operator's decision to run it again.
        forked = app.fork(run_id, from_step="charge")
        assert [(e.name, e.status) for e in app.store.journal(forked.run_id)] == [("reserve", "ok")]
        wait_state(app, forked.run_id, "needs_attention", "failed", "succeeded")
    assert ops.effects() == ["reserve", "charge", "charge"]


# -- cancel ----------------------------------------------------------------------


def test_cancel_reaches_a_child_in_needs_attention_and_resolve_ends_it(ops: Ops) -> None:
    app = ops.app
    with app.worker(**WORKER):
        parent = app.start("parent_of", "o-5").run_id
        [child] = wait_for(
            lambda: [
                r for r in app.runs(workflow="ambiguous_child") if r.state == "needs_attention"
            ],
            "the child to need attention",
        )
        [grandchild] = wait_for(
            lambda: [r for r in app.runs(workflow="forever") if r.state == "waiting"],
            "the grandchild to wait",
        )
        assert app.get(parent).state == "waiting"
        assert ops.effects() == ["charge"]

        done = ops.cli("cancel", parent)
        assert done.returncode == 0, (done.stdout, done.stderr)
        assert app.get(parent).state == "canceled"
        flagged = app.get(child.run_id)
        assert (flagged.state, flagged.cancel_requested) == ("needs_attention", True)
        assert app.history(child.run_id)[-1].kind == "cancel_requested"
        assert app.get(grandchild.run_id).state == "canceled"

        done = ops.cli("resolve", child.run_id, "charge", "--output", '"ch-5"')
        assert done.returncode == 0, (done.stdout, done.stderr)
        assert json.loads(done.stdout)["state"] == "canceled"
        info = app.get(child.run_id)
        assert (info.state, info.error) == ("canceled", None)
        assert [r.kind for r in app.history(child.run_id)][-2:] == ["resolved", "canceled"]
        # Give the worker every chance to run the child on: it is not claimable.
        assert app.store.claim(app.name, "probe", [("ambiguous_child", "1")], lease_ttl=5) == []

    assert ops.effects() == ["charge"]  # ship never ran
    assert app.get(child.run_id).state == "canceled"
    assert app.get(parent).state == "canceled"


def test_resolve_with_an_error_still_fails_a_canceled_run(ops: Ops) -> None:
    app = ops.app
    with app.worker(**WORKER):
        run_id = app.start("ambiguous_order", "o-6").run_id
        wait_state(app, run_id, "needs_attention", "failed", "succeeded")
        assert app.cancel(run_id) is True
        assert app.get(run_id).state == "needs_attention"
        assert app.cancel(run_id) is False  # already recorded
        info = app.resolve(run_id, "charge", error="the card was declined")
    assert info.state == "failed"
    assert info.error is not None and info.error["code"] == "resolved_failed"
    assert ops.effects() == ["reserve", "charge"]


# -- keys ------------------------------------------------------------------------


def test_a_key_names_one_start(ops: Ops) -> None:
    app = ops.app
    taken = app.start("other", 1, key="order-1")
    with pytest.raises(perdure.KeyConflict) as conflict:
        app.start("pay", 500, key="order-1")
    assert (conflict.value.code, conflict.value.run_id) == ("key_conflict", taken.run_id)
    assert "'other'" in str(conflict.value) and "'pay'" in str(conflict.value)

    first = app.start("pay", 500, key="order-2")
    again = app.start("pay", 500, key="order-2")
    assert (again.run_id, again.created) == (first.run_id, False)
    with pytest.raises(perdure.KeyConflict, match="other inputs"):
        app.start("pay", 501, key="order-2")

    # Keyword arguments are compared as values, whatever their order.
    kw = app.start("pay_kw", cents=1, currency="usd", key="order-3")
    assert app.start("pay_kw", currency="usd", cents=1, key="order-3").run_id == kw.run_id

    # A redeploy (another version of the same workflow) repeats the same start.
    redeployed = perdure.App(ops.url, name=app.name)
    try:

        @redeployed.workflow(name="pay", version="2")
        def pay(ctx: perdure.Context, cents: int) -> int:
            return cents

        same = redeployed.start("pay", 500, key="order-2")
        assert (same.run_id, same.created) == (first.run_id, False)
    finally:
        redeployed.close()

    done = ops.cli("start", ops.target, "pay", "--args", "[500]", "--key", "order-1")
    doc = refused(done, "key_conflict")
    assert taken.run_id in doc["message"]
    assert len(app.runs(limit=100)) == 3


def test_a_child_key_names_one_start_too(ops: Ops) -> None:
    app = ops.app
    with app.worker(**WORKER):
        same = app.start("same_child_twice")
        first, again = same.result(timeout=LIMIT)
        assert first == again
        colliding = app.start("colliding_children").run_id
        info = wait_state(app, colliding, "failed", "succeeded", "needs_attention")
    assert info.state == "failed"
    assert info.error is not None
    assert (info.error["code"], info.error["type"]) == ("workflow_failed", "KeyConflict")
    assert "'pay'" in info.error["message"] and "'other'" in info.error["message"]
    assert [r.workflow for r in app.runs(workflow="other")] == []
