"""The SQLite migrations produce exactly ``schema.sql``, once, and refuse a newer schema."""

from __future__ import annotations

import multiprocessing
import re
import sqlite3
from pathlib import Path

import pytest

from perdure import errors
from perdure.store import open_store, sqlfiles
from perdure.store.sqlite import store as sqlite


def _objects(path: Path) -> list[tuple[str, str, str, str | None]]:
    """Return the database's schema objects with their SQL normalised for comparison."""
    conn = sqlite3.connect(path)
    try:
        found = conn.execute(
            "SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY type, name"
        ).fetchall()
    finally:
        conn.close()
    return [(kind, name, table, _normalise(sql)) for kind, name, table, sql in found]


def _normalise(sql: str | None) -> str | None:
    if sql is None:  # automatic indexes of PRIMARY KEY and UNIQUE constraints
        return None
    text = re.sub(r"\bIF NOT EXISTS\b", "", sql, flags=re.IGNORECASE)
    text = re.sub(r"\s+", " ", text)
    return re.sub(r"\s*([(),])\s*", r"\1", text).strip()


def _versions(path: Path) -> list[int]:
    conn = sqlite3.connect(path)
    try:
        return [row[0] for row in conn.execute("SELECT version FROM perdure_schema ORDER BY 1")]
    finally:
        conn.close()


def _migrated(path: Path) -> None:
    store = sqlite.SqliteStore(f"sqlite:///{path}")
    try:
        store.migrate()
    finally:
        store.close()


def test_migrations_produce_schema_sql(tmp_path: Path) -> None:
    migrated, reference = tmp_path / "migrated.db", tmp_path / "reference.db"
    _migrated(migrated)
    conn = sqlite3.connect(reference)
    conn.executescript(sqlfiles.schema("sqlite"))
    conn.close()

    expected = _objects(reference)
    assert {name for kind, name, _, _ in expected if kind == "table"} == {
        "perdure_schema",
        "runs",
        "journal",
        "ledger",
        "waits",
        "outcomes",
        "messages",
        "tokens",
        "updates",
        "app_migrations",
        "app_owners",
        "schedules",
        "queues",
        "tasks",
    }
    assert _objects(migrated) == expected


def test_every_migration_is_recorded(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    _migrated(path)
    assert _versions(path) == [m.version for m in sqlfiles.migrations("sqlite")]


def test_migrate_is_idempotent(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    _migrated(path)
    before = _objects(path)
    store = sqlite.SqliteStore(f"sqlite:///{path}")
    store.migrate()
    store.migrate()
    store.close()
    assert _objects(path) == before
    assert _versions(path) == [m.version for m in sqlfiles.migrations("sqlite")]


def _race(path: str, barrier: multiprocessing.synchronize.Barrier) -> None:
    # Opening races too: all three processes create the same fresh file.
    store = sqlite.SqliteStore(f"sqlite:///{path}")
    barrier.wait(timeout=60)
    store.migrate()
    store.close()


def test_racing_processes_migrate_once(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(3)
    workers = [ctx.Process(target=_race, args=(str(path), barrier), daemon=True) for _ in range(3)]
    for worker in workers:
        worker.start()
    try:
        for worker in workers:
            worker.join(timeout=60)
    finally:
        for worker in workers:
            if worker.is_alive():
                worker.kill()
                worker.join()
    assert [worker.exitcode for worker in workers] == [0, 0, 0]
    assert _versions(path) == [m.version for m in sqlfiles.migrations("sqlite")]


def _open_at_once(path: str, barrier: multiprocessing.synchronize.Barrier) -> None:
    barrier.wait(timeout=60)
    sqlite.SqliteStore(f"sqlite:///{path}").close()


def test_processes_opening_a_fresh_file_at_once_all_succeed(tmp_path: Path) -> None:
    # Switching a new file to write-ahead logging can fail at once with
    # "database is locked" while another process does the same; opening waits.
    ctx = multiprocessing.get_context("fork")
    for round_ in range(5):
        path = tmp_path / f"s{round_}.db"
        barrier = ctx.Barrier(6)
        openers = [
            ctx.Process(target=_open_at_once, args=(str(path), barrier), daemon=True)
            for _ in range(6)
        ]
        for opener in openers:
            opener.start()
        try:
            for opener in openers:
                opener.join(timeout=60)
        finally:
            for opener in openers:
                if opener.is_alive():
                    opener.kill()
                    opener.join()
        assert [opener.exitcode for opener in openers] == [0] * 6


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    _migrated(path)
    newer = sqlfiles.migrations("sqlite")[-1].version + 1
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("INSERT INTO perdure_schema (version, applied_at) VALUES (?, 0)", (newer,))
    conn.close()
    before = _objects(path)

    store = sqlite.SqliteStore(f"sqlite:///{path}")
    with pytest.raises(errors.SchemaTooNew) as caught:
        store.migrate()
    store.close()
    message = str(caught.value)
    assert f"schema version {newer}" in message
    assert f"up to {newer - 1}" in message
    assert "upgrade perdure" in message
    assert _objects(path) == before

    with pytest.raises(errors.SchemaTooNew):
        open_store(f"sqlite:///{path}")


def test_a_failing_migration_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "s.db"
    _migrated(path)
    before = _objects(path)
    known = sqlfiles.migrations("sqlite")
    broken = sqlfiles.Migration(
        known[-1].version + 1,
        f"{known[-1].version + 1:04d}_broken.sql",
        "CREATE TABLE half_done (x INTEGER);\nCREATE TABLE runs (x INTEGER);\n",
    )
    monkeypatch.setattr(sqlfiles, "migrations", lambda adapter: [*known, broken])

    store = sqlite.SqliteStore(f"sqlite:///{path}")
    with pytest.raises(sqlite3.OperationalError):
        store.migrate()
    store.close()
    assert _objects(path) == before
    assert _versions(path) == [m.version for m in known]


def test_upgrading_a_first_version_store_reaches_schema_sql(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, reference = tmp_path / "s.db", tmp_path / "reference.db"
    known = sqlfiles.migrations("sqlite")
    monkeypatch.setattr(sqlfiles, "migrations", lambda adapter: known[:1])
    store = sqlite.SqliteStore(f"sqlite:///{path}")
    store.migrate()
    store.close()
    # A run as the first version wrote it: today's queries name later columns.
    conn = sqlite3.connect(path)
    conn.execute(
        "INSERT INTO runs (run_id, app, workflow, version, state, input, key, "
        "ledger_sequence, created_at, updated_at) "
        "VALUES ('r1', 'app', 'wf', '1', 'queued', '{}', 'k', 1, 0, 0)"
    )
    conn.execute(
        "INSERT INTO ledger (run_id, sequence, kind, at, generation) "
        "VALUES ('r1', 1, 'initialized', 0, 0)"
    )
    conn.commit()
    conn.close()
    monkeypatch.setattr(sqlfiles, "migrations", lambda adapter: known)

    _migrated(path)

    conn = sqlite3.connect(reference)
    conn.executescript(sqlfiles.schema("sqlite"))
    conn.close()
    assert _objects(path) == _objects(reference)
    assert _versions(path) == [m.version for m in known]
    # The TTL column and the sweep's index came with the upgrade; the run kept its row.
    assert ("index", "runs_running", "runs") in [o[:3] for o in _objects(path)]
    store = sqlite.SqliteStore(f"sqlite:///{path}")
    try:
        run = store.get_run("r1")
        assert run is not None
        assert (run.state, run.key, run.ledger_limit) == ("queued", "k", 256)
        assert [r.kind for r in store.history("r1")] == ["initialized"]
    finally:
        store.close()
