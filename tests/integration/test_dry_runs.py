"""Dry runs on both stores: claimed only by dry-run workers, effects described and not performed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

import perdure
from perdure import codec, errors
from perdure.testing import Environment


def build(store_url: str, effects: Path) -> perdure.App:
    """An app whose effectful steps append a line to ``effects`` each time they run."""
    app = perdure.App(store_url, name=f"dry_{uuid.uuid4().hex[:8]}")

    def effect(what: str) -> None:
        with effects.open("a") as f:
            f.write(what + "\n")

    @app.step(effect="pure")
    def price(items: list[int]) -> int:
        return sum(items) * 10

    @app.step(effect="once", dry_run=lambda amount, card: {"charge_id": f"dry-{amount}"})
    def charge(amount: int, card: str) -> dict[str, str]:
        effect(f"charge {amount} {card}")
        return {"charge_id": "real"}

    @app.step()
    def notify(who: str) -> str:
        effect(f"notify {who}")
        return "sent"

    @app.transaction(dry_run=lambda order: 0)
    def reserve(conn: Any, order: str) -> int:
        effect(f"reserve {order}")
        return 1

    @app.workflow()
    def ship(ctx: perdure.Context, order: str) -> dict[str, Any]:
        ctx.start_child(notify_wf, order)
        return {"ok": True}

    @app.workflow()
    def notify_wf(ctx: perdure.Context, order: str) -> Any:
        return notify(order)

    @app.workflow()
    def checkout(ctx: perdure.Context, order: str, items: list[int]) -> dict[str, Any]:
        total = price(items)
        receipt = charge(total, "4242")
        sent = notify(order)
        reserved = reserve(order)
        return {"total": total, "receipt": receipt, "sent": sent, "reserved": reserved}

    return app


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_a_dry_run_runs_pure_steps_describes_the_others_and_performs_no_effect(
    store_url: str, tmp_path: Path
) -> None:
    effects = tmp_path / "effects.log"
    app = build(store_url, effects)
    with Environment(app, store=store_url) as env:
        handle = env.start("checkout", "o-1", [1, 2], dry_run=True)
        assert env.run_until_idle() == 0  # an ordinary worker never takes it
        assert app.get(handle.run_id).state == "queued"
        assert env.run_until_idle(dry_run=True) == 1
        assert handle.result(timeout=0) == {
            "total": 30,
            "receipt": {"charge_id": "dry-30"},  # the stub's value flows on
            "sent": None,  # no stub: None
            "reserved": 0,
        }
        info = app.get(handle.run_id)
        assert info.dry_run is True
        history = app.history(handle.run_id)
    assert _lines(effects) == []
    described = [(r.step, r.note) for r in history if r.kind == "step_described"]
    assert described == [("charge", "once"), ("notify", "idempotent"), ("reserve", "transaction")]
    digests = {r.step: r.digest for r in history if r.kind == "step_described"}
    assert digests["charge"] == codec.digest(
        codec.encode({"args": [30, "4242"], "kwargs": {}}, envelope=2)
    )


def test_the_same_workflow_as_a_real_run_performs_its_effects(
    store_url: str, tmp_path: Path
) -> None:
    effects = tmp_path / "effects.log"
    app = build(store_url, effects)
    with Environment(app, store=store_url) as env:
        handle = env.start("checkout", "o-2", [1], dry_run=False)
        assert env.run_until_idle(dry_run=True) == 0  # a dry-run worker never takes it
        env.run_until_idle()
        assert handle.result(timeout=0)["receipt"] == {"charge_id": "real"}
        assert app.get(handle.run_id).dry_run is False
    assert _lines(effects) == ["charge 10 4242", "notify o-2", "reserve o-2"]


def test_the_children_of_a_dry_run_are_dry(store_url: str, tmp_path: Path) -> None:
    effects = tmp_path / "effects.log"
    app = build(store_url, effects)
    with Environment(app, store=store_url) as env:
        handle = env.start("ship", "o-3", dry_run=True)
        env.run_until_idle(dry_run=True)
        assert handle.result(timeout=0) == {"ok": True}
        [child] = app.runs(workflow="notify_wf")
        assert child.dry_run is True and child.state == "succeeded"
        assert [r.run_id for r in app.runs(dry_run=True)] and app.runs(dry_run=False) == []
    assert _lines(effects) == []


def test_a_key_names_a_dry_run_or_a_real_one_never_both(store_url: str, tmp_path: Path) -> None:
    app = build(store_url, tmp_path / "effects.log")
    with Environment(app, store=store_url) as env:
        dry = env.start("checkout", "o-4", [1], key="k-1", dry_run=True)
        assert env.start("checkout", "o-4", [1], key="k-1", dry_run=True).run_id == dry.run_id
        with pytest.raises(errors.KeyConflict, match="as a dry run"):
            env.start("checkout", "o-4", [1], key="k-1")


def test_a_bad_stub_or_flag_is_refused(tmp_path: Path) -> None:
    app = perdure.App(f"sqlite:///{tmp_path / 'db'}", name="bad")
    with pytest.raises(errors.InvalidInput, match="dry_run="):

        @app.step(dry_run="nope")  # type: ignore[call-overload]
        def s() -> None: ...

    @app.workflow()
    def wf(ctx: perdure.Context) -> None: ...

    with pytest.raises(errors.InvalidInput, match="True or False"):
        app.start(wf, dry_run="yes")  # type: ignore[call-overload]
    app.close()


def test_a_real_ordinary_worker_leaves_a_dry_run_queued_and_a_dry_run_worker_ends_it(
    store_url: str, tmp_path: Path
) -> None:
    effects = tmp_path / "effects.log"
    app = build(store_url, effects)
    dry = app.start("checkout", "o-5", [2], dry_run=True)
    real = app.start("checkout", "o-6", [3])  # created after: claimed after, if at all
    with app.worker(liveness="thread", poll_interval=0.05):
        assert real.result(timeout=30)["total"] == 30
        assert app.get(dry.run_id).state == "queued"
    assert _lines(effects) == ["charge 30 4242", "notify o-6", "reserve o-6"]
    with app.worker(liveness="thread", poll_interval=0.05, dry_run=True):
        assert dry.result(timeout=30)["receipt"] == {"charge_id": "dry-20"}
    assert _lines(effects) == ["charge 30 4242", "notify o-6", "reserve o-6"]
    app.close()


APP_MODULE = """
from pathlib import Path

