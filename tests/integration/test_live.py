"""Talking to live runs on both stores: updates, validators, queries, events, streams.

The workflows are in ``live_app``; a worker runs in this process, and other
processes (``python live_app.py CALL ARGS``) are the callers that start late,
send the same update again or wait for an event. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import live_app
import pytest
from click.testing import CliRunner

import perdure
from conftest import skip_unless_adapter
from perdure import cli
from perdure.store import liveport

HERE = Path(__file__).resolve().parent
LIMIT = 30.0
WORKER: dict[str, Any] = {"concurrency": 4, "lease_ttl": 3, "heartbeat": 1, "poll_interval": 0.05}


@pytest.fixture
def app(store_url: str) -> Iterator[perdure.App]:
    skip_unless_adapter(store_url)
    live_app.app.close()
    live_app.app.use_store(store_url)
    yield live_app.app
    live_app.app.close()


def wait_for(check: Callable[[], Any], what: str) -> Any:
    deadline = time.monotonic() + LIMIT
    while not (value := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)
    return value


def parked(app: perdure.App, run_id: str) -> None:
    wait_for(lambda: app.get(run_id).state == "waiting", f"run {run_id} to park")


class Caller:
    """A process of ``live_app`` making one call; its JSON lines are read as they come."""

    def __init__(self, url: str, call: str, *args: Any) -> None:
        env = {**os.environ, "PERDURE_STORE": url, "PYTHONPATH": str(HERE)}
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "live_app.py"), call, json.dumps(list(args))],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        self._out = self.proc.stdout

    def line(self) -> dict[str, Any]:
        found: dict[str, Any] = {}
        reader = threading.Thread(target=lambda: found.update(json.loads(self._out.readline())))
        reader.start()
        reader.join(LIMIT)
        assert found, f"the caller said nothing in time: {self.stderr()}"
        return found

    def result(self) -> dict[str, Any]:
        while True:
            line = self.line()
            if "ok" in line or "error" in line:
                assert self.proc.wait(LIMIT) == 0, self.stderr()
                return line

    def stderr(self) -> str:
        if self.proc.poll() is None:
            self.proc.kill()
        assert self.proc.stderr is not None
        return self.proc.stderr.read()


def tables(url: str) -> dict[str, list[str]]:
    """Every row of every table of the store, as text, in a stable order."""
    if url.startswith("sqlite"):
        conn = sqlite3.connect(url[len("sqlite:///") :])
        try:
            names = [
                r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            ]
            return {n: sorted(map(repr, conn.execute(f'SELECT * FROM "{n}"'))) for n in names}
        finally:
            conn.close()
    import psycopg

    with psycopg.connect(url) as conn:
        names = [
            r[0]
            for r in conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = 'perdure'"
            )
        ]
        return {
            n: sorted(map(repr, conn.execute(f'SELECT * FROM perdure."{n}"').fetchall()))
            for n in names
        }


# -- updates --------------------------------------------------------------------


def test_the_same_update_from_several_processes_is_applied_once(
    app: perdure.App, store_url: str
) -> None:
    with app.worker(**WORKER):
        run_id = app.start(live_app.order, "o-1", 2).run_id
        parked(app, run_id)
        callers = [
            Caller(store_url, "update", run_id, "add_item", {"sku": f"s{i}", "qty": 1}, "u-1", 20)
            for i in range(3)
        ]
        answers = [c.result() for c in callers]
        assert answers == [{"ok": {"count": 1}}] * 3
        assert app.query(run_id, "item_count") == 1
        view = app.client.view(run_id)
        [consumed] = view.updates("add_item")
        stored = liveport.require(app.store).get_update(run_id, "u-1")
        assert stored is not None and json.loads(stored.payload) == consumed.payload
        assert app.update(run_id, "add_item", {"sku": "x", "qty": 2}, timeout=20) == {"count": 2}
        assert app.handle(run_id).result(timeout=LIMIT)["items"][1] == {"sku": "x", "qty": 2}
    journal = app.store.journal(run_id)
    assert [e.kind for e in journal].count("respond") == 2
    # Answered before the end: still answered, from another process, after it.
    late = Caller(store_url, "update", run_id, "add_item", {"sku": "z", "qty": 1}, "u-1")
    assert late.result() == {"ok": {"count": 1}}
    with pytest.raises(perdure.RunFinished):
        app.update(run_id, "add_item", {"sku": "z", "qty": 1}, "u-new")


def test_a_rejected_update_leaves_the_store_unchanged(app: perdure.App, store_url: str) -> None:
    run_id = app.start(live_app.order, "o-2").run_id
    with app.worker(**WORKER):
        parked(app, run_id)
    before = tables(store_url)
    with pytest.raises(perdure.UpdateRejected) as rejected:
        app.update(run_id, "add_item", {"sku": "a", "qty": 0}, update_id="bad")
    assert rejected.value.code == "update_rejected"
    assert "qty must be positive" in str(rejected.value)
    assert tables(store_url) == before
    # A rejected id is not remembered: a valid update may use it.
    with pytest.raises(perdure.UpdateTimedOut):
        app.update(run_id, "add_item", {"sku": "a", "qty": 1}, update_id="bad", timeout=0)
    stored = liveport.require(app.store).get_update(run_id, "bad")
    assert stored is not None and stored.state == "pending"
    assert app.get(run_id).state == "queued"  # delivery woke the parked run


def test_an_update_racing_the_end_of_its_run_is_answered_one_way(app: perdure.App) -> None:
    with app.worker(**WORKER):
        for i in range(4):
            run_id = app.start(live_app.ignores_updates).run_id
            parked(app, run_id)
            barrier = threading.Barrier(2)
            outcome: list[BaseException] = []

            def send(
                run_id: str = run_id,
                i: int = i,
                barrier: threading.Barrier = barrier,
                outcome: list[BaseException] = outcome,
            ) -> None:
                barrier.wait(LIMIT)
                try:
                    app.update(run_id, "ping", i, update_id=f"p{i}", timeout=LIMIT)
                except perdure.PerdureError as exc:
                    outcome.append(exc)

            sender = threading.Thread(target=send)
            sender.start()
            barrier.wait(LIMIT)
            app.signal(run_id, "finish")
            sender.join(LIMIT)
            assert not sender.is_alive(), "the update's caller hangs after the run ended"
            [error] = outcome
            assert isinstance(error, perdure.UpdateAbandoned | perdure.RunFinished), error
            assert app.handle(run_id).result(timeout=LIMIT) == "finished"
            # A retry is answered as the first caller was.
            with pytest.raises(type(error)):
                app.update(run_id, "ping", i, update_id=f"p{i}")


def test_a_run_that_ends_unanswered_abandons_its_callers(app: perdure.App) -> None:
    with app.worker(**WORKER):
        run_id = app.start(live_app.ignores_updates).run_id
        parked(app, run_id)
        with pytest.raises(perdure.UpdateTimedOut):
            app.update(run_id, "ping", 1, update_id="early", timeout=0.2)
        app.signal(run_id, "finish")
        app.handle(run_id).result(timeout=LIMIT)
    with pytest.raises(perdure.UpdateAbandoned) as abandoned:
        app.update(run_id, "ping", 1, update_id="early")
    assert abandoned.value.state == "succeeded"


# -- events and streams ---------------------------------------------------------


def test_get_event_is_woken_in_another_process(app: perdure.App, store_url: str) -> None:
    with app.worker(**WORKER):
        run_id = app.start(live_app.gated, 0, 0).run_id
        parked(app, run_id)
        with pytest.raises(perdure.RunEventMissing):
            app.get_event(run_id, "gate", timeout=0)
        waiter = Caller(store_url, "get_event", run_id, "gate", LIMIT)
        assert "ready" in waiter.line()
        began = time.monotonic()
        app.signal(run_id, "go")
        assert waiter.result() == {"ok": "open"}
        # Woken, not found by the reader's slow poll (every 5 s).
        assert time.monotonic() - began < 4.0
        app.handle(run_id).result(timeout=LIMIT)
    assert app.events(run_id) == {"gate": "open"}
    assert app.get_event(run_id, "gate", timeout=0) == "open"
    assert asyncio.run(app.aget_event(run_id, "gate", 0)) == "open"
    assert asyncio.run(app.aevents(run_id)) == {"gate": "open"}
    with pytest.raises(perdure.RunEventMissing):
        app.get_event(run_id, "never", timeout=None)  # the run ended without it


def test_a_stream_read_by_processes_that_start_late(app: perdure.App, store_url: str) -> None:
    with app.worker(**WORKER):
        run_id = app.start(live_app.gated, 3, 2).run_id
        parked(app, run_id)
        reader = Caller(store_url, "read_stream", run_id, "numbers")
        assert "ready" in reader.line()
        assert [reader.line() for _ in range(3)] == [{"item": i} for i in range(3)]
        app.signal(run_id, "go")
        assert reader.result() == {"ok": [0, 1, 2, 3, 4]}
        assert app.handle(run_id).result(timeout=LIMIT) == 5
    assert Caller(store_url, "read_stream", run_id, "numbers").result() == {"ok": [0, 1, 2, 3, 4]}
    assert Caller(store_url, "read_stream", run_id, "numbers", 3).result() == {"ok": [3, 4]}
    kinds = [e.kind for e in app.store.journal(run_id)]
    assert (kinds.count("stream"), kinds.count("stream_close")) == (5, 1)


def test_a_stream_reader_stops_when_the_run_ends_without_closing(app: perdure.App) -> None:
    run_id = app.start(live_app.gated, 2, 0).run_id
    with app.worker(**WORKER):
        parked(app, run_id)
    app.cancel(run_id)
    assert list(app.read_stream(run_id, "numbers")) == [0, 1]


# -- queries --------------------------------------------------------------------


def test_queries_need_no_worker_and_write_nothing(app: perdure.App, store_url: str) -> None:
    run_id = app.start(live_app.order, "o-3").run_id
    assert app.query(run_id, "item_count") == 0
    with app.worker(**WORKER):
        for qty in (1, 2):
            app.update(run_id, "add_item", {"qty": qty}, update_id=f"q{qty}", timeout=LIMIT)
        parked(app, run_id)
    before = tables(store_url)
    expected = {
        "order_id": "o-3",
        "items": [{"qty": 1}, {"qty": 2}],
        "answers": {"q1": {"count": 1}, "q2": {"count": 2}},
        "status": "open",
        "progress": [{"items": 1}, {"items": 2}],
    }
    assert app.query(run_id, "summary") == expected
    assert asyncio.run(app.aquery(run_id, "item_count")) == 2
    assert Caller(store_url, "query", run_id, "summary").result() == {"ok": expected}
    with pytest.raises(perdure.UnknownQuery) as unknown:
        app.query(run_id, "nope")
    assert unknown.value.code == "unknown_query" and "item_count" in str(unknown.value)
    with pytest.raises(perdure.QueryFailed):
        app.query(run_id, "broken")
    assert tables(store_url) == before


# -- the command line -------------------------------------------------------------


def test_the_command_line_talks_to_a_live_run(app: perdure.App, store_url: str) -> None:
    def run_cli(*args: str) -> Any:
        return CliRunner().invoke(cli.cli, [*args, "--store", store_url])

    def with_code(*args: str) -> subprocess.CompletedProcess[str]:
        """Commands that import ``live_app`` run in a process of their own, as from a shell."""
        command = [sys.executable, "-m", "perdure", *args, "--store", store_url]
        return subprocess.run(command, cwd=HERE, capture_output=True, text=True, timeout=LIMIT)

    with app.worker(**WORKER):
        run_id = app.start(live_app.order, "o-4", 1).run_id
        parked(app, run_id)
        events = run_cli("events", run_id, "--json")
        assert (events.exit_code, json.loads(events.output)) == (0, {"status": "open"})
        rejected = with_code(
            "update", run_id, "add_item", "--payload", '{"qty": 0}', "--validate", "live_app:app"
        )
        assert rejected.returncode == 1 and "update_rejected" in rejected.stderr
        sent = run_cli(
            "update", run_id, "add_item", "--payload", '{"qty": 5}', "--update-id", "c1", "--json"
        )
        assert sent.exit_code == 0, sent.output
        assert json.loads(sent.output)["response"] == {"count": 1}
        app.handle(run_id).result(timeout=LIMIT)
    followed = run_cli("stream", run_id, "progress", "--json")
    assert (followed.exit_code, followed.output) == (0, '{"items": 1}\n')
    asked = with_code("query", "live_app:app", run_id, "item_count")
    assert (asked.returncode, asked.stdout) == (0, "1\n"), asked.stderr
    again = run_cli("update", run_id, "add_item", "--payload", "{}", "--update-id", "c1")
    assert (again.exit_code, again.output) == (0, '{"count": 1}\n')
    ended = run_cli("update", run_id, "add_item", "--payload", "{}")
    assert ended.exit_code == 1 and "run_finished" in ended.output
    unknown = with_code("query", "live_app:app", run_id, "nope")
    assert unknown.returncode == 2 and "unknown_query" in unknown.stderr
