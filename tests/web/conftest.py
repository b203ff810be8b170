"""Fixtures of the console and API tests: a served shop with runs in each state.

``shop_world`` builds the app of ``tests/web/shop.py`` on the test's store,
serves it with a worker (thread liveness) and drives four runs to where the
tests need them: ``failed`` (a step raised), ``waiting`` (on the signal
``approve``), ``needs_attention`` (a ``once`` step raised) and ``hostile``
(succeeded, inputs and key holding ``<script>``); ``nightly`` adds a plan
run that failed, with blocked tasks. ``timetable`` serves the scheduled app
of ``tests/web/timetable.py`` on a fake clock.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("starlette")
pytest.importorskip("jinja2")

sys.path.insert(0, str(Path(__file__).parent))

from shop import World, build_world, start_family, start_nightly
from timetable import Timetable, served


@pytest.fixture
def world(sqlite_url: str) -> Iterator[World]:
    yield from build_world(sqlite_url)


@pytest.fixture
def any_world(store_url: str) -> Iterator[World]:
    """The same world on each store (SQLite and PostgreSQL)."""
    yield from build_world(store_url)


@pytest.fixture
def family(world: World) -> str:
    """A run with children (and grandchildren), events, a stream, waiting for updates."""
    return start_family(world.app)


@pytest.fixture
def any_family(any_world: World) -> str:
    return start_family(any_world.app)


@pytest.fixture
def timetable(sqlite_url: str) -> Iterator[Timetable]:
    yield from served(sqlite_url)


@pytest.fixture
def any_timetable(store_url: str) -> Iterator[Timetable]:
    """The scheduled app on each store (SQLite and PostgreSQL)."""
    yield from served(store_url)


@pytest.fixture
def nightly(world: World) -> str:
    """A ``nightly`` plan run that failed: transform failed, load and publish blocked."""
    return start_nightly(world.app)
