"""The app's own schema in the store's database: migrations the application registers.

``@app.transaction`` steps write to the store's own database, in the
transaction that records their outcome; the tables they write are the
application's. :meth:`AppSchema.apply_app_migrations` creates and upgrades
them: each migration is a function of the database connection (a
``sqlite3.Connection`` or a ``psycopg.Connection``) run once per app and
version, in a transaction that also records it, so processes that start
together apply each migration once and a failed one leaves nothing behind.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar, runtime_checkable

from perdure import errors
from perdure.store import transitions

C = TypeVar("C")

Migration = Callable[[Any], object]


@runtime_checkable
class AppSchemaStore(Protocol):
    """The store's operation for the application's own schema."""

    def apply_app_migrations(
        self, app: str, migrations: Sequence[tuple[int, Migration]]
    ) -> list[int]:
        """Run the app's migrations not yet applied, in version order; return their versions."""
        ...


class AppSchema(transitions.Transitions[C]):
    """:meth:`apply_app_migrations` over the adapter's connection of a transaction."""

    @abc.abstractmethod
    def _body_connection(self, cur: C) -> Any:
        """Return the database connection of the transaction ``cur`` belongs to."""

    def _lock_app_schema(self, cur: C, app: str) -> None:
        """Serialize migrations of ``app`` across processes until the transaction ends."""

    def apply_app_migrations(
        self, app: str, migrations: Sequence[tuple[int, Migration]]
    ) -> list[int]:
        """Run each of ``migrations`` not yet recorded for ``app``, lowest version first.

        Raises:
            errors.InvalidInput: a version that is not a positive integer, or one given twice.
            Exception: whatever a migration raised; it and its record are rolled back.
        """
        versions = [version for version, _ in migrations]
        if any(type(v) is not int or v < 1 for v in versions) or len(set(versions)) != len(
            versions
        ):
            raise errors.InvalidInput(
                f"app migrations need distinct positive integer versions, got {versions}"
            )
        applied: list[int] = []
        for version, migrate in sorted(migrations, key=lambda pair: pair[0]):

            def work(cur: C, version: int = version, migrate: Migration = migrate) -> bool:
                self._lock_app_schema(cur, app)
                if self._exec(cur, "app_migration_applied", app=app, version=version).fetchone():
                    return False
                migrate(self._body_connection(cur))
                self._exec(cur, "app_migration_record", app=app, version=version)
                return True

            # The migration is the caller's code: run it once, never retried here.
            if self._transact(work, retry=False):
                applied.append(version)
        return applied
