"""The access-token section of the store port: records and the operations on them.

An access token lets an outside caller (the HTTP API, the console) act on one
app's runs within a scope. The store keeps only a digest of its secret; the
secret itself is shown once, when the token is created, and never stored.

Every adapter that serves the console implements :class:`TokenStore` next to
:class:`perdure.store.port.Store`; the conformance suite's ``TokenTests``
hold the contract.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal, Protocol, runtime_checkable

Scope = Literal["read", "operate", "signal"]
SCOPES: tuple[Scope, ...] = ("read", "operate", "signal")
"""``read`` reads; ``operate`` reads and acts; ``signal`` only signals and sends."""


@dataclass(frozen=True)
class NewToken:
    """A token to store: ``digest`` is the hex SHA-256 of its secret."""

    token_id: str
    app: str
    scope: Scope
    digest: str
    expires_at: datetime | None = None


@dataclass(frozen=True)
class Token:
    """A stored token. ``revoked_at`` is set once, by ``revoke_token``."""

    token_id: str
    app: str
    scope: Scope
    digest: str
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None

    def usable(self, now: datetime) -> bool:
        """Whether the token may be used at ``now``: not revoked, not expired."""
        return self.revoked_at is None and (self.expires_at is None or now < self.expires_at)


@runtime_checkable
class TokenStore(Protocol):
    """The store's token operations, each one atomic transaction."""

    def create_token(self, new: NewToken) -> Token:
        """Store a new token; its ``created_at`` is the store's clock.

        Raises:
            errors.InvalidInput: a token with this id exists.
        """
        ...

    def get_token(self, token_id: str) -> Token | None:
        """Return the token (revoked and expired ones too), or None."""
        ...

    def list_tokens(self, app: str | None = None) -> list[Token]:
        """Return the tokens (of ``app``, or of every app), oldest first."""
        ...

    def revoke_token(self, token_id: str) -> Token | None:
        """Mark the token revoked at the store's clock (a second revoke keeps the first
        instant); return it, or None if no token has this id."""
        ...

    def has_tokens(self, app: str) -> bool:
        """Whether ``app`` has a token that is neither revoked nor expired."""
        ...