import perdure

app = perdure.App(name="drycli")
EFFECTS = Path(__file__).with_name("effects.log")


@app.step(effect="once", dry_run=lambda n: n * 100)
def charge(n: int) -> int:
    with EFFECTS.open("a") as f:
        f.write(f"charge {n}\\n")
    return n


@app.workflow()
def pay(ctx: perdure.Context, n: int) -> int:
    return charge(n)
"""


def test_perdure_worker_dry_run_in_its_own_process_ends_only_the_dry_run(
    store_url: str, tmp_path: Path
) -> None:
    (tmp_path / "dryapp.py").write_text(textwrap.dedent(APP_MODULE))
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "PERDURE_STORE": store_url}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "perdure", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    started = cli("start", "dryapp:app", "pay", "--args", "[3]", "--dry-run", "--json")
    assert started.returncode == 0, started.stderr
    dry_id = json.loads(started.stdout)["run_id"]
    assert json.loads(started.stdout)["dry_run"] is True
    real = cli("start", "dryapp:app", "pay", "--args", "[4]", "--json")
    real_id = json.loads(real.stdout)["run_id"]
    worker = subprocess.Popen(
        [sys.executable, "-m", "perdure", "worker", "dryapp:app", "--dry-run"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            shown = json.loads(cli("show", dry_id, "--json").stdout)
            if shown["state"] == "succeeded":
                break
            time.sleep(0.1)
        assert shown["state"] == "succeeded" and shown["result"] == 300
    finally:
        worker.terminate()
        out, err = worker.communicate(timeout=30)
    assert "dry-run worker" in out, err
    assert json.loads(cli("show", real_id, "--json").stdout)["state"] == "queued"
    assert not (tmp_path / "effects.log").exists()
    listed = cli("runs", "dryapp:app", "--dry-run", "--json")
    assert [r["run_id"] for r in json.loads(listed.stdout)] == [dry_id]
    table = cli("runs", "dryapp:app").stdout
    assert "succeeded (dry)" in table and "queued" in table
