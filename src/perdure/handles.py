"""A run as the client hands it out: the handle of a started run, and a stored run's RunInfo.

:func:`run_info` turns a stored :class:`~perdure.store.port.Run` into the
:class:`~perdure.records.RunInfo` callers see, refusing columns it cannot
read; :class:`RunHandle` is what ``start`` returns, its result typed by the
workflow. Both are named in :mod:`perdure.client` too, where callers find them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from perdure import codec, errors, records
from perdure.store import port

if TYPE_CHECKING:
    from perdure import client as client_api

R = TypeVar("R")


def decode_column(run_id: str, column: str, text: str | None) -> Any:
    if text is None:
        return None
    try:
        return codec.decode(text)
    except errors.InvalidPayload as exc:
        raise errors.CorruptState(run_id, f"run_{column}_json", str(exc)) from exc


def _opened_result(run: port.Run, opener: Callable[[Any], Any]) -> Any:
    """A run's result, opened; a plan run's is its tasks' outputs, each sealed on its own."""
    value = decode_column(run.run_id, "result", run.result)
    if run.plan_digest is not None and isinstance(value, dict):
        return {name: opener(output) for name, output in value.items()}
    return opener(value)


def run_info(run: port.Run, opener: Callable[[Any], Any] | None = None) -> records.RunInfo:
    """Convert a stored run to what clients see, refusing unreadable columns.

    The result is opened by ``opener`` (the app's payload layer's ``open``,
    or its ``reveal`` for display); without one, a sealed result is given as
    it is stored.
    """
    error = decode_column(run.run_id, "error", run.error)
    if error is not None and not isinstance(error, dict):
        raise errors.CorruptState(run.run_id, "run_error_shape", "error is not an object")
    return records.RunInfo(
        run_id=run.run_id,
        workflow=run.workflow,
        version=run.version,
        state=run.state,
        result=_opened_result(run, opener or _as_stored),
        error=error,
        attempt=run.generation,
        failures=run.failures,
        created_at=run.created_at,
        updated_at=run.updated_at,
        key=run.key,
        parent_id=run.parent_id,
        cancel_requested=run.cancel_requested,
        deadline=run.deadline,
        suspend_requested=run.suspend_requested,
        continued_as=run.continued_as,
        queue=run.queue,
        queue_key=run.queue_key,
        priority=run.priority,
        dry_run=run.dry_run,
    )


def _as_stored(value: Any) -> Any:
    return value


class RunHandle(Generic[R]):
    """A started run whose result is an ``R``."""

    def __init__(
        self, client: client_api.Client, run_id: str, hint: Any = None, *, created: bool = True
    ) -> None:
        self._client = client
        self.run_id = run_id
        self._hint = hint
        self.created = created
        """False when ``start`` found the run already created under its key."""

    def __repr__(self) -> str:
        return f"RunHandle({self.run_id!r})"

    def status(self) -> str:
        """Return the run's current state."""
        return self._client.get(self.run_id).state

    def info(self) -> records.RunInfo:
        return self._client.get(self.run_id)

    def result(self, timeout: float | None = None) -> R:
        """Wait for the run to end and return its result.

        Raises:
            errors.RunFailed: the run ended failed, canceled or needs_attention.
            errors.ResultTimeout: it did not end within ``timeout`` seconds.
        """
        result: R = self._client.result(self.run_id, timeout=timeout, hint=self._hint)
        return result

    async def aresult(self, timeout: float | None = None) -> R:
        """Async form of ``result``."""
        result: R = await self._client.aresult(self.run_id, timeout=timeout, hint=self._hint)
        return result
