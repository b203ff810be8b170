"""Input at the edges: deep JSON, NUL characters, a damaged SQLite file.

Each is refused with a clear error (a stable code and a sentence, exit 2 on
the command line), before anything is stored, the same on both stores.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from hypothesis import given, settings
from hypothesis import strategies as st

import perdure
from perdure import cli, codec

DEEP = "[" * 3000 + "]" * 3000


def nested(depth: int) -> Any:
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


@pytest.fixture
def app(store_url: str) -> Iterator[perdure.App]:
    made = perdure.App(store_url, name="edges")

    @made.workflow()
    def gate(ctx: perdure.Context, *args: Any) -> Any:
        return ctx.wait("data")

    yield made
    made.close()


def snapshot(app: perdure.App, run_id: str) -> tuple[Any, ...]:
    """What the store holds for the run, to show that a refusal changed nothing."""
    return (
        app.get(run_id),
        app.store.outcomes(run_id),
        app.store.journal(run_id),
        [h.kind for h in app.history(run_id)],
        app.runs(limit=1000),
    )


# -- deep JSON ---------------------------------------------------------------------------


def test_a_value_nested_deeper_than_the_bound_is_invalid_payload(app: perdure.App) -> None:
    rid = app.start("gate").run_id
    before = snapshot(app, rid)
    too_deep = nested(codec.MAX_DEPTH + 1)
    very_deep = nested(5000)
    for payload in (too_deep, very_deep):
        with pytest.raises(perdure.InvalidPayload, match="nests more than"):
            app.signal(rid, "data", payload)
        with pytest.raises(perdure.InvalidPayload, match="nests more than"):
            app.send(rid, "inbox", "k", payload)
        with pytest.raises(perdure.InvalidPayload, match="nests more than"):
            app.start("gate", payload)
    assert snapshot(app, rid) == before
    # At the bound it is accepted, and comes back whole.
    at_bound = nested(codec.MAX_DEPTH)
    assert app.signal(rid, "data", at_bound).outcome == "signaled"
    with app.worker(concurrency=1, lease_ttl=3, heartbeat=1, poll_interval=0.05):
        assert app.handle(rid).result(timeout=30) == at_bound


def test_stored_text_nested_too_deeply_is_refused_not_a_recursion_error() -> None:
    with pytest.raises(perdure.InvalidPayload, match="nests more than"):
        codec.decode(DEEP)
    # Brackets inside strings are not nesting.
    assert codec.decode(json.dumps({"s": DEEP})) == {"s": DEEP}


def _deep_stack(frames: int, work: Any) -> Any:
    return work() if frames == 0 else _deep_stack(frames - 1, work)


def test_a_value_that_encodes_decodes_even_on_a_deep_stack() -> None:
    text = codec.encode(nested(codec.MAX_DEPTH))
    got: list[Any] = []
    # A worker thread decodes with more of the stack in use than the client had.
    thread = threading.Thread(
        target=lambda: got.append(_deep_stack(600, lambda: codec.decode(text)))
    )
    thread.start()
    thread.join(30)
    assert got == [nested(codec.MAX_DEPTH)]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet='[]{}"\\ab'),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=40,
)


@settings(max_examples=200, deadline=None)
@given(json_values)
def test_every_value_that_encodes_decodes_to_itself(value: Any) -> None:
    try:
        text = codec.encode(value)
    except perdure.InvalidPayload:
        return
    assert codec.decode(text) == value


SHOP = textwrap.dedent(
    """
    import perdure

    app = perdure.App(name="edgeshop")


    @app.workflow()
    def gate(ctx: perdure.Context, *args: object) -> object:
        return ctx.wait("data")
    """
)


def cli_run(*args: str) -> Result:
    return CliRunner().invoke(cli.cli, list(args))


def bad_input_line(result: Result, code: str) -> str:
    assert result.exit_code == 2, (result.exit_code, result.stdout, result.stderr)
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"perdure: error: [{code}] "), lines[0]
    return lines[0]


@pytest.fixture
def shop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    (tmp_path / "edge_shop.py").write_text(SHOP, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PERDURE_STORE", f"sqlite:///{tmp_path / 'shop.db'}")
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    yield "edge_shop:app"
    sys.modules.pop("edge_shop", None)


def test_deep_json_on_the_command_line_is_bad_input(shop: str) -> None:
    started = cli_run("start", shop, "gate", "--json")
    assert started.exit_code == 0, started.stderr
    rid = json.loads(started.stdout)["run_id"]
    for args in (
        ("signal", rid, "data", "--payload", DEEP),
        ("send", rid, "inbox", "k1", "--payload", DEEP),
        ("start", shop, "gate", "--args", DEEP),
    ):
        bad_input_line(cli_run(*args), "invalid_input")
    runs = json.loads(cli_run("runs", "--app", "edgeshop", "--json").stdout)
    assert [r["run_id"] for r in runs] == [rid]


# -- NUL characters ----------------------------------------------------------------------


def test_names_and_keys_with_a_nul_are_refused_alike_on_both_stores(app: perdure.App) -> None:
    rid = app.start("gate").run_id
    before = snapshot(app, rid)
    refusals = [
        lambda: app.start("gate", key="order\x00-1"),
        lambda: app.signal(rid, "da\x00ta", 1),
        lambda: app.signal(rid, "data", 1, signal_id="mail\x001"),
        lambda: app.send(rid, "in\x00box", "k", 1),
        lambda: app.send(rid, "inbox", "k\x00", 1),
        lambda: app.get("run\x00id"),
        lambda: app.cancel("run\x00id"),
        lambda: app.signal(rid, "\ud800", 1),
    ]
    for refused in refusals:
        with pytest.raises(perdure.InvalidInput) as caught:
            refused()
        assert caught.value.code == "invalid_input"
        assert "NUL" in str(caught.value) or "Unicode" in str(caught.value)
    assert snapshot(app, rid) == before
    # A NUL inside a payload is a JSON escape, kept by both stores.
    assert app.signal(rid, "data", "a\x00b").outcome == "signaled"
    with app.worker(concurrency=1, lease_ttl=3, heartbeat=1, poll_interval=0.05):
        assert app.handle(rid).result(timeout=30) == "a\x00b"


def test_a_step_named_with_a_nul_is_refused_where_it_is_declared(sqlite_url: str) -> None:
    app = perdure.App(sqlite_url, name="edges")
    try:
        with pytest.raises(perdure.InvalidInput, match="NUL"):

            @app.step(name="ch\x00arge")
            def charge() -> None:
                return None

    finally:
        app.close()


# -- a damaged SQLite file ---------------------------------------------------------------


def damage(path: Path) -> None:
    """Overwrite everything after the first page with bytes that are not a database."""
    size = path.stat().st_size
    assert size > 4096
    with path.open("r+b") as f:
        f.seek(4096)
        f.write(bytes((i * 7 + 13) % 251 for i in range(size - 4096)))


@pytest.fixture
def damaged(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'damaged.db'}"
    app = perdure.App(url, name="edges")

    @app.workflow()
    def gate(ctx: perdure.Context) -> Any:
        return ctx.wait("data")

    for i in range(50):
        app.start(gate, key=f"k{i}")
    app.close()
    damage(tmp_path / "damaged.db")
    return url


def test_a_damaged_sqlite_file_is_a_store_error_on_every_path(damaged: str) -> None:
    with pytest.raises(perdure.StoreDamaged) as caught:
        app = perdure.App(damaged, name="edges")

        @app.workflow()
        def gate(ctx: perdure.Context) -> Any:
            return ctx.wait("data")

        try:
            app.runs()
            app.start(gate)
        finally:
            app.close()
    assert isinstance(caught.value, perdure.StoreError)
    assert caught.value.code == "store_damaged"
    assert "damaged" in str(caught.value)


def test_the_command_line_reports_a_damaged_store_with_exit_2(damaged: str, tmp_path: Path) -> None:
    (tmp_path / "edge_shop.py").write_text(SHOP, encoding="utf-8")
    env = {**os.environ, "PERDURE_STORE": damaged, "PYTHONPATH": str(tmp_path)}
    for args in (
        ["runs", "--app", "edges"],
        ["start", "edge_shop:app", "gate"],
        ["worker", "edge_shop:app", "--lease-ttl", "3", "--heartbeat", "1"],
    ):
        done = subprocess.run(
            [sys.executable, "-m", "perdure", *args],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 2, (args, done.returncode, done.stderr)
        assert "Traceback" not in done.stderr
        assert "[store_damaged]" in done.stderr, done.stderr
