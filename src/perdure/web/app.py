"""The ASGI application of the console and the HTTP API, and who is asking.

:func:`create_app` builds one Starlette application for one perdure app: the
API under ``/api/v1`` (:mod:`perdure.web.api`), the console pages
(:mod:`perdure.web.pages`) and their static files. Every request names its
caller through :meth:`Console.caller`: a bearer token (``Authorization:
Bearer``), the console's session cookie (pages only), or, when the server was
started open on the loopback interface and the app has no usable token, the
local operator.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from importlib import resources
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import Mount
from starlette.staticfiles import StaticFiles

from perdure import app as app_api
from perdure import client as client_api
from perdure import errors, reads
from perdure.store import tokens
from perdure.web import api, auth, pages

SESSION_COOKIE = "perdure_session"


_LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})


def _loopback_host(request: Request) -> bool:
    """Whether the request names this machine in its Host header.

    An open console answers only such requests, so that a web page whose
    domain is made to resolve to 127.0.0.1 (DNS rebinding) is not served.
    """
    host = request.headers.get("host", "")
    name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
    return name.lower() in _LOOPBACK_HOSTS


@dataclass(frozen=True)
class Caller:
    """Who makes a request: the scope granted and how it was proven."""

    scope: str
    token_id: str | None
    via: str  # "bearer", "cookie" or "open"


class Console:
    """What every request handler of one served app shares."""

    def __init__(
        self, client: client_api.Client, *, app: app_api.App | None, open_local: bool
    ) -> None:
        self.client = client
        self.reads = reads.Reads(client)
        self.tokens: tokens.TokenStore = auth.token_store(client.store)
        self.app = app
        self.open_local = open_local
        # Signs the forms' anti-forgery fields; a restart invalidates open forms.
        self._key = secrets.token_bytes(32)

    @property
    def name(self) -> str:
        return self.client.app

    def is_open(self) -> bool:
        """Whether requests without a token act as the local operator right now."""
        return self.open_local and not self.tokens.has_tokens(self.name)

    def check_token(self, presented: str) -> Caller:
        """Return the caller a token proves.

        Raises:
            errors.Unauthorized, errors.Forbidden: see :func:`auth.check`.
        """
        found = auth.check(self.tokens, self.name, presented, self.client.store.now())
        return Caller(found.scope, found.token_id, "bearer")

    def caller(self, request: Request, *, cookie: bool) -> Caller:
        """Return who makes ``request``.

        Raises:
            errors.Unauthorized: no usable token, and the console is not open.
            errors.Forbidden: a token of another app.
        """
        header = request.headers.get("authorization", "")
        if header:
            kind, _, value = header.partition(" ")
            if kind.lower() != "bearer" or not value.strip():
                raise errors.Unauthorized("the Authorization header must be 'Bearer <token>'")
            return self.check_token(value)
        if cookie and request.cookies.get(SESSION_COOKIE):
            found = self.check_token(request.cookies[SESSION_COOKIE])
            return Caller(found.scope, found.token_id, "cookie")
        if self.is_open() and _loopback_host(request):
            return Caller("operate", None, "open")
        raise errors.Unauthorized(
            "an access token is needed (Authorization: Bearer <token>); "
            "create one with: perdure tokens create --app " + self.name + " --scope read"
        )

    def form_key(self, request: Request) -> str:
        """Return the anti-forgery value the console's forms carry for this browser."""
        basis = request.cookies.get(SESSION_COOKIE) or "open"
        return hmac.new(self._key, basis.encode(), hashlib.sha256).hexdigest()

    def check_form_key(self, request: Request, given: str) -> None:
        """Refuse a form that was not served by this console to this browser.

        Raises:
            errors.Forbidden: the anti-forgery field is missing or wrong.
        """
        if not hmac.compare_digest(self.form_key(request), given):
            raise errors.Forbidden("the form has expired or did not come from this console")


def create_app(
    client: client_api.Client, *, app: app_api.App | None = None, open_local: bool = False
) -> Starlette:
    """Return the ASGI application serving ``client``'s app.

    ``app`` (optional) lets ``POST /runs`` check arguments against the
    workflows' code; without it a start names the workflow's version.
    ``open_local``: with no usable token for the app, requests without a token
    are served as the local operator; only for a server bound to loopback.
    """
    console = Console(client, app=app, open_local=open_local)
    static = resources.files("perdure.web").joinpath("static")
    routes: list[Any] = [
        Mount("/api/v1", routes=api.routes(console)),
        Mount("/static", app=StaticFiles(directory=str(static)), name="static"),
        *pages.routes(console),
    ]
    web = Starlette(routes=routes)
    web.state.console = console
    return web
