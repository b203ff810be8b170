"""Fixtures shared by every test suite: store URLs for SQLite and PostgreSQL.

* ``sqlite_url``: a SQLite store file in the test's ``tmp_path``.
* ``postgres_url``: a PostgreSQL database created for the test (by
  ``tests/pg.py``) on the server named by ``$PERDURE_TEST_POSTGRES`` (default
  ``postgresql://postgres@127.0.0.1:5432/postgres``) and dropped after it, even
  if sessions are still connected. When the server cannot be reached the test
  is skipped, unless ``CI=true``: then it fails, so that CI never passes by
  skipping PostgreSQL.
* ``store_url``: parametrized over ``sqlite`` and ``postgres``; a test that
  takes it runs once on each store. ``pytest --store sqlite`` (or
  ``postgres``) keeps one of them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

# The conformance suite lives in the package; let pytest explain its failed asserts
# (registering the package covers every module in it).
pytest.register_assert_rewrite("perdure.testing.conformance")

STORES = ("sqlite", "postgres")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--store",
        action="store",
        default="all",
        choices=("all", *STORES),
        help="run store-parametrized tests on this store only (default: all)",
    )


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Kill child processes a failed test left behind.

    At exit multiprocessing joins every child that is not a daemon; one stuck
    at a barrier would hold the whole run until CI's time bound.
    """
    import multiprocessing

    for child in multiprocessing.active_children():
        child.kill()
        child.join(5)


def _selected(config: pytest.Config, kind: str) -> bool:
    chosen = config.getoption("--store")
    return chosen in ("all", kind)


# -- SQLite -------------------------------------------------------------------


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """Return the URL of a SQLite store file that does not exist yet."""
    return f"sqlite:///{tmp_path / 'perdure.db'}"


# -- PostgreSQL (tests/pg.py owns the server and database handling) -------------


@pytest.fixture(scope="session")
def postgres_server() -> str:
    """Return the admin URL of a reachable PostgreSQL server, or skip (fail on CI)."""
    import pg  # tests/pg.py; imported here so that SQLite-only runs need no psycopg

    pg.require_server()
    return pg.admin_url()


@pytest.fixture
def postgres_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """Create an empty database for the test; drop it afterwards (even if connected)."""
    if not _selected(request.config, "postgres"):
        pytest.skip("--store excludes postgres")
    request.getfixturevalue("postgres_server")
    import pg

    url = pg.create_database()
    try:
        yield url
    finally:
        pg.drop_database(url)


# -- both ---------------------------------------------------------------------


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest) -> str:
    """Return a fresh store URL of each kind in turn (``--store`` narrows it)."""
    kind = str(request.param)
    if not _selected(request.config, kind):
        pytest.skip(f"--store excludes {kind}")
    return str(request.getfixturevalue(f"{kind}_url"))
