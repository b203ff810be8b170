"""Throwaway PostgreSQL databases for the tests of the shared store.

The server is named by ``$PERDURE_TEST_POSTGRES`` (default: the local
``postgres`` database, trust authentication). Each test gets a database of its
own, created on that server and dropped afterwards, so tests never see each
other's runs and may run in parallel.
"""

from __future__ import annotations

import os
import uuid
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

DEFAULT_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"


def admin_url() -> str:
    """Return the URL of the server's maintenance database."""
    return os.environ.get("PERDURE_TEST_POSTGRES") or DEFAULT_ADMIN_URL


def server_available() -> bool:
    """Return whether the test server accepts connections now."""
    try:
        psycopg.connect(admin_url(), connect_timeout=3).close()
    except psycopg.Error:
        return False
    return True


def require_server() -> None:
    """Skip the calling test when there is no server; fail instead when ``CI=true``."""
    if server_available():
        return
    message = f"no PostgreSQL server at {urlsplit(admin_url()).hostname} ($PERDURE_TEST_POSTGRES)"
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


def url_of(database: str) -> str:
    """Return the URL of ``database`` on the test server."""
    parts = urlsplit(admin_url())
    return urlunsplit(parts._replace(path=f"/{database}"))


def create_database() -> str:
    """Create an empty, uniquely named database; return its URL."""
    name = f"perdure_test_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(admin_url(), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return url_of(name)


def drop_database(url: str) -> None:
    """Drop the database named by ``url``, ending any session still connected to it."""
    name = urlsplit(url).path.lstrip("/")
    if not name.startswith("perdure_test_"):
        raise ValueError(f"refusing to drop {name!r}: not a test database")
    with psycopg.connect(admin_url(), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
