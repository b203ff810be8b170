"""Continue-as-new on both stores: chains, what moves to the successor, the first run id."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import pytest
from click.testing import CliRunner

import perdure
from perdure import cli
from perdure import client as client_api
from perdure.testing import Environment, faults


def build(store_url: str) -> perdure.App:
    app = perdure.App(store_url, name=f"can_{uuid.uuid4().hex[:8]}")

    @app.step()
    def add(total: int, n: int) -> int:
        return total + n

    @app.workflow(version="1")
    def counter(ctx: perdure.Context, cursor: int, last: int, total: int = 0) -> int:
        total = add(total, cursor)
        if cursor < last:
            ctx.continue_as_new(cursor + 1, last, total=total)
        return total

    @app.workflow(version="1")
    def inbox(ctx: perdure.Context, rounds: int, seen: list[list[str]]) -> list[list[str]]:
        message = ctx.receive("events")
        payload = ctx.wait("go")
        seen = [*seen, [message.key, payload]]
        if len(seen) < rounds:
            ctx.continue_as_new(rounds, seen)
        return seen

    @app.workflow(version="1")
    def stopper(ctx: perdure.Context, turn: int) -> str:
        if turn == 0:
            ctx.continue_as_new(1)
        return str(ctx.wait("stop"))

    @app.workflow(version="1")
    def leaf(ctx: perdure.Context, n: int) -> int:
        if n < 3:
            ctx.continue_as_new(n + 1)
        return n * 10

    @app.workflow(version="1")
    def parent(ctx: perdure.Context) -> int:
        value: int = ctx.start_child(leaf, 0).result()
        return value + 1

    @app.workflow(version="1")
    def idle(ctx: perdure.Context) -> Any:
        return ctx.wait("never")

    @app.workflow(version="1", parent_close="cancel")
    def bound(ctx: perdure.Context) -> Any:
        return ctx.wait("never")

    @app.workflow(version="1")
    def keeper(ctx: perdure.Context, turn: int) -> Any:
        if turn == 0:
            ctx.start_child(bound)
            ctx.start_child(idle)
            ctx.continue_as_new(1)
        return ctx.wait("never")

    @app.workflow(version="1")
    def mover(ctx: perdure.Context, to: str) -> str:
        ctx.continue_as_new("x", version=to)

    @app.workflow(version="1")
    def sloppy(ctx: perdure.Context) -> str:
        ctx.continue_as_new(1, 2, 3)

    @app.workflow(version="1")
    async def ticker(ctx: perdure.Context, n: int) -> int:
        await ctx.sleep(1)
        if n < 2:
            ctx.continue_as_new(n + 1)
        return n

    return app


def test_a_loop_continues_n_times_with_a_fresh_journal_each(store_url: str) -> None:
    app = build(store_url)
    with Environment(app, store=store_url) as env:
        first = env.start("counter", 0, 5, key="loop-1")
        env.run_until_idle()
        assert first.result(timeout=5) == 15
        info = app.get(first.run_id)
        assert info.state == "succeeded" and info.result == 15
        assert len(info.chain) == 6 and info.chain[0] == first.run_id
        assert info.run_id == info.chain[-1] != first.run_id
        links = [app.get(r, follow=False) for r in info.chain]
        assert [r.state for r in links] == ["succeeded"] * 6
        assert [r.continued_as for r in links] == [*info.chain[1:], None]
        assert [r.result for r in links] == [None] * 5 + [15]
        for run_id in info.chain:
            # One step per run: no journal grows with the loop.
            assert [e.kind for e in env.store.journal(run_id)] == ["step"]
        # The key follows the chain: a start under it returns the current run.
        assert [r.key for r in links] == [None] * 5 + ["loop-1"]
        again = app.start("counter", 0, 5, key="loop-1")
        assert again.run_id == info.run_id and not again.created
        # The ledger shows the links.
        assert app.history(first.run_id)[-1].kind == "continued"
        assert app.history(first.run_id)[-1].note == f"as {info.chain[1]}"
        opened = app.history(info.chain[1])[0]
        assert (opened.kind, opened.note) == ("initialized", f"continued from {first.run_id}")


def test_messages_and_buffered_signals_move_to_the_successor(store_url: str) -> None:
    app = build(store_url)
    with Environment(app, store=store_url) as env:
        first = env.start("inbox", 3, [])
        for n in (1, 2, 3):
            assert app.send(first.run_id, "events", f"m{n}", n) is True
            receipt = app.signal(first.run_id, "go", f"s{n}", signal_id=f"sig-{n}")
            assert receipt.run_id == first.run_id
        env.run_until_idle()
        assert first.result(timeout=5) == [["m1", "s1"], ["m2", "s2"], ["m3", "s3"]]
        chain = app.get(first.run_id).chain
        assert len(chain) == 3
        # Each message and signal was applied once, by one run of the chain.
        received = [
            e.name for run_id in chain for e in env.store.journal(run_id) if e.kind == "receive"
        ]
        waited = [e.name for run_id in chain for e in env.store.journal(run_id) if e.kind == "wait"]
        assert received == ["events"] * 3 and waited == ["go"] * 3


def test_sends_and_signals_around_the_boundary_are_neither_lost_nor_repeated(
    store_url: str,
) -> None:
    app = build(store_url)
    with Environment(app, store=store_url) as env:
        first = env.start("inbox", 3, [])
        app.send(first.run_id, "events", "m1", 1)
        app.signal(first.run_id, "go", "s1", signal_id="sig-1")
        app.send(first.run_id, "events", "m2", 2)
        env.run_until_idle()
        second = app.get(first.run_id)
        assert second.run_id != first.run_id and second.state == "waiting"
        # A sender repeating a message or a signal the first run consumed is not applied twice.
        assert app.send(first.run_id, "events", "m1", 1) is False
        # Sent to the first id after the boundary: it lands on the current run.
        repeated = app.signal(first.run_id, "go", "s2", signal_id="sig-2")
        assert repeated.run_id == second.run_id and repeated.name == "go"
        assert app.signal(first.run_id, "go", "s2", signal_id="sig-2") == repeated
        env.run_until_idle()
        app.send(first.run_id, "events", "m3", 3)
        app.signal(first.run_id, "go", "s3")
        env.run_until_idle()
        assert first.result(timeout=5) == [["m1", "s1"], ["m2", "s2"], ["m3", "s3"]]


def test_signal_and_cancel_through_the_first_run_id(store_url: str) -> None:
    app = build(store_url)
    with Environment(app, store=store_url) as env:
        signaled = env.start("stopper", 0)
        canceled = env.start("stopper", 0)
        env.run_until_idle()
        receipt = app.signal(signaled.run_id, "stop", "bye")
        current = app.get(signaled.run_id)
        assert receipt.run_id == current.run_id == current.chain[1]
        assert app.waits(current.run_id) == []
        env.run_until_idle()
        assert signaled.result(timeout=5) == "bye"

        assert app.cancel(canceled.run_id) is True
        info = app.get(canceled.run_id)
        assert info.state == "canceled" and info.run_id != canceled.run_id
        assert app.get(canceled.run_id, follow=False).state == "succeeded"
        with pytest.raises(perdure.RunFailed):
            canceled.result(timeout=5)


def test_a_child_that_continues_answers_its_parent_when_the_chain_ends(store_url: str) -> None:
    app = build(store_url)
    with Environment(app, store=store_url) as env:
        handle = env.start("parent")
        env.run_until_idle()
        assert handle.result(timeout=5) == 31
        [child] = [r for r in app.runs(workflow="leaf") if r.continued_as is None]
        assert child.parent_id == handle.run_id and len(app.get(child.run_id).chain) == 4


def test_children_follow_their_parent_close_policy(store_url: str) -> None:
    app = build(store_url)
    with Environment(app, store=store_url) as env:
        env.start("keeper", 0)
        env.run_until_idle()
        states = {r.workflow: r.state for r in app.runs(limit=100) if r.workflow != "keeper"}
        assert states == {"bound": "canceled", "idle": "waiting"}


def test_version_moves_the_successor_and_bad_arguments_fail_the_run(store_url: str) -> None:
    app = build(store_url)
    with Environment(app, store=store_url) as env:
        moved = env.start("mover", "2")
        sloppy = env.start("sloppy")
        env.run_until_idle()
        info = app.get(moved.run_id)
        # This worker has no version 2: the successor waits for one that has.
        assert (info.workflow, info.version, info.state) == ("mover", "2", "queued")
        failed = app.get(sloppy.run_id)
        assert failed.state == "failed" and failed.run_id == sloppy.run_id
        assert failed.error is not None and "bad arguments" in failed.error["message"]
    # A deploy that has version 2 runs the successor.
    newer = perdure.App(store_url, name=app.name)

    @newer.workflow(name="mover", version="2")
    def mover_v2(ctx: perdure.Context, to: str) -> str:
        return f"moved with {to}"

    with Environment(newer, store=store_url) as env:
        env.run_until_idle()
        assert newer.handle(moved.run_id).result(timeout=5) == "moved with x"


def test_the_async_client_follows_the_chain(store_url: str) -> None:
    app = build(store_url)
    with Environment(app, store=store_url) as env:
        first = env.start("counter", 0, 2)
        env.run_until_idle()

        async def read() -> tuple[perdure.RunInfo, int]:
            return await app.aget(first.run_id), await first.aresult(timeout=5)

        info, result = asyncio.run(read())
        assert result == 3 and info.result == 3 and len(info.chain) == 3


def test_perdure_show_prints_the_current_run_and_the_chain(store_url: str) -> None:
    app = build(store_url)
    with Environment(app, store=store_url) as env:
        first = env.start("counter", 0, 2)
        env.run_until_idle()
        chain = app.get(first.run_id).chain
    shown = CliRunner().invoke(cli.cli, ["show", first.run_id, "--store", store_url, "--json"])
    assert shown.exit_code == 0, shown.output
    doc = json.loads(shown.output)
    assert doc["run_id"] == chain[-1] and doc["chain"] == list(chain) and doc["result"] == 3
    text = CliRunner().invoke(cli.cli, ["show", first.run_id, "--store", store_url, "--history"])
    assert text.exit_code == 0, text.output
    assert " -> ".join(chain) in text.output
    assert f"continued from {chain[1]}" in text.output


def test_an_async_workflow_continues_as_new(store_url: str) -> None:
    app = build(store_url)
    with Environment(app, store=store_url) as env:
        first = env.start("ticker", 0)
        env.advance(10)
        assert first.result(timeout=5) == 2 and len(app.get(first.run_id).chain) == 3


def test_a_send_or_signal_racing_the_continue_lands_on_the_successor(store_url: str) -> None:
    app = build(store_url)
    with Environment(app, store=store_url) as env:
        sent = env.start("stopper", 0)
        racing = faults.FaultyStore(env.store)
        client = client_api.Client(racing, app.name)
        # The client has read the run as live; the run continues before its write.
        racing.before("send", lambda *args, **kwargs: env.run_until_idle())
        assert client.send(sent.run_id, "events", "late", 1) is True
        second = app.get(sent.run_id)
        assert second.run_id != sent.run_id
        assert [m.key for m in [env.store.next_message(second.run_id, "events", 0)] if m] == [
            "late"
        ]
        signaled = env.start("stopper", 0)
        racing.before("settle_wait", lambda *args, **kwargs: env.run_until_idle())
        receipt = client.signal(signaled.run_id, "stop", "now", signal_id="late-1")
        assert racing.calls["settle_wait"] == 2  # refused by the ended run, then taken
        current = app.get(signaled.run_id)
        assert receipt.run_id == current.run_id != signaled.run_id
        env.run_until_idle()
        assert signaled.result(timeout=5) == "now"
