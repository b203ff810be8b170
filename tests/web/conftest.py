"""Fixtures of the console and API tests: a served shop with runs in each state.

``shop_world`` builds the app of ``tests/web/shop.py`` on the test's store,
serves it with a worker (thread liveness) and drives four runs to where the
tests need them: ``failed`` (a step raised), ``waiting`` (on the signal
``approve``), ``needs_attention`` (a ``once`` step raised) and ``hostile``
(succeeded, inputs and key holding ``<script>``).
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest

pytest.importorskip("starlette")
pytest.importorskip("jinja2")

sys.path.insert(0, str(Path(__file__).parent))

import shop  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402

import perdure  # noqa: E402
from perdure.store import port  # noqa: E402
from perdure.web import app as web_app  # noqa: E402
from perdure.web import auth  # noqa: E402


@dataclass
class World:
    app: perdure.App
    failed: str
    waiting: str
    attention: str
    hostile: str

    @property
    def store(self) -> port.Store:
        return self.app.store

    def token(self, scope: str, app: str | None = None, expires: timedelta | None = None) -> str:
        held = auth.token_store(self.store)
        return auth.mint(held, app or self.app.name, scope, expires, self.store.now()).secret

    def client(self, *, open_local: bool = False) -> TestClient:
        return TestClient(web_app.create_app(self.app.client, app=self.app, open_local=open_local))


def build_world(url: str) -> Iterator[World]:
    app = shop.build(url, name=f"shop_{uuid.uuid4().hex[:6]}")
    worker = app.worker(concurrency=4, liveness="thread", lease_ttl=3, heartbeat=1)
    worker.start()
    try:
        ids = [
            app.start("checkout", "o-1").run_id,
            app.start("approval", "o-2", key="order-2").run_id,
            app.start("fulfil", "o-3").run_id,
            app.start("hostile", "<script>alert(1)</script>", key="<script>k</script>").run_id,
        ]
        shop.settle(app, ids)
        assert [app.get(r).state for r in ids] == [
            "failed",
            "waiting",
            "needs_attention",
            "succeeded",
        ]
        yield World(app, *ids)
    finally:
        worker.stop(timeout=10)
        app.close()


@pytest.fixture
def world(sqlite_url: str) -> Iterator[World]:
    yield from build_world(sqlite_url)


@pytest.fixture
def any_world(store_url: str) -> Iterator[World]:
    """The same world on each store (SQLite and PostgreSQL)."""
    yield from build_world(store_url)
