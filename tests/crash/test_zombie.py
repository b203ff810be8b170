"""A frozen worker wakes up after another took its run over: all its writes are refused.

Worker A is frozen with SIGSTOP inside a ``once`` step (its body created a
marker file, so the test knows where it is). Its lease lapses; worker B
claims the run and, finding the effect's start journaled without an outcome,
puts it in ``needs_attention``. A is then thawed and its step released: it
finishes the body and tries to record the outcome, which the generation fence
refuses. The run's row, journal and ledger must be exactly as B left them.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from perdure import Client, codec
from perdure.store import port

LEASE_TTL = 1.5
HEARTBEAT = 0.5
LIMIT = 20.0


def wait_for(check: Callable[[], Any], what: str, timeout: float = LIMIT) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


def effects(env: dict[str, str]) -> list[str]:
    path = Path(env["CRASH_EFFECTS_LOG"])
    return path.read_text().split() if path.exists() else []


def store_is_quiet(url: str) -> bool:
    """Return whether no transaction is open on the store (a frozen one would block others)."""
    if url.startswith("sqlite:"):
        from perdure.store.sqlite.connection import database_path

        conn = sqlite3.connect(database_path(url), timeout=0.2, isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("ROLLBACK")
            return True
        except sqlite3.OperationalError:
            return False
        finally:
            conn.close()
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid() AND state IN ('active', 'idle in transaction')"
        ).fetchone()
    return row is not None and row[0] == 0


def freeze(pid: int, url: str) -> None:
    """SIGSTOP ``pid`` at a moment it holds no open transaction on the store."""
    for _ in range(100):
        os.kill(pid, signal.SIGSTOP)
        if store_is_quiet(url):
            return
        os.kill(pid, signal.SIGCONT)  # caught mid-transaction: let it commit, try again
        time.sleep(0.01)
    raise AssertionError("could not freeze the worker outside a transaction")


@pytest.mark.slow
def test_a_thawed_zombie_worker_writes_nothing(
    store_url: str,
    store: port.Store,
    workers: Any,
    crash_env: dict[str, str],
    tmp_path: Path,
) -> None:
    entered = tmp_path / "entered"
    release = tmp_path / "release"
    markers = {"ZOMBIE_ENTERED": str(entered), "ZOMBIE_RELEASE": str(release)}
    client = Client(store, "crash")
    run_id = client.start("zombie_flow", "1", [5]).run_id

    zombie = workers.start(
        "zombie", via_cli=False, lease_ttl=LEASE_TTL, heartbeat=HEARTBEAT, **markers
    )
    wait_for(entered.exists, "worker A to enter the once step")
    assert entered.read_text() == str(zombie.pid)
    freeze(zombie.pid, store_url)
    try:
        held = store.get_run(run_id)
        assert held is not None
        assert (held.state, held.generation) == ("running", 1)
        assert [(e.name, e.status) for e in store.journal(run_id)] == [
            ("s1", "ok"),
            ("blocker", "started"),
        ]

        rescuer = workers.start(
            "rescuer", via_cli=False, lease_ttl=LEASE_TTL, heartbeat=HEARTBEAT, **markers
        )
        run: port.Run = wait_for(
            lambda: (
                (r := store.get_run(run_id)) is not None and r.state in port.TERMINAL_STATES and r
            ),
            "worker B to take the run over and settle it",
        )
        assert workers.stop(rescuer) == 0, workers.log("rescuer")
        assert run.state == "needs_attention", (run.error, workers.log("rescuer"))
        error = codec.decode(run.error or "{}")
        assert (error["code"], error["step"]) == ("effect_outcome_unknown", "blocker")
        assert run.generation == 2

        row = store.get_run(run_id)
        journal = store.journal(run_id)
        ledger = store.history(run_id)
        assert [(e.name, e.status) for e in journal] == [("s1", "ok"), ("blocker", "started")]
        assert "recovered" in [r.kind for r in ledger]
        assert effects(crash_env) == ["s1"]
    finally:
        os.kill(zombie.pid, signal.SIGCONT)
        release.touch()

    # A finishes the body (its effect happens: that is what needs_attention warns of)
    # and tries to record the outcome; the fence refuses and A says so.
    wait_for(
        lambda: "claim is stale" in workers.log("zombie"),
        "worker A to learn that its claim is stale",
    )
    assert workers.stop(zombie) == 0, workers.log("zombie")

    assert store.get_run(run_id) == row
    assert store.journal(run_id) == journal
    assert store.history(run_id) == ledger
    assert effects(crash_env) == ["s1", "blocker"]
