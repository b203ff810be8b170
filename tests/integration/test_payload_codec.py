"""Payload codecs: every payload is sealed in the store and opened by the app that has the codec.

The database's rows are read directly (every column of every table, as
text) to show that no payload is stored in plaintext, on both stores.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from cryptography.fernet import Fernet

import dbrows
import perdure
from perdure import payloads
from perdure.cli import cli
from perdure.testing import Environment

SECRET = "zebra-quartz-secret"
KEY_OLD = Fernet.generate_key()
KEY_NEW = Fernet.generate_key()


def plaintext_in(url: str) -> bool:
    text = dbrows.dump(url).lower()
    return SECRET in text or SECRET.upper().lower() in text or "quartz" in text


def build(url: str, codec: perdure.PayloadCodec | None, **options: Any) -> perdure.App:
    app = perdure.App(url, name="sealed", codec=codec, **options)

    @app.step()
    def shout(text: str) -> str:
        return text.upper()

    @app.workflow()
    def child(ctx: perdure.Context, word: str) -> str:
        return word + "-child"

    @app.workflow()
    def flow(ctx: perdure.Context, secret: str) -> dict[str, Any]:
        loud = shout(secret)
        approval = ctx.wait("approve")
        note = ctx.receive("notes")
        born = ctx.start_child(child, secret).result()
        update = ctx.next_update("ask")
        ctx.respond(update, update.payload + "-answer")
        ctx.set_event("status", secret + "-event")
        ctx.write_stream("log", secret + "-stream")
        return {"loud": loud, "approval": approval, "note": note.payload, "child": born}

    @app.workflow()
    def chooser(ctx: perdure.Context, secret: str) -> list[Any]:
        signaled = ctx.first(perdure.signal("pick"), perdure.message("never"))
        received = ctx.first(perdure.signal("never"), perdure.message("notes"))
        handle = ctx.start_child(child, secret)
        born = ctx.first(perdure.child(handle), perdure.signal("never"))
        return [signaled.value, received.value.payload, born.value]

    @app.transaction
    def stamp(conn: Any, text: str) -> str:
        return text + "-stamped"

    @app.workflow()
    def stamped(ctx: perdure.Context, secret: str) -> str:
        return stamp(secret)

    @app.workflow()
    def hold(ctx: perdure.Context, secret: str) -> str:
        first = shout(secret)
        ctx.wait("go")
        return first + "-" + shout(secret + "-again")

    return app


def fernet(*keys: bytes) -> perdure.FernetCodec:
    return perdure.FernetCodec(list(keys))


def drive_flow(env: Environment, app: perdure.App) -> str:
    handle = env.start("flow", SECRET)
    env.run_until_idle()
    app.signal(handle.run_id, "approve", {"by": SECRET})
    app.send(handle.run_id, "notes", "n-1", SECRET + "-note")
    env.run_until_idle()
    env.run_until_idle()
    answered: list[Any] = []
    sender = threading.Thread(
        target=lambda: answered.append(app.update(handle.run_id, "ask", SECRET, timeout=30))
    )
    sender.start()
    deadline = time.monotonic() + 30
    while app.get(handle.run_id).state != "queued" and time.monotonic() < deadline:
        time.sleep(0.01)  # until the update is delivered and wakes the run
    env.run_until_idle()
    sender.join(30)
    assert answered == [SECRET + "-answer"]
    return handle.run_id


def test_every_payload_kind_round_trips_and_is_ciphertext_in_the_store(store_url: str) -> None:
    app = build(store_url, fernet(KEY_NEW))
    with Environment(app, store=store_url) as env:
        run_id = drive_flow(env, app)
        assert app.client.result(run_id, timeout=5) == {
            "loud": SECRET.upper(),
            "approval": {"by": SECRET},
            "note": SECRET + "-note",
            "child": SECRET + "-child",
        }
        assert app.get_event(run_id, "status") == SECRET + "-event"
        assert list(app.read_stream(run_id, "log")) == [SECRET + "-stream"]
        view = app.client.view(run_id)
        assert view.inputs == {"args": [SECRET], "kwargs": {}}
        assert view.step("shout") == SECRET.upper()
        assert not plaintext_in(store_url)
    app.close()


def test_ctx_first_opens_the_value_that_won(store_url: str) -> None:
    app = build(store_url, fernet(KEY_NEW))
    with Environment(app, store=store_url) as env:
        handle = env.start("chooser", SECRET)
        env.run_until_idle()
        app.signal(handle.run_id, "pick", {"by": SECRET})
        app.send(handle.run_id, "notes", "n-1", SECRET + "-note")
        env.run_until_idle()
        env.run_until_idle()
        assert handle.result(timeout=5) == [
            {"by": SECRET},
            SECRET + "-note",
            SECRET + "-child",
        ]
    app.close()
    assert not plaintext_in(store_url)


def test_a_transaction_steps_output_is_sealed(store_url: str) -> None:
    app = build(store_url, fernet(KEY_NEW))
    with Environment(app, store=store_url) as env:
        handle = env.start("stamped", SECRET)
        env.run_until_idle()
        assert handle.result(timeout=5) == SECRET + "-stamped"
        [entry] = env.store.journal(handle.run_id)
        assert entry.output is not None and json.loads(entry.output)["$codec"] == "fernet"
        assert app.client.view(handle.run_id).step("stamp") == SECRET + "-stamped"
    app.close()
    assert not plaintext_in(store_url)


def test_without_the_codec_a_client_sees_the_envelope(store_url: str) -> None:
    app = build(store_url, fernet(KEY_NEW))
    with Environment(app, store=store_url) as env:
        run_id = drive_flow(env, app)
    app.close()
    plain = perdure.App(store_url, name="sealed")
    try:
        shown = plain.get(run_id).result
        assert isinstance(shown, dict) and shown["$codec"] == "fernet"
        assert SECRET not in json.dumps(shown)
        assert plain.get_event(run_id, "status")["$codec"] == "fernet"
    finally:
        plain.close()


def test_the_command_line_shows_ciphertext_unless_given_the_codec(
    sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = build(sqlite_url, fernet(KEY_NEW))
    with Environment(app, store=sqlite_url) as env:
        run_id = drive_flow(env, app)
    app.close()
    (tmp_path / "sealing.py").write_text(
        f"import perdure\ncodec = perdure.FernetCodec([{KEY_NEW!r}])\nnot_a_codec = 42\n"
    )
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    shown = runner.invoke(cli, ["show", run_id, "--journal", "--json", "--store", sqlite_url])
    assert shown.exit_code == 0, shown.output
    assert SECRET not in shown.output and '"$codec": "fernet"' in shown.output
    opened = runner.invoke(
        cli,
        ["--codec", "sealing:codec", "show", run_id, "--journal", "--json", "--store", sqlite_url],
    )
    assert opened.exit_code == 0, opened.output
    doc = json.loads(opened.output)
    assert doc["result"]["loud"] == SECRET.upper()
    assert "$codec" not in opened.output
    wrong = runner.invoke(cli, ["--codec", "sealing:not_a_codec", "show", run_id])
    assert wrong.exit_code == 2 and "not a perdure.PayloadCodec" in wrong.output


def test_keys_rotate_without_rewriting_history(store_url: str) -> None:
    old = build(store_url, fernet(KEY_OLD))
    with Environment(old, store=store_url) as env:
        handle = env.start("hold", SECRET)
        env.run_until_idle()
        first_output = next(e.output for e in env.store.journal(handle.run_id) if e.kind == "step")
    old.close()
    rotated = build(store_url, fernet(KEY_NEW, KEY_OLD))
    with Environment(rotated, store=store_url) as env:
        rotated.signal(handle.run_id, "go")
        env.run_until_idle()
        assert rotated.client.result(handle.run_id, timeout=5) == (
            f"{SECRET.upper()}-{SECRET.upper()}-AGAIN"
        )
        journal = env.store.journal(handle.run_id)
    # The old entry is untouched; the new one is written with the new key.
    steps = [e.output for e in journal if e.kind == "step"]
    assert steps[0] == first_output
    new_only = payloads.Payloads(payload_codec=fernet(KEY_NEW))
    old_only = payloads.Payloads(payload_codec=fernet(KEY_OLD))
    assert new_only.open_text(steps[1]) == f"{SECRET.upper()}-AGAIN"
    assert old_only.open_text(steps[0]) == SECRET.upper()
    with pytest.raises(perdure.PayloadUnreadable):
        new_only.open_text(steps[0])
    assert not plaintext_in(store_url)


def test_a_worker_without_the_codec_stops_the_run_in_needs_attention(store_url: str) -> None:
    sealed = build(store_url, fernet(KEY_NEW))
    handle = sealed.start("hold", SECRET)
    sealed.close()
    bare = build(store_url, None)
    with Environment(bare, store=store_url) as env:
        env.run_until_idle()
        info = bare.get(handle.run_id)
    bare.close()
    assert info.state == "needs_attention"
    assert info.error is not None and info.error["code"] == "payload_unreadable"


def test_a_run_started_by_a_client_runs_on_a_worker_process_with_the_codec(
    store_url: str,
) -> None:
    """The client and the worker are separate apps (as in separate processes)."""
    client_app = build(store_url, fernet(KEY_NEW))
    handle = client_app.start("hold", SECRET)
    worker_app = build(store_url, fernet(KEY_NEW))
    with Environment(worker_app, store=store_url) as env:
        env.run_until_idle()
        client_app.signal(handle.run_id, "go")
        env.run_until_idle()
    assert handle.result(timeout=5) == f"{SECRET.upper()}-{SECRET.upper()}-AGAIN"
    client_app.close()
    worker_app.close()
    assert not plaintext_in(store_url)


def test_a_start_repeated_under_its_key_matches_sealed_inputs(store_url: str) -> None:
    app = build(store_url, fernet(KEY_NEW))
    try:
        first = app.start("hold", SECRET, key="k-1")
        again = app.start("hold", SECRET, key="k-1")
        assert again.run_id == first.run_id and not again.created
        with pytest.raises(perdure.KeyConflict):
            app.start("hold", SECRET + "-other", key="k-1")
    finally:
        app.close()


# -- offload ---------------------------------------------------------------------


@pytest.fixture
def blobs(tmp_path: Path) -> perdure.FilePayloadStore:
    return perdure.FilePayloadStore(tmp_path / "blobs")


def test_payloads_over_the_threshold_go_to_the_payload_store(
    store_url: str, blobs: perdure.FilePayloadStore
) -> None:
    app = build(store_url, fernet(KEY_NEW), payload_store=blobs, offload_above=1024)
    big = SECRET * 200  # about 4 KB of JSON: over the threshold, under the limit
    with Environment(app, store=store_url) as env:
        handle = env.start("hold", big)
        env.run_until_idle()
        app.signal(handle.run_id, "go")
        env.run_until_idle()
        assert handle.result(timeout=5) == f"{big.upper()}-{big.upper()}-AGAIN"
        run = env.store.get_run(handle.run_id)
        assert run is not None
        stored_input = json.loads(run.input)
        digest = payloads.blob_digest(stored_input)
        assert digest is not None and stored_input["codec"] == "fernet"
        assert (blobs.directory / digest[:2] / digest).exists()
    app.close()
    assert not plaintext_in(store_url)
    # A blob altered on disk is refused by its digest; a missing one by name.
    path = blobs.path(digest)
    path.write_bytes(path.read_bytes() + b"x")
    reader = payloads.Payloads(payload_codec=fernet(KEY_NEW), store=blobs)
    with pytest.raises(perdure.PayloadDigestMismatch):
        reader.open_text(run.input)
    path.unlink()
    with pytest.raises(perdure.PayloadMissing):
        reader.open_text(run.input)


def test_offload_without_a_codec_keeps_small_payloads_inline(
    store_url: str, blobs: perdure.FilePayloadStore
) -> None:
    app = build(store_url, None, payload_store=blobs, offload_above=1024)
    with Environment(app, store=store_url) as env:
        small = env.start("hold", "tiny")
        large = env.start("hold", "y" * 5000)
        env.run_until_idle()
        small_run, large_run = env.store.get_run(small.run_id), env.store.get_run(large.run_id)
        assert small_run is not None and large_run is not None
        assert "tiny" in small_run.input
        assert json.loads(large_run.input)["codec"] is None
        assert app.client.view(large.run_id).inputs == {"args": ["y" * 5000], "kwargs": {}}
    app.close()


@pytest.fixture
def layer() -> Iterator[payloads.Payloads]:
    yield payloads.Payloads(payload_codec=fernet(KEY_NEW))


def test_a_payload_that_looks_like_an_envelope_is_kept_apart(layer: payloads.Payloads) -> None:
    lookalike = {"$codec": "fernet", "data": "not ours"}
    assert payloads.PLAIN.open_text(payloads.PLAIN.seal(lookalike, "x")) == lookalike
    assert layer.open_text(layer.seal(lookalike, "x")) == lookalike
    with pytest.raises(perdure.PayloadTooLarge):
        payloads.Payloads(limit=10, payload_codec=fernet(KEY_NEW)).seal("x" * 20, "the value")


def test_the_console_shows_ciphertext_without_the_codec_and_plaintext_with_it(
    sqlite_url: str,
) -> None:
    from starlette.testclient import TestClient

    from perdure.web import app as web_app

    app = build(sqlite_url, fernet(KEY_NEW))
    with Environment(app, store=sqlite_url) as env:
        run_id = drive_flow(env, app)
        bare = perdure.Client(env.store, "sealed")
        for client, sealed in ((bare, True), (app.client, False)):
            http = TestClient(
                web_app.create_app(client, open_local=True), base_url="http://127.0.0.1:8025"
            )
            info = http.get(f"/api/v1/runs/{run_id}")
            journal = http.get(f"/api/v1/runs/{run_id}/journal")
            page = http.get(f"/runs/{run_id}")
            assert (info.status_code, journal.status_code, page.status_code) == (200, 200, 200)
            listing = http.get("/api/v1/runs?state=succeeded")
            assert listing.status_code == 200
            assert (SECRET.upper() in listing.text) is not sealed
            shown = info.text + journal.text + page.text + listing.text
            assert (SECRET in shown) is not sealed
            assert ("$codec" in shown) is sealed
    app.close()
