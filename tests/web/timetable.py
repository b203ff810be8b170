"""An app with schedules for the console's tests, on a fake clock.

``reports`` has two schedules: ``morning_report`` at 06:00 Europe/Berlin
(the tick is its argument) and ``cleanup_eu`` at a quarter past every hour
(``cleanup("eu", 30)``). :func:`served` opens it in a test environment
that starts on 2030-01-01 00:00 UTC, lets two hours pass (so ``cleanup_eu``
has ticked twice) and yields it with a helper for tokens and HTTP clients.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from starlette.testclient import TestClient

import perdure
from perdure import schedules
from perdure.testing import Environment
from perdure.web import app as web_app
from perdure.web import auth

START = datetime(2030, 1, 1, tzinfo=UTC)
BERLIN = "Europe/Berlin"


def build(name: str = "reports") -> perdure.App:
    app = perdure.App(name=name)

    @app.schedule("0 6 * * *", tz=BERLIN)
    @app.workflow(version="1")
    def morning_report(ctx: perdure.Context, tick: datetime) -> str:
        return tick.isoformat()

    @app.workflow(version="1")
    def cleanup(ctx: perdure.Context, region: str, days: int) -> str:
        return f"{region}:{days}"

    app.schedule("15 * * * *", cleanup, "eu", 30, name="cleanup_eu")
    return app


@dataclass
class Timetable:
    app: perdure.App
    env: Environment

    def token(self, scope: str, app: str | None = None) -> str:
        store = auth.token_store(self.app.store)
        return auth.mint(store, app or self.app.name, scope, None, self.app.store.now()).secret

    def client(self, *, code: bool = True) -> TestClient:
        """An HTTP client of the console: served with the app's code, or from the store alone."""
        asgi = web_app.create_app(self.app.client, app=self.app if code else None)
        return TestClient(asgi, base_url="http://127.0.0.1:8025")

    def paused(self, name: str) -> bool:
        """Whether the store holds the schedule as paused."""
        [found] = [s for s in schedules.listing(self.app.store, self.app.name) if s.name == name]
        return found.paused

    def runs_of(self, name: str) -> list[perdure.RunInfo]:
        """The runs the schedule started, by their key."""
        prefix = f"schedule:{name}:"
        return [r for r in self.app.runs(limit=1000) if (r.key or "").startswith(prefix)]


def served(
    store_url: str, *, advance: timedelta | None = timedelta(hours=2)
) -> Iterator[Timetable]:
    """Yield the app in its environment; ``advance=None``: nothing runs, nothing is stored."""
    app = build()
    with Environment(app, store=store_url, start=START) as env:
        if advance is not None:
            env.advance(advance)
        yield Timetable(app, env)
