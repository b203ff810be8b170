"""The port's read-only views for operators, written once over named queries.

:class:`Overview` answers ``apps`` and ``timers`` (see :class:`port.Store`)
for every SQL adapter, the way :mod:`perdure.store.transitions` answers the
transitions: an adapter supplies ``_exec``, ``_transact`` and ``read``.
Nothing here writes.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from perdure.store import port, rows

C = TypeVar("C")
T = TypeVar("T")


class Overview(abc.ABC, Generic[C]):
    """The views across a store's apps and runs; ``C`` is the adapter's cursor."""

    read: rows.Reader

    @abc.abstractmethod
    def _exec(self, cur: C, query: str, **params: Any) -> Any:
        """Execute a named query; ``now`` is always passed."""

    @abc.abstractmethod
    def _transact(self, work: Callable[[C], T], *, retry: bool = True, single: bool = False) -> T:
        """Run ``work`` in one transaction (or, when ``single``, as one statement)."""

    def apps(self) -> list[str]:
        """Return the names of the apps that have runs in the store, sorted."""
        found = self._transact(lambda cur: self._exec(cur, "apps").fetchall(), single=True)
        return [str(row["app"]) for row in found]

    def timers(self, app: str, run_id: str | None = None) -> list[port.Timer]:
        """Return the app's sleeping runs and queued runs held back, earliest first."""
        found = self._transact(
            lambda cur: self._exec(cur, "timers", app=app, run_id=run_id).fetchall(), single=True
        )
        timers = []
        for row in found:
            run = self.read.run(row)
            assert run.ready_at is not None  # the query selects runs with one
            kind: port.TimerKind = "sleep" if run.state == "waiting" else "timer"
            timers.append(port.Timer(run.run_id, run.app, kind, run.ready_at, run.workflow))
        return timers
