"""The app's schedules: declaring them, and the calls that list and steer them.

:class:`Timetable` is a part of :class:`~perdure.app.App` (a base class of
it), kept apart so that the app's module holds the registry of workflows and
steps and this one the schedules (``docs/schedules.md``).
"""

from __future__ import annotations

import abc
import re
from collections.abc import Callable
from typing import Any, TypeVar, cast, overload

from perdure import client as client_api
from perdure import errors, records, registry, schedules
from perdure.store import port, scheduleport

W = TypeVar("W", bound=registry.Workflow[Any, Any])
# As the app spells a workflow name.
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]{0,127}$")


class Timetable(abc.ABC):
    """The schedule calls of an App."""

    # What the App supplies.
    name: str
    _workflows: dict[str, registry.WorkflowDef]
    _schedules: dict[str, schedules.Schedule]

    @property
    @abc.abstractmethod
    def store(self) -> port.Store:
        """The app's store."""

    @property
    @abc.abstractmethod
    def client(self) -> client_api.Client:
        """The app's client."""

    @abc.abstractmethod
    def workflow_ref(self, workflow: Any) -> tuple[str, str, Any]:
        """Return (name, version, return hint) for a workflow function or name."""

    @overload
    def schedule(
        self,
        cron: str,
        /,
        *,
        tz: str = "UTC",
        catch_up: scheduleport.CatchUp = "latest",
        name: str | None = None,
    ) -> Callable[[W], W]: ...

    @overload
    def schedule(
        self,
        cron: str,
        workflow: registry.Workflow[Any, Any] | str,
        /,
        *args: Any,
        tz: str = "UTC",
        catch_up: scheduleport.CatchUp = "latest",
        name: str | None = None,
    ) -> schedules.Schedule: ...

    def schedule(
        self,
        cron: str,
        workflow: registry.Workflow[Any, Any] | str | None = None,
        /,
        *args: Any,
        tz: str = "UTC",
        catch_up: str = "latest",
        name: str | None = None,
    ) -> Any:
        """Start a run of a workflow at every tick of ``cron`` (read in ``tz``); one run per tick.

        Stacked above ``@app.workflow`` it passes the tick (an aware UTC
        datetime) as the workflow's one argument; ``app.schedule(cron, wf,
        *args)`` starts ``wf(*args)`` instead. ``catch_up`` says which ticks
        missed while no worker ran are started: ``"none"``, ``"latest"`` or
        ``"all"`` (``docs/schedules.md``).

        Raises:
            errors.InvalidInput: bad cron text, time zone or catch_up, a
                schedule name used twice, or arguments that do not fit.
        """
        schedules.check(cron, tz, catch_up)
        if name is not None and (not isinstance(name, str) or not _NAME.match(name)):
            raise errors.InvalidInput(f"schedule name {name!r} must be a short identifier")

        def declare(target: Any, fixed: tuple[Any, ...], tick_arg: bool) -> schedules.Schedule:
            wf_name, _, _ = self.workflow_ref(target)
            wf = self._workflows[wf_name]
            label = name or wf_name
            if label in self._schedules:
                raise errors.InvalidInput(f"schedule {label!r} is declared twice")
            if tick_arg and len(wf.params) != 1:
                raise errors.InvalidInput(
                    f"workflow {wf_name} takes {len(wf.params)} arguments after its context; "
                    "a schedule stacked on it passes one, the tick (or use "
                    "app.schedule(cron, workflow, *args))"
                )
            if not tick_arg:
                registry.check_arguments(wf, fixed, {})
            declared = schedules.Schedule(
                label, wf_name, cron, tz, cast(scheduleport.CatchUp, catch_up), fixed, tick_arg
            )
            self._schedules[label] = declared
            return declared

        if workflow is not None:
            return declare(workflow, args, False)

        def stack(target: W) -> W:
            if not isinstance(target, registry.Workflow):
                raise errors.InvalidInput(
                    "@app.schedule goes above @app.workflow (it schedules a registered workflow)"
                )
            declare(target, (), True)
            return target

        return stack

    def schedule_specs(self) -> list[scheduleport.ScheduleSpec]:
        """Return the declared schedules as the store keeps them."""
        return [s.spec(self._workflows[s.workflow].version) for s in self._schedules.values()]

    def _stored(self, name: str) -> None:
        """Save the declared schedules if ``name`` is one not yet in the store."""
        # Saving keeps a stored row's state; it only adds what no worker saved yet.
        if name in self._schedules:
            schedules.save(self.store, self.name, self.schedule_specs())

    def schedules(self) -> list[records.ScheduleInfo]:
        """Return the app's schedules: the stored ones, and declared ones no worker served yet."""
        found = schedules.listing(self.store, self.name)
        stored = {s.name for s in found}
        now = self.store.now()
        for declared in self._schedules.values():
            if declared.name not in stored:
                upcoming = schedules.next_tick(declared.cron, declared.tz, now)
                found.append(
                    records.ScheduleInfo(
                        self.name,
                        declared.name,
                        declared.workflow,
                        declared.cron,
                        declared.tz,
                        declared.catch_up,
                        False,
                        None,
                        None,
                        upcoming,
                    )
                )
        return sorted(found, key=lambda s: s.name)

    def pause_schedule(self, name: str) -> records.ScheduleInfo:
        """Stop starting the schedule's ticks until it is resumed (every worker, every host)."""
        self._stored(name)
        return schedules.info(schedules.pause(self.store, self.name, name, True), self.store.now())

    def resume_schedule(self, name: str) -> records.ScheduleInfo:
        """Start the schedule's ticks again; ticks passed while paused are skipped."""
        self._stored(name)
        return schedules.info(schedules.pause(self.store, self.name, name, False), self.store.now())

    def trigger_schedule(self, name: str) -> client_api.RunHandle[Any]:
        """Start one run of the schedule now, with this instant as its tick (each call, a run)."""
        self._stored(name)
        run = schedules.trigger(self.store, self.name, name)
        return self.client.handle(run.run_id)
