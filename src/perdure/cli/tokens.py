"""``perdure tokens create|list|revoke``: the access tokens of the console and the HTTP API."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import click

from perdure import errors
from perdure.cli import common, output
from perdure.store import tokens as token_port
from perdure.web import auth

_DURATION = re.compile(r"^(\d+)([smhdw])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


class Duration(click.ParamType):  # type: ignore[type-arg]
    """A duration like ``90m``, ``12h``, ``30d`` or ``2w``."""

    name = "DURATION"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, timedelta):
            return value
        match = _DURATION.match(str(value).strip())
        if not match or int(match.group(1)) == 0:
            self.fail(f"expected a positive duration like 90m, 12h, 30d or 2w, got {value!r}")
        return timedelta(**{_UNITS[match.group(2)]: int(match.group(1))})


def _doc(token: token_port.Token) -> dict[str, Any]:
    return {
        "id": token.token_id,
        "app": token.app,
        "scope": token.scope,
        "created_at": token.created_at,
        "expires_at": token.expires_at,
        "revoked_at": token.revoked_at,
    }


@click.group()
def tokens() -> None:
    """Create, list and revoke the access tokens of the console and the HTTP API.

    Scopes: read (reads), operate (reads and acts), signal (only signals and
    sends, for webhooks). The store keeps a digest of each token, never the
    token: it is printed once, by create.
    """


@tokens.command()
@click.option("--app", "app_name", required=True, metavar="NAME", help="The app it opens.")
@click.option(
    "--scope", type=click.Choice(token_port.SCOPES), required=True, help="What it may do."
)
@click.option("--expires", type=Duration(), default=None, help="Lifetime (90m, 12h, 30d, 2w).")
@common.options
def create(
    app_name: str, scope: str, expires: timedelta | None, store_url: str | None, as_json: bool
) -> None:
    """Create a token and print it (the only time it is shown)."""
    with common.opened(store_url) as store:
        held = auth.token_store(store)
        minted = auth.mint(held, app_name, scope, expires, store.now())
    token = minted.token
    if as_json:
        output.emit_json(
            {"token": minted.secret, "id": token.token_id, "app": token.app, "scope": token.scope,
             "expires_at": token.expires_at}
        )  # fmt: skip
        return
    click.echo(minted.secret)
    lifetime = f", expires {output.when(token.expires_at)}" if token.expires_at else ""
    click.echo(
        f"token {token.token_id} for app {token.app}, scope {token.scope}{lifetime}; "
        "it is shown only now",
        err=True,
    )


@tokens.command(name="list")
@click.option("--app", "app_name", default=None, metavar="NAME", help="Only this app's tokens.")
@common.options
def list_(app_name: str | None, store_url: str | None, as_json: bool) -> None:
    """List the tokens (never their secrets)."""
    with common.opened(store_url) as store:
        found = auth.token_store(store).list_tokens(app_name)
        now = store.now()
    if as_json:
        output.emit_json([_doc(t) for t in found])
        return
    if not found:
        click.echo("no tokens")
        return

    def status(t: token_port.Token) -> str:
        if t.revoked_at is not None:
            return "revoked"
        return "usable" if t.usable(now) else "expired"

    rows = [
        [
            t.token_id,
            t.app,
            t.scope,
            status(t),
            output.when(t.created_at),
            output.when(t.expires_at),
        ]
        for t in found
    ]
    output.echo_lines(output.table(["ID", "APP", "SCOPE", "STATUS", "CREATED", "EXPIRES"], rows))


@tokens.command()
@click.argument("token_id", metavar="ID")
@common.options
def revoke(token_id: str, store_url: str | None, as_json: bool) -> None:
    """Revoke a token: it stops working at once."""
    with common.opened(store_url) as store:
        found = auth.token_store(store).revoke_token(token_id)
    if found is None:
        raise errors.TokenNotFound(f"no access token has id {token_id!r}")
    if as_json:
        output.emit_json(_doc(found))
    else:
        click.echo(f"token {found.token_id} of app {found.app} revoked")
