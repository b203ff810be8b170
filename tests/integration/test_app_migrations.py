"""The app's own tables in the store's database: @app.migration, on both stores."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

import perdure
from perdure.testing import Environment


def _rows(store_url: str, sql: str) -> list[tuple[Any, ...]]:
    if store_url.startswith("sqlite"):
        import sqlite3

        conn = sqlite3.connect(store_url[len("sqlite:///") :])
        try:
            return [tuple(r) for r in conn.execute(sql).fetchall()]
        finally:
            conn.close()
    import psycopg

    with psycopg.connect(store_url) as conn:
        return [tuple(r) for r in conn.execute(sql).fetchall()]


def build(store_url: str, name: str, log: Path | None = None, fail: bool = False) -> perdure.App:
    app = perdure.App(store_url, name=name)

    def note(version: int) -> None:
        if log is not None:
            fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            os.write(fd, f"{version} {os.getpid()}\n".encode())
            os.close(fd)

    @app.migration(1)
    def bookings(conn: Any) -> None:
        note(1)
        conn.execute("CREATE TABLE bookings (order_id TEXT PRIMARY KEY, seats INTEGER)")

    @app.migration(2)
    def notes(conn: Any) -> None:
        note(2)
        conn.execute("ALTER TABLE bookings ADD COLUMN note TEXT")
        if fail:
            raise RuntimeError("migration 2 is broken")

    @app.transaction()
    def book(conn: Any, order_id: str, seats: int) -> int:
        mark = "?" if store_url.startswith("sqlite") else "%s"
        conn.execute(
            f"INSERT INTO bookings (order_id, seats, note) VALUES ({mark}, {mark}, 'ok')",
            (order_id, seats),
        )
        return seats

    @app.workflow()
    def reserve(ctx: perdure.Context, order_id: str) -> int:
        return book(order_id, 2)

    return app


def test_migrations_create_the_tables_transaction_steps_write(store_url: str) -> None:
    app = build(store_url, f"am_{uuid.uuid4().hex[:8]}")
    with Environment(app, store=store_url) as env:  # opening applies them
        handle = env.start("reserve", "o-1")
        env.run_until_idle()
        assert handle.result(timeout=5) == 2
        assert app.migrate() == []  # all applied already
    assert _rows(store_url, "SELECT order_id, seats, note FROM bookings") == [("o-1", 2, "ok")]
    app.close()


def test_a_failing_migration_leaves_nothing_and_is_retried_later(store_url: str) -> None:
    name = f"am_{uuid.uuid4().hex[:8]}"
    broken = build(store_url, name, fail=True)
    with pytest.raises(RuntimeError, match="broken"):
        broken.migrate()
    broken.close()
    # Migration 1 stays applied; 2 was rolled back with its ALTER TABLE.
    assert [c for c in _columns(store_url) if c == "note"] == []
    fixed = build(store_url, name)
    assert fixed.migrate() == [2]
    assert "note" in _columns(store_url)
    fixed.close()


def _columns(store_url: str) -> list[str]:
    if store_url.startswith("sqlite"):
        return [r[1] for r in _rows(store_url, "PRAGMA table_info(bookings)")]
    return [
        r[0]
        for r in _rows(
            store_url,
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'bookings'",
        )
    ]


def _migrate_in_child(store_url: str, name: str, log: str, barrier: Any) -> None:
    app = build(store_url, name, Path(log))
    _ = app.store
    barrier.wait(timeout=30)
    app.migrate()
    app.close()


def test_processes_that_migrate_together_apply_each_migration_once(
    store_url: str, tmp_path: Path
) -> None:
    name, log = f"am_{uuid.uuid4().hex[:8]}", tmp_path / "applied.log"
    first = perdure.App(store_url, name=name)
    first.migrate()  # perdure's own schema first
    first.close()
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(3)
    args = (store_url, name, str(log), barrier)
    procs = [ctx.Process(target=_migrate_in_child, args=args, daemon=True) for _ in range(3)]
    for proc in procs:
        proc.start()
    try:
        for proc in procs:
            proc.join(60)
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
    assert [p.exitcode for p in procs] == [0, 0, 0]
    assert sorted(line.split()[0] for line in log.read_text().splitlines()) == ["1", "2"]


def test_versions_are_checked(store_url: str) -> None:
    app = perdure.App(store_url, name="am_bad")
    with pytest.raises(perdure.InvalidInput):
        app.migration(0)
    app.migration(1)(lambda conn: None)
    with pytest.raises(perdure.InvalidInput, match="two migrations"):
        app.migration(1)(lambda conn: None)
    app.close()


def test_perdure_migrate_applies_a_modules_app_migrations(store_url: str, tmp_path: Path) -> None:
    (tmp_path / "bookings_app.py").write_text(
        "import perdure\n"
        "app = perdure.App(name='am_cli')\n"
        "@app.migration(1)\n"
        "def bookings(conn):\n"
        "    conn.execute('CREATE TABLE cli_bookings (order_id TEXT PRIMARY KEY)')\n"
    )
    command = [sys.executable, "-m", "perdure", "migrate", "bookings_app:app"]
    command += ["--store", store_url, "--json"]
    first = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["app_migrations_applied"] == [1]
    again = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert json.loads(again.stdout)["app_migrations_applied"] == []
    assert _rows(store_url, "SELECT count(*) FROM cli_bookings") == [(0,)]
