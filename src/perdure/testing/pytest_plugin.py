"""The pytest plugin perdure installs: a ``perdure_env`` fixture.

pytest loads it by itself once perdure is installed (the ``pytest11`` entry
point). Tell it which app to test in one of two ways::

    # conftest.py: for every test that asks for perdure_env
    import pytest
    from shop import app

    @pytest.fixture
    def perdure_app():
        return app

    # or on one test (or a module, with pytestmark), overriding the fixture
    @pytest.mark.perdure_app(app)
    def test_checkout(perdure_env):
        handle = perdure_env.start(checkout, "o-1")
        perdure_env.run_until_idle()

``perdure_env`` is a :class:`perdure.testing.Environment` on a temporary
SQLite store; ``@pytest.mark.perdure_app(app, store="postgresql://...")``
or a ``perdure_store`` fixture returning a URL puts it on that database.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from perdure import app as app_api
from perdure.testing import environment

MARK = "perdure_app"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARK}(app, store=None): the perdure.App (and optionally the PostgreSQL URL) "
        "that the perdure_env fixture tests",
    )


@pytest.fixture
def perdure_app(request: pytest.FixtureRequest) -> app_api.App:
    """The app ``perdure_env`` tests: override this fixture, or mark the test."""
    marker = request.node.get_closest_marker(MARK)
    if marker is None or not marker.args:
        raise pytest.UsageError(
            "perdure_env needs the app to test: define a `perdure_app` fixture that returns "
            f"it, or mark the test with @pytest.mark.{MARK}(app)"
        )
    app = marker.args[0]
    if not isinstance(app, app_api.App):
        raise pytest.UsageError(
            f"@pytest.mark.{MARK} takes a perdure.App, got {type(app).__name__}"
        )
    return app


@pytest.fixture
def perdure_store(request: pytest.FixtureRequest) -> str | None:
    """The database ``perdure_env`` uses: None for a temporary SQLite file."""
    marker = request.node.get_closest_marker(MARK)
    store = marker.kwargs.get("store") if marker is not None else None
    return str(store) if store is not None else None


@pytest.fixture
def perdure_env(
    request: pytest.FixtureRequest, perdure_store: str | None
) -> Iterator[environment.Environment]:
    """An :class:`~perdure.testing.Environment` for the test's app, closed afterwards."""
    marker = request.node.get_closest_marker(MARK)
    # A mark on the test wins over a perdure_app fixture defined further up.
    app = (
        request.getfixturevalue("perdure_app")
        if marker is None or not marker.args
        else marker.args[0]
    )
    if not isinstance(app, app_api.App):
        raise pytest.UsageError(f"perdure_app must be a perdure.App, got {type(app).__name__}")
    with environment.Environment(app, store=perdure_store) as env:
        yield env
