"""Access tokens: minting, checking, and what each scope allows.

A token reads ``pdt_<id>_<secret>``. The store keeps the id, the app, the
scope and the SHA-256 of the secret, never the secret; a presented token is
found by its id and its secret compared in constant time
(:func:`hmac.compare_digest`), so the lookup reveals nothing about the secret.
Tokens are never logged: errors name the token id at most.

Scopes: ``read`` reads (and asks queries); ``operate`` reads and acts
(update, cancel, resume, resolve, fork, start, signal, send); ``signal`` only
signals and sends (webhooks).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from perdure import errors
from perdure.store import tokens

PREFIX = "pdt_"

Need = Literal["read", "signal", "operate"]
"""What a call needs: ``read`` (read-only), ``signal`` (signal or send), ``operate`` (act)."""

_GRANTS: dict[str, frozenset[str]] = {
    "read": frozenset({"read"}),
    "signal": frozenset({"signal"}),
    "operate": frozenset({"read", "signal", "operate"}),
}


def digest(secret: str) -> str:
    """Return the hex SHA-256 of a token's secret, as the store keeps it."""
    return hashlib.sha256(secret.encode()).hexdigest()


def token_store(store: object) -> tokens.TokenStore:
    """Return ``store`` as a token store, or refuse.

    Raises:
        errors.StoreError: the store has no token operations.
    """
    if not isinstance(store, tokens.TokenStore):
        raise errors.StoreError(f"the store {type(store).__name__} cannot keep access tokens")
    return store


@dataclass(frozen=True)
class Minted:
    """A new token: ``secret`` is the whole token, shown once."""

    secret: str
    token: tokens.Token


def mint(
    store: tokens.TokenStore, app: str, scope: str, expires_in: timedelta | None, now: datetime
) -> Minted:
    """Create a token for ``app`` with ``scope``, expiring ``expires_in`` after ``now``.

    Raises:
        errors.InvalidInput: an unknown scope, an empty app or a duration that is not positive.
    """
    if scope not in tokens.SCOPES:
        raise errors.InvalidInput(f"unknown scope {scope!r}; one of {', '.join(tokens.SCOPES)}")
    if not app:
        raise errors.InvalidInput("a token needs an app name")
    if expires_in is not None and expires_in <= timedelta(0):
        raise errors.InvalidInput("a token's lifetime must be positive")
    token_id = secrets.token_hex(6)
    secret = secrets.token_urlsafe(32)
    stored = store.create_token(
        tokens.NewToken(
            token_id=token_id,
            app=app,
            scope=scope,
            digest=digest(secret),
            expires_at=None if expires_in is None else now + expires_in,
        )
    )
    return Minted(f"{PREFIX}{token_id}_{secret}", stored)


_ID = re.compile(r"[0-9a-f]{1,64}")
_SECRET = re.compile(r"[A-Za-z0-9_-]{1,160}")


def _split(presented: str) -> tuple[str, str] | None:
    if not presented.startswith(PREFIX):
        return None
    token_id, sep, secret = presented[len(PREFIX) :].partition("_")
    if not sep or not token_id or not secret or len(presented) > 200:
        return None
    # What mint makes: a hex id and a URL-safe secret. Anything else (a NUL
    # that PostgreSQL would refuse, say) never reaches the store.
    if not (_ID.fullmatch(token_id) and _SECRET.fullmatch(secret)):
        return None
    return token_id, secret


def check(store: tokens.TokenStore, app: str, presented: str, now: datetime) -> tokens.Token:
    """Return the stored token ``presented`` stands for, if it may act on ``app`` at ``now``.

    Raises:
        errors.Unauthorized: malformed, unknown, wrong secret, revoked or expired.
        errors.Forbidden: a valid token of another app.
    """
    parts = _split(presented.strip())
    if parts is None:
        raise errors.Unauthorized("the access token is malformed")
    token_id, secret = parts
    found = store.get_token(token_id)
    # Compare even when the id is unknown, so both paths cost the same.
    expected = found.digest if found is not None else digest("")
    matches = hmac.compare_digest(expected, digest(secret))
    if found is None or not matches:
        raise errors.Unauthorized("the access token is not valid")
    if found.revoked_at is not None:
        raise errors.Unauthorized(f"access token {token_id} was revoked")
    if not found.usable(now):
        raise errors.Unauthorized(f"access token {token_id} has expired")
    if found.app != app:
        raise errors.Forbidden(f"access token {token_id} is for another app")
    return found


def allows(scope: str, need: Need) -> bool:
    """Whether a token of ``scope`` may make a call that needs ``need``."""
    return need in _GRANTS.get(scope, frozenset())


def require(scope: str, need: Need) -> None:
    """Refuse a call beyond the scope.

    Raises:
        errors.Forbidden: the scope does not allow it.
    """
    if not allows(scope, need):
        raise errors.Forbidden(f"a {scope} token cannot do this (it needs {need})")
