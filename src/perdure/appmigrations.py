"""The app's own migrations: ``@app.migration`` declares them, ``app.migrate`` applies them.

:class:`Migrations` is a part of :class:`~perdure.app.App` (a base class of
it). ``@app.transaction`` steps write tables of the app's own in the store's
database; these are the versions that create and change them. The store
runs them (``perdure.store.appschema``), once per app and version.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Any, TypeVar

from perdure import errors
from perdure.store import port

M = TypeVar("M", bound=Callable[[Any], object])


class Migrations(abc.ABC):
    """The migration calls of an App."""

    # What the App supplies.
    name: str
    _migrations: dict[int, Callable[[Any], object]]

    @property
    @abc.abstractmethod
    def store(self) -> port.Store:
        """The app's store."""

    def migration(self, version: int) -> Callable[[M], M]:
        """Register ``fn(connection)``, migration ``version`` of the app's own tables.

        ``@app.transaction`` steps write to the store's database; this is how
        their tables get there. ``fn`` receives the database connection
        (``sqlite3.Connection``, or ``psycopg.Connection`` on PostgreSQL) in
        a transaction that also records the migration, and must neither
        commit nor roll back. Each version runs once per app and store, lowest
        first, when a worker starts, when a test environment opens, on
        :meth:`migrate` and on ``perdure migrate MODULE:APP``.

        Raises:
            errors.InvalidInput: ``version`` is not a positive integer, or is taken.
        """
        if type(version) is not int or version < 1:
            raise errors.InvalidInput(f"a migration version is a positive integer, got {version!r}")

        def register(fn: M) -> M:
            if version in self._migrations:
                raise errors.InvalidInput(f"app {self.name} has two migrations {version}")
            self._migrations[version] = fn
            return fn

        return register

    def migrate(self) -> list[int]:
        """Bring the store's schema and then the app's own (its migrations) up to date.

        Returns the versions of the app's migrations applied now (none if all were).

        Raises:
            errors.InvalidInput: the app has migrations and its store cannot run them.
        """
        store = self.store  # opening the store migrates perdure's own schema
        if not self._migrations:
            return []
        apply = getattr(store, "apply_app_migrations", None)
        if apply is None:
            raise errors.InvalidInput(f"the store {store.url} cannot run an app's migrations")
        applied: list[int] = apply(self.name, sorted(self._migrations.items()))
        return applied
