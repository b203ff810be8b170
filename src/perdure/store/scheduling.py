"""The schedules section's store operations, written once over named queries.

:class:`ScheduleTransitions` adds :mod:`perdure.store.scheduleport` to an SQL
adapter; each operation is one transaction over the queries ``docs/store.md``
lists under "Schedules".
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TypeVar

from perdure import errors
from perdure.store import scheduleport, transitions

C = TypeVar("C")


def _aware(name: str, when: datetime | None) -> None:
    if when is not None and (when.tzinfo is None or when.utcoffset() is None):
        raise errors.InvalidInput(f"{name} must be an aware datetime")


class ScheduleTransitions(transitions.Transitions[C]):
    """Schedule rows, shared by the SQL adapters."""

    def save_schedules(
        self, app: str, specs: Sequence[scheduleport.ScheduleSpec]
    ) -> list[scheduleport.ScheduleRecord]:
        """Create or update the app's schedules (see :class:`scheduleport.ScheduleStore`).

        Raises:
            errors.InvalidInput: a spec's ``catch_up`` is not one the store can hold.
        """
        for spec in specs:
            if spec.catch_up not in scheduleport.CATCH_UPS:
                raise errors.InvalidInput(f"unknown catch_up {spec.catch_up!r}")

        def work(cur: C) -> list[scheduleport.ScheduleRecord]:
            saved = []
            for spec in specs:
                row = self._exec(cur, "save_schedule", app=app, **vars(spec)).fetchone()
                saved.append(self.read.schedule(row))
            return saved

        return self._transact(work) if specs else []

    def list_schedules(self, app: str | None = None) -> list[scheduleport.ScheduleRecord]:
        """Return the schedules of ``app`` (or of every app), by app and name."""
        found = self._transact(
            lambda cur: self._exec(cur, "list_schedules", app=app).fetchall(), single=True
        )
        return [self.read.schedule(r) for r in found]

    def settle_schedule(
        self, app: str, name: str, through: datetime, tick: datetime | None, run_id: str | None
    ) -> None:
        """Move the schedule's settled instant forward (see :class:`scheduleport.ScheduleStore`).

        Raises:
            errors.InvalidInput: a naive ``through`` or ``tick``.
        """
        _aware("through", through)
        _aware("tick", tick)
        params = {"app": app, "name": name, "through": through, "tick": tick, "run_id": run_id}
        self._transact(lambda cur: self._exec(cur, "settle_schedule", **params))

    def pause_schedule(
        self, app: str, name: str, paused: bool
    ) -> scheduleport.ScheduleRecord | None:
        """Pause or resume the schedule; None when it is unknown."""
        row = self._transact(
            lambda cur: self._exec(
                cur, "pause_schedule", app=app, name=name, paused=paused
            ).fetchone()
        )
        return None if row is None else self.read.schedule(row)
