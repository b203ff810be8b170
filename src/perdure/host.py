"""What an execution needs from the worker that drives it.

:class:`Host` is the worker as an :class:`~perdure.execution.Execution` sees
it: the app's registry, the store, telemetry, whether it stops, and how it
calls workflow code. :class:`WarmHost` is a host that also keeps parked runs
warm (:mod:`perdure.warm`); an execution asks for it by ``isinstance``, and
parks the ordinary way when its host is not one.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from perdure import context, telemetry, warm
from perdure import registry as registry_api
from perdure.store import port

if TYPE_CHECKING:
    from perdure import execution as execution_api


class Host(Protocol):
    """What an execution needs from the worker that drives it."""

    registry: registry_api.Registry
    store: port.Store
    telemetry: telemetry.Telemetry

    @property
    def stopping(self) -> bool: ...

    def wait_stopping(self, timeout: float) -> bool:
        """Block up to ``timeout`` seconds or until the worker stops; return whether it does."""
        ...

    def invoke(
        self,
        wf: registry_api.WorkflowDef,
        ctx: context.Context,
        args: list[Any],
        kwargs: dict[str, Any],
    ) -> Any:
        """Call the workflow function with ``ctx`` bound."""
        ...


@runtime_checkable
class WarmHost(Host, Protocol):
    """A host that keeps parked runs warm (see :mod:`perdure.warm`)."""

    def warm_slot(self, execution: execution_api.Execution) -> warm.WarmSlot | None:
        """A slot to keep the run warm in, reserved for it; None: park the ordinary way."""
        ...

    def warm_parked(
        self, execution: execution_api.Execution, slot: warm.WarmSlot, wake: datetime | None
    ) -> None:
        """The run is parked in the store: stop renewing it and free its place, keep the slot."""
        ...

    def warm_cooled(self, slot: warm.WarmSlot) -> warm.Handed:
        """Give the slot up; return a claim that was handed to it meanwhile, if any."""
        ...

    @property
    def warm_for(self) -> float:
        """How long a warm-parked run waits here to be taken up again, in seconds."""
        ...
