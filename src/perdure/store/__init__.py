"""Open a store from its URL: the one module that names the adapters."""

from __future__ import annotations

import os
from urllib.parse import urlsplit

from perdure import errors
from perdure.store import port

DEFAULT_URL = "sqlite:///perdure.db"
DEFAULT_LEDGER_LIMIT = 256


def default_url() -> str:
    """Return ``$PERDURE_STORE``, else the embedded default."""
    return os.environ.get("PERDURE_STORE") or DEFAULT_URL


def open_store(
    url: str | None = None,
    *,
    clock: port.Clock | None = None,
    ledger_limit: int = DEFAULT_LEDGER_LIMIT,
    migrate: bool = True,
    create: bool = True,
) -> port.Store:
    """Open (and by default migrate) the store named by ``url``.

    ``sqlite:///relative.db``, ``sqlite:////abs/path.db``, ``sqlite://:memory:``
    is refused (a store must outlive its process), and ``postgresql://...``
    (or ``postgres://``) needs the ``postgres`` extra. With ``create=False`` a
    SQLite file that does not exist is refused rather than created (what a
    command that only reads or steers existing runs wants).

    Raises:
        errors.InvalidStoreURL: the URL names no usable store.
        errors.StoreUnavailable: the store cannot be reached.
    """
    url = url or default_url()
    if ledger_limit < 1:
        raise errors.InvalidInput(f"ledger_limit must be at least 1, got {ledger_limit}")
    scheme = urlsplit(url).scheme if "://" in url else ""
    store: port.Store
    if scheme == "sqlite":
        from perdure.store.sqlite import store as sqlite_store

        store = sqlite_store.SqliteStore(url, clock=clock, ledger_limit=ledger_limit, create=create)
    elif scheme in ("postgresql", "postgres"):
        try:
            from perdure.store.postgres import store as postgres_store
        except ImportError as exc:
            raise errors.InvalidStoreURL(
                "a postgresql:// store needs the postgres extra: pip install 'perdure[postgres]'"
            ) from exc
        store = postgres_store.PostgresStore(url, clock=clock, ledger_limit=ledger_limit)
    else:
        raise errors.InvalidStoreURL(
            f"unsupported store URL {url!r}: use sqlite:///path.db or postgresql://..."
        )
    if migrate:
        try:
            store.migrate()
        except BaseException:
            store.close()
            raise
    return store
