"""A worker process dies in every window around a step's effect; a clean worker recovers.

The app is ``effects_app`` (its docstring maps each window to the exact point
the process dies). For each effect class the windows are: (a) before the
effect is recorded as started, (b) after it is recorded but before the body
ran, (c) after the body but before the outcome is recorded, (d) after the
outcome is recorded. What the design promises (DESIGN.md §2, guarantee 3):

* a ``once`` effect is never repeated, and the run is parked in
  ``needs_attention`` (``effect_outcome_unknown``, naming the step and the
  attempt) exactly when the effect may have escaped: from the moment its
  start is journaled until its outcome is (b and c; the engine cannot know
  that the body of b never ran);
* an ``idempotent`` step is run again, with the same idempotency key;
* a ``pure`` step is simply run again.

A transactional step dies inside its transaction (after its INSERT, before the
commit) and right after the commit: its table rows and its journal entry are
both present or both absent. Everything runs on SQLite and PostgreSQL.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import perdure
from perdure import Client, codec, journal
from perdure.store import port

HERE = Path(__file__).resolve().parent
APP = "effects"
EXIT_STATUS = 137
# The crashing worker's lease decides how soon the recovering worker may take
# the run over, so it is kept short; the recovering worker uses the usual timing.
CRASHING_TIMING = {"EFFECT_LEASE_TTL": "1", "EFFECT_HEARTBEAT": "0.3", "EFFECT_POLL": "0.1"}
RECOVERING_TIMING = {"EFFECT_LEASE_TTL": "2", "EFFECT_HEARTBEAT": "0.5", "EFFECT_POLL": "0.2"}
DEATH_LIMIT = 20.0
RECOVERY_LIMIT = 20.0

WORK = {"pure": "pure_work", "idempotent": "idempotent_work", "once": "once_work"}
WINDOWS = ("before_start", "started", "body_done", "recorded")


# -- processes ------------------------------------------------------------------------


class Processes:
    """Worker processes of ``effects_app``; every one still alive is killed at teardown."""

    def __init__(self, env: dict[str, str], logs: Path) -> None:
        self.env = env
        self.logs = logs
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, name: str, **extra_env: str) -> subprocess.Popen[bytes]:
        env = {
            k: v for k, v in self.env.items() if not k.startswith(("EFFECT_CRASH", "EFFECT_REFUSE"))
        }
        env.update(extra_env)
        with open(self.logs / f"{name}.log", "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-c", "import effects_app; effects_app.serve()"],
                cwd=HERE,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.procs.append(proc)
        return proc

    def log(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text(errors="replace")

    def stop(self, proc: subprocess.Popen[bytes], timeout: float = 10.0) -> int:
        if proc.poll() is None:
            proc.terminate()
            try:
                return proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
        return proc.wait(timeout=timeout)

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)


@pytest.fixture
def procs(crash_env: dict[str, str], tmp_path: Path) -> Iterator[Processes]:
    started = Processes(crash_env, tmp_path)
    yield started
    started.close()


def wait_for(check: Callable[[], Any], what: str, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


def crash(procs: Processes, spec: str, **extra_env: str) -> None:
    """Run a worker with the failpoint ``spec`` armed; wait (bounded) for it to die there."""
    proc = procs.start("crashing", EFFECT_CRASH_AT=spec, **CRASHING_TIMING, **extra_env)
    try:
        status = proc.wait(timeout=DEATH_LIMIT)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the worker never reached {spec}:\n{procs.log('crashing')}") from None
    assert status == EXIT_STATUS, procs.log("crashing")


def recover(procs: Processes, store: port.Store, run_id: str) -> port.Run:
    """Run a clean worker until the run ends; stop it gracefully."""
    proc = procs.start("recovering", **RECOVERING_TIMING)
    try:
        run: port.Run = wait_for(
            lambda: (
                (r := store.get_run(run_id)) is not None and r.state in port.TERMINAL_STATES and r
            ),
            f"run {run_id} to end",
            RECOVERY_LIMIT,
        )
    finally:
        status = procs.stop(proc)
    assert status == 0, procs.log("recovering")
    return run


def effect_log(env: dict[str, str]) -> list[tuple[str, str, str, str]]:
    """Return the effects log as (event, step, idempotency key, nonce) tuples."""
    path = Path(env["CRASH_EFFECTS_LOG"])
    if not path.exists():
        return []
    lines = [tuple(line.split(" ")) for line in path.read_text().splitlines()]
    assert all(len(line) == 4 for line in lines), lines
    return lines  # type: ignore[return-value]


def events(log: list[tuple[str, str, str, str]], event: str, step: str) -> list[tuple[str, str]]:
    """Return (key, nonce) of every ``event`` line of ``step``, in order."""
    return [(key, nonce) for e, s, key, nonce in log if (e, s) == (event, step)]


def shape(entries: list[port.JournalEntry]) -> list[tuple[int, str, str, str, int]]:
    return [(e.position, e.kind, e.name, e.status, e.attempt) for e in entries]


def nonce_of(output: str | None) -> str:
    text = codec.decode(output or "null")
    assert isinstance(text, str), text
    return text.rsplit(":", 1)[1]


# -- plain steps: every window of every effect class ------------------------------------------


def expected_at_crash(effect: str, window: str) -> dict[str, Any]:
    """What the store and the effects log hold when the worker died in ``window``."""
    work = WORK[effect]
    once = effect == "once"
    started = [(2, "step", work, "started", 1)]
    journal = {
        "before_start": [],
        "started": started if once else [],
        "body_done": started if once else [],
        "recorded": [(2, "step", work, "ok", 1)],
    }[window]
    enters = {"before_start": 0, "started": 0 if once else 1, "body_done": 1, "recorded": 1}
    done = {"before_start": 0, "started": 0, "body_done": 1, "recorded": 1}
    return {
        "journal": [(1, "step", "prepare", "ok", 1), *journal],
        "enters": enters[window],
        "effects": done[window],
    }


@pytest.mark.slow
@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("effect", ["pure", "idempotent", "once"])
def test_a_worker_dying_in_an_effect_window(
    effect: str,
    window: str,
    store: port.Store,
    procs: Processes,
    crash_env: dict[str, str],
) -> None:
    work = WORK[effect]
    run_id = Client(store, APP).start(f"{effect}_flow", "1", [7]).run_id
    key = f"{run_id}/{work}"
    crash(procs, f"{work}:{window}")

    # -- what the dead worker left behind
    expected = expected_at_crash(effect, window)
    crashed = store.get_run(run_id)
    assert crashed is not None
    assert (crashed.state, crashed.generation) == ("running", 1)
    at_crash = store.journal(run_id)
    assert shape(at_crash) == expected["journal"]
    log = effect_log(crash_env)
    assert len(events(log, "enter", "prepare")) == len(events(log, "effect", "prepare")) == 1
    assert [k for k, _ in events(log, "enter", work)] == [key] * expected["enters"]
    assert [k for k, _ in events(log, "effect", work)] == [key] * expected["effects"]
    assert events(log, "enter", "confirm") == []
    history = [r.kind for r in store.history(run_id)]
    assert history.count("effect_started") == (
        1 if effect == "once" and window != "before_start" else 0
    )

    # -- a clean worker takes the run over
    run = recover(procs, store, run_id)
    final = store.journal(run_id)
    after = effect_log(crash_env)
    history = [r.kind for r in store.history(run_id)]
    assert history.count("recovered") == 1
    assert history.count("claimed") == 1
    assert run.generation == 2

    if effect == "once" and window in ("started", "body_done"):
        # The effect may have escaped: parked, never repeated, nothing after it ran.
        assert run.state == "needs_attention", (run.error, procs.log("recovering"))
        error = codec.decode(run.error or "{}")
        assert error["code"] == "effect_outcome_unknown"
        assert error["step"] == work
        assert error["attempt"] == 1
        assert work in error["message"] and "attempt 1" in error["message"]
        assert final == at_crash
        assert after == log
        assert history.count("effect_started") == 1
        assert history[-1] == "finished"
        return

    assert run.state == "succeeded", (run.error, procs.log("recovering"))
    assert shape(final) == [
        (1, "step", "prepare", "ok", 1),
        (2, "step", work, "ok", 1),
        (3, "step", "confirm", "ok", 1),
    ]
    assert final[0] == at_crash[0]  # a recorded outcome is replayed, never rewritten
    result = codec.decode(run.result or "null")
    assert result[0] == codec.decode(at_crash[0].output or "null")
    assert len(events(after, "enter", "prepare")) == 1  # never re-ran
    assert len(events(after, "enter", "confirm")) == len(events(after, "effect", "confirm")) == 1

    entered = events(after, "enter", work)
    done = events(after, "effect", work)
    if window == "recorded":
        # The outcome was stored before the crash: the body is not run again.
        assert final[1] == at_crash[1]
        assert (len(entered), len(done)) == (1, 1)
        assert result[1] == codec.decode(at_crash[1].output or "null")
    elif window == "body_done":
        assert effect != "once"
        # The effect happened, its outcome was lost: the step runs again (same key).
        assert (len(entered), len(done)) == (2, 2)
        assert {k for k, _ in done} == {key}
        assert result[1] == f"{work}:7:{done[-1][1]}"  # the outcome of the second execution
    elif window == "started":
        assert effect != "once"
        assert (len(entered), len(done)) == (2, 1)
        assert {k for k, _ in entered} == {key}
        assert result[1] == f"{work}:7:{done[0][1]}"
    else:  # before_start: nothing of the step had happened; it runs once
        assert (len(entered), len(done)) == (1, 1)
        assert done[0][0] == key
        assert result[1] == f"{work}:7:{done[0][1]}"
    if effect == "once":
        assert history.count("effect_started") == 1
    assert history[-1] == "finished"


# -- a once step whose first attempt certainly failed -------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("window", ["before_start", "started"])
def test_a_once_step_dying_in_its_retry_after_effect_failed(
    window: str,
    store: port.Store,
    procs: Processes,
    crash_env: dict[str, str],
) -> None:
    """Attempt 1 raises EffectFailed (it certainly did not happen); the worker dies at attempt 2."""
    run_id = Client(store, APP).start("once_flow", "1", [4]).run_id
    crash(procs, f"once_work:{window}:2", EFFECT_REFUSE_FIRST="once_work")

    at_crash = store.journal(run_id)
    log = effect_log(crash_env)
    assert len(events(log, "refused", "once_work")) == 1
    assert events(log, "effect", "once_work") == []
    if window == "before_start":
        # Attempt 1 is recorded as not having happened; attempt 2 has not started.
        assert shape(at_crash) == [
            (1, "step", "prepare", "ok", 1),
            (2, "step", "once_work", "started", 1),
        ]
        assert codec.decode(at_crash[1].error or "{}")["code"] == "effect_failed"
    else:
        assert shape(at_crash) == [
            (1, "step", "prepare", "ok", 1),
            (2, "step", "once_work", "started", 2),
        ]
        # Attempt 2's effect is in flight (unsettled); the entry keeps attempt 1's failure.
        assert journal.unsettled(at_crash[1])
        assert [(a.attempt, a.code) for a in journal.failed_attempts(at_crash[1])] == [
            (1, "effect_failed")
        ]

    run = recover(procs, store, run_id)
    after = effect_log(crash_env)
    if window == "before_start":
        # The recorded "did not happen" lets the next worker carry on with attempt 2.
        assert run.state == "succeeded", (run.error, procs.log("recovering"))
        final = store.journal(run_id)
        assert shape(final) == [
            (1, "step", "prepare", "ok", 1),
            (2, "step", "once_work", "ok", 2),
            (3, "step", "confirm", "ok", 1),
        ]
        assert len(events(after, "enter", "once_work")) == 2
        done = events(after, "effect", "once_work")
        assert len(done) == 1
        assert codec.decode(run.result or "null")[1] == f"once_work:4:{done[0][1]}"
    else:
        assert run.state == "needs_attention", (run.error, procs.log("recovering"))
        error = codec.decode(run.error or "{}")
        assert (error["code"], error["step"], error["attempt"]) == (
            "effect_outcome_unknown",
            "once_work",
            2,
        )
        assert store.journal(run_id) == at_crash
        assert after == log


# -- transactional steps ---------------------------------------------------------------


def _database(url: str) -> Any:
    if url.startswith("sqlite:"):
        from perdure.store.sqlite.connection import database_path

        return sqlite3.connect(database_path(url), timeout=10)
    import psycopg

    return psycopg.connect(url, autocommit=True)


def create_bookings(url: str) -> None:
    conn = _database(url)
    try:
        conn.execute("CREATE TABLE bookings (n INTEGER NOT NULL, nonce TEXT NOT NULL)")
        conn.commit()
    finally:
        conn.close()


def bookings(url: str) -> list[tuple[int, str]]:
    conn = _database(url)
    try:
        return [tuple(row) for row in conn.execute("SELECT n, nonce FROM bookings").fetchall()]
    finally:
        conn.close()


@pytest.mark.slow
@pytest.mark.parametrize("window", ["before_commit", "after_commit"])
def test_a_transactional_step_commits_its_rows_and_its_entry_together(
    window: str,
    store_url: str,
    store: port.Store,
    procs: Processes,
    crash_env: dict[str, str],
) -> None:
    create_bookings(store_url)
    run_id = Client(store, APP).start("tx_flow", "1", [9]).run_id
    crash(procs, f"book:{window}")

    at_crash = store.journal(run_id)
    rows = bookings(store_url)
    entered = events(effect_log(crash_env), "enter", "book")
    assert len(entered) == 1  # the body ran once, its INSERT executed
    if window == "before_commit":
        assert rows == []
        assert shape(at_crash) == [(1, "step", "prepare", "ok", 1)]
    else:
        assert rows == [(9, entered[0][1])]
        assert shape(at_crash) == [(1, "step", "prepare", "ok", 1), (2, "step", "book", "ok", 1)]
        assert nonce_of(at_crash[1].output) == entered[0][1]

    run = recover(procs, store, run_id)
    assert run.state == "succeeded", (run.error, procs.log("recovering"))
    final = store.journal(run_id)
    assert shape(final) == [
        (1, "step", "prepare", "ok", 1),
        (2, "step", "book", "ok", 1),
        (3, "step", "confirm", "ok", 1),
    ]
    entered = events(effect_log(crash_env), "enter", "book")
    rows = bookings(store_url)
    # Exactly one booking, the one whose outcome the journal holds.
    assert len(rows) == 1
    assert rows == [(9, nonce_of(final[1].output))]
    assert codec.decode(run.result or "null")[1] == f"book:9:{rows[0][1]}"
    if window == "before_commit":
        assert len(entered) == 2  # the rolled-back attempt ran again
        assert rows[0][1] == entered[1][1]
    else:
        assert len(entered) == 1  # committed: replayed, not run again
        assert final[1] == at_crash[1]
    assert Counter(r.kind for r in store.history(run_id))["recovered"] == 1


def test_a_transactional_step_that_raises_stores_no_rows_and_fails(
    store_url: str, store: port.Store
) -> None:
    """In process: the body's INSERT is rolled back with it, and the step fails like any other."""
    app = perdure.App(store_url, name="tx_raises")
    entered: list[int] = []

    @app.transaction()
    def book_badly(conn: Any, n: int) -> str:
        entered.append(n)
        marker = "?" if isinstance(conn, sqlite3.Connection) else "%s"
        conn.execute(f"INSERT INTO bookings (n, nonce) VALUES ({marker}, 'x')", (n,))
        raise ValueError("the booking breaks a business rule")

    @app.workflow()
    def booking(ctx: perdure.Context, n: int) -> str:
        return book_badly(n)  # type: ignore[call-arg]  # the connection is the engine's

    create_bookings(store_url)
    try:
        with app.worker(concurrency=1, lease_ttl=2, heartbeat=0.5, poll_interval=0.2):
            run_id = app.start(booking, 5).run_id
            # Settled (ended) or given back after a failed attempt: either shows what happened.
            info = wait_for(
                lambda: (
                    ((i := app.get(run_id)).done or (i.failures > 0 and i.state == "queued")) and i
                ),
                "the step's failure to be settled",
                RECOVERY_LIMIT,
            )
        assert bookings(store_url) == []
        assert info.state == "failed", (info.state, info.error, info.failures)
        assert info.error is not None
        assert (info.error["code"], info.error["step"]) == ("step_failed", "book_badly")
        assert "business rule" in info.error["message"]
        assert shape(store.journal(run_id)) == [(1, "step", "book_badly", "error", 1)]
        assert entered == [5]
    finally:
        app.close()
