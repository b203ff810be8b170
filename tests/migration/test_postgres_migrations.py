"""The PostgreSQL migrations build schema.sql, run once however many processes race, and
refuse a schema newer than the code."""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

import pg  # tests/pg.py, on the path through tests/conftest.py
from perdure import errors
from perdure.store import open_store, port, sqlfiles
from perdure.store.postgres import store as postgres

pytestmark = pytest.mark.postgres


@pytest.fixture
def other_db_url(postgres_server: str) -> Iterator[str]:
    """A second throwaway database, for the reference schema."""
    url = pg.create_database()
    yield url
    pg.drop_database(url)


_CATALOG = {
    "columns": """
        SELECT table_name, ordinal_position, column_name, data_type, is_nullable,
               column_default
        FROM information_schema.columns WHERE table_schema = 'perdure'
        ORDER BY table_name, ordinal_position
    """,
    "indexes": """
        SELECT tablename, indexname, indexdef FROM pg_indexes
        WHERE schemaname = 'perdure' ORDER BY tablename, indexname
    """,
    "constraints": """
        SELECT c.conrelid::regclass::text, c.conname, c.contype, pg_get_constraintdef(c.oid)
        FROM pg_constraint AS c JOIN pg_namespace AS n ON n.oid = c.connamespace
        WHERE n.nspname = 'perdure' ORDER BY 1, 2
    """,
    "functions": """
        SELECT p.proname, pg_get_function_identity_arguments(p.oid), p.prosrc, p.proconfig
        FROM pg_proc AS p
        JOIN pg_namespace AS n ON n.oid = p.pronamespace
        WHERE n.nspname = 'perdure' ORDER BY 1
    """,
    "relations": """
        SELECT c.relname, c.relkind FROM pg_class AS c
        JOIN pg_namespace AS n ON n.oid = c.relnamespace
        WHERE n.nspname = 'perdure' ORDER BY 1
    """,
}


def _catalog(url: str) -> dict[str, list[tuple[Any, ...]]]:
    with psycopg.connect(url) as conn:
        return {name: conn.execute(query).fetchall() for name, query in _CATALOG.items()}


def _versions(url: str) -> list[int]:
    with psycopg.connect(url) as conn:
        found = conn.execute("SELECT version FROM perdure.schema_version ORDER BY version")
        return [row[0] for row in found.fetchall()]


def test_migrations_build_the_reference_schema(postgres_url: str, other_db_url: str) -> None:
    store = postgres.PostgresStore(postgres_url)
    try:
        store.migrate()
    finally:
        store.close()
    with psycopg.connect(other_db_url, autocommit=True) as conn:
        conn.execute(sqlfiles.schema("postgres"))

    migrated, reference = _catalog(postgres_url), _catalog(other_db_url)

    assert migrated["columns"], "the migrations created no columns"
    for part in _CATALOG:
        assert migrated[part] == reference[part], part
    assert _versions(postgres_url) == [m.version for m in sqlfiles.migrations("postgres")]


def test_migrate_is_idempotent_and_keeps_data(postgres_url: str) -> None:
    store = postgres.PostgresStore(postgres_url)
    try:
        store.migrate()
        run, _ = store.create_run(port.NewRun("r1", "app", "wf", "1", "{}", key="k"))
        store.migrate()
        store.migrate()
        assert store.get_run("r1") == run
    finally:
        store.close()
    assert _versions(postgres_url) == [m.version for m in sqlfiles.migrations("postgres")]


def test_tables_live_in_their_own_schema(postgres_url: str) -> None:
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE public.runs (id int PRIMARY KEY, note text)")
        conn.execute("INSERT INTO public.runs VALUES (1, 'the user''s own')")
    store = open_store(postgres_url)
    try:
        store.create_run(port.NewRun("r1", "app", "wf", "1", "{}"))
    finally:
        store.close()
    with psycopg.connect(postgres_url) as conn:
        assert conn.execute("SELECT note FROM public.runs").fetchall() == [("the user's own",)]


def _migrate_after_barrier(url: str, barrier: Any, results: Any) -> None:
    """Child process: open a store, wait for the other child, then migrate."""
    try:
        store = postgres.PostgresStore(url)
        try:
            barrier.wait(timeout=30)
            store.migrate()
        finally:
            store.close()
        results.put("ok")
    except BaseException as exc:
        results.put(f"{type(exc).__name__}: {exc}")


def test_two_processes_migrating_a_fresh_database_both_succeed(postgres_url: str) -> None:
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    results = ctx.Queue()
    children = [
        ctx.Process(target=_migrate_after_barrier, args=(postgres_url, barrier, results))
        for _ in range(2)
    ]
    for child in children:
        child.start()
    try:
        outcomes = [results.get(timeout=60) for _ in children]
    finally:
        for child in children:
            child.join(timeout=30)
            if child.is_alive():
                child.kill()

    assert outcomes == ["ok", "ok"]
    assert _versions(postgres_url) == [m.version for m in sqlfiles.migrations("postgres")]


def test_a_newer_schema_is_refused(postgres_url: str) -> None:
    store = postgres.PostgresStore(postgres_url)
    try:
        store.migrate()
    finally:
        store.close()
    latest = sqlfiles.migrations("postgres")[-1].version
    newer = latest + 1
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("INSERT INTO perdure.schema_version (version) VALUES (%s)", (newer,))

    with pytest.raises(errors.SchemaTooNew) as refused:
        open_store(postgres_url)

    assert str(refused.value) == (
        f"the store's schema is version {newer} but this perdure knows up to {latest}; "
        "upgrade perdure"
    )
    assert _versions(postgres_url) == [*(m.version for m in sqlfiles.migrations("postgres")), newer]


def test_upgrading_a_first_version_store_builds_the_reference_schema(
    postgres_url: str, other_db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    known = sqlfiles.migrations("postgres")
    monkeypatch.setattr(sqlfiles, "migrations", lambda adapter: known[:1])
    store = postgres.PostgresStore(postgres_url)
    try:
        store.migrate()
        # A run as the first version wrote it: today's queries name later columns.
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO perdure.runs (run_id, app, workflow, version, state, input, key, "
                "ledger_sequence, created_at, updated_at) "
                "VALUES ('r1', 'app', 'wf', '1', 'queued', '{}', 'k', 1, now(), now())"
            )
            conn.execute(
                "INSERT INTO perdure.ledger (run_id, sequence, kind, at, generation) "
                "VALUES ('r1', 1, 'initialized', now(), 0)"
            )
        monkeypatch.setattr(sqlfiles, "migrations", lambda adapter: known)
        store.migrate()
        run = store.get_run("r1")
        assert run is not None
        assert (run.state, run.key, run.ledger_limit) == ("queued", "k", 256)
        assert [r.kind for r in store.history("r1")] == ["initialized"]
    finally:
        store.close()
    with psycopg.connect(other_db_url, autocommit=True) as conn:
        conn.execute(sqlfiles.schema("postgres"))

    migrated, reference = _catalog(postgres_url), _catalog(other_db_url)
    for part in _CATALOG:
        assert migrated[part] == reference[part], part
    assert ("runs", "lease_ttl") in [(c[0], c[2]) for c in migrated["columns"]]
    assert _versions(postgres_url) == [m.version for m in known]
