"""The store's census of an app, for metrics: runs by state, and the most overdue timer.

Written once over the named query ``census`` for every SQL adapter, apart from
:mod:`perdure.store.transitions` because it reads and never transitions.
"""

from __future__ import annotations

from datetime import datetime
from typing import TypeVar

from perdure.store import port, rows, transitions

C = TypeVar("C")


class Census(transitions.Transitions[C]):
    """:meth:`port.Store.census` over the adapter's ``census`` query."""

    def census(self, app: str) -> port.Census:
        """Count the app's runs by state; find the earliest due ``ready_at`` of a waiting run."""
        found = self._transact(
            lambda cur: self._exec(cur, "census", app=app).fetchall(), single=True
        )
        states: dict[str, int] = {}
        due: list[datetime] = []
        for row in found:
            if row["state"] is None:
                continue  # the app has no runs
            if row["state"] not in port.RUN_STATES:
                raise rows.corrupt(None, "run_state", f"a run of {app} is {row['state']!r}")
            states[row["state"]] = int(row["n"])
            if row["oldest_due"] is not None:
                due.append(self.read.instant(row, "oldest_due"))
        at = self.read.instant(found[0], "at")
        return port.Census(states, min(due) if due else None, at)
