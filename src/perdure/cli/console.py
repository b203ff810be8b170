"""``perdure console``: serve the console and the HTTP API of one app.

Needs the ``web`` extra (``pip install 'perdure[web]'``). With ``MODULE:APP``
the server knows the workflows' code (``POST /runs`` checks arguments); with
``--store URL --app NAME`` it needs none. When the app has no usable token the
console listens on loopback only and serves the local operator without one.
"""

from __future__ import annotations

import contextlib
import ipaddress
import sys
from typing import Any

import click

from perdure import errors
from perdure.cli import common, output

_LOOPBACK_NAMES = {"localhost"}


def is_loopback(host: str) -> bool:
    """Whether ``host`` names only this machine."""
    if host in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _web() -> tuple[Any, Any]:
    try:
        import uvicorn

        from perdure.web import app as web_app
    except ImportError as exc:
        raise errors.InvalidInput(
            f"the console needs the web extra ({exc.name or exc} is missing): "
            "pip install 'perdure[web]'"
        ) from None
    return uvicorn, web_app


@click.command()
@click.argument("target", metavar="[MODULE:APP]", required=False)
@click.option("--app", "app_name", default=None, metavar="NAME", help="The app (without code).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to listen on.")
@click.option("--port", type=click.IntRange(0, 65535), default=8025, show_default=True)
@common.options
def console(
    target: str | None,
    app_name: str | None,
    host: str,
    port: int,
    store_url: str | None,
    as_json: bool,
) -> None:
    """Serve the web console and the HTTP API (/api/v1) of an app.

    Give MODULE:APP, or --store URL --app NAME to serve an app without its code.
    """
    uvicorn, web_app = _web()
    if (target is None) == (app_name is None):
        raise errors.InvalidInput("give MODULE:APP or --app NAME (with --store URL), not both")
    with contextlib.ExitStack() as stack:
        served_app = None
        if target is not None:
            served_app = common.load_app(target)
            stack.callback(served_app.close)
            if store_url:
                served_app.use_store(store_url)
            store = served_app.store
            client = served_app.client
        else:
            store = stack.enter_context(common.opened(store_url))
            client = common.client(store, str(app_name))
        from perdure.web import auth

        guarded = auth.token_store(store).has_tokens(client.app)
        loopback = is_loopback(host)
        if not guarded and not loopback:
            raise errors.InvalidInput(
                f"app {client.app} has no access token, so the console listens on 127.0.0.1 "
                f"only, not {host}; create one first: perdure tokens create --app {client.app} "
                "--scope operate"
            )
        asgi = web_app.create_app(client, app=served_app, open_local=loopback)
        where = f"http://{host}:{port}/"
        about = {"app": client.app, "url": where, "store": output.redact(store.url),
                 "tokens": guarded}  # fmt: skip
        if as_json:
            click.echo(output.compact(about))
        else:
            click.echo(f"perdure console for app {client.app} at {where} (API: {where}api/v1)")
            if not guarded:
                click.echo(
                    f"no access token exists for app {client.app}: listening on loopback only, "
                    "open to anyone on this machine until a token is created "
                    f"(perdure tokens create --app {client.app} --scope operate)"
                )
        sys.stdout.flush()
        uvicorn.run(asgi, host=host, port=port, log_level="warning", access_log=False)
