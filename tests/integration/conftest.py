"""Fixtures of the engine's integration tests (store URLs come from tests/conftest.py)."""

from __future__ import annotations

import importlib.util
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import perdure


def skip_unless_adapter(url: str) -> None:
    """Skip a PostgreSQL parametrization while its adapter module does not exist."""
    if (
        url.startswith(("postgresql:", "postgres:"))
        and importlib.util.find_spec("perdure.store.postgres") is None
    ):
        pytest.skip("perdure.store.postgres does not exist yet")


@pytest.fixture
def make_app(store_url: str) -> Iterator[Callable[..., perdure.App]]:
    """Return a factory of Apps on this test's store; every App is closed afterwards."""
    skip_unless_adapter(store_url)
    made: list[perdure.App] = []

    def make(name: str | None = None, **options: Any) -> perdure.App:
        app = perdure.App(store_url, name=name or f"it_{uuid.uuid4().hex[:8]}", **options)
        made.append(app)
        return app

    yield make
    for app in made:
        app.close()
