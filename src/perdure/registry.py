"""Registered workflows: the typed objects ``@app.workflow`` returns, and what a worker looks up.

``@app.workflow`` turns ``def checkout(ctx: Context, order_id: str) -> dict``
into a :class:`SyncWorkflow` ``[[str], dict]`` (an ``async def`` into an
:class:`AsyncWorkflow`), still callable as the function it wraps. Both are
:class:`Workflow` ``[P, R]``: ``P`` the parameters after the Context and ``R``
the result, so ``app.start(checkout, ...)`` is checked against ``P`` and its
handle's ``result()`` is ``R``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Concatenate, Generic, ParamSpec, Protocol, TypeVar, cast, overload

from perdure import context

P = ParamSpec("P")
R = TypeVar("R")


@dataclass(frozen=True)
class WorkflowDef:
    """A registered workflow."""

    name: str
    version: str
    fn: Callable[..., Any]
    is_async: bool
    params: dict[str, Any]
    returns: Any


class Registry(Protocol):
    """What the worker needs from the app."""

    name: str
    max_failures: int
    payload_limit: int
    retention: timedelta | None

    def workflow_def(self, name: str) -> WorkflowDef | None: ...

    def workflow_versions(self) -> list[tuple[str, str]]: ...

    def workflow_ref(self, workflow: Any) -> tuple[str, str, Any]: ...


class Workflow(Generic[P, R]):
    """A registered workflow taking ``P`` (after its Context) and ending with ``R``."""

    def __init__(self, fn: Callable[..., Any], name: str, version: str) -> None:
        functools.update_wrapper(cast(Callable[..., Any], self), fn)
        self.fn = fn
        self.name = name
        self.version = version
        # How app.workflow_ref and ctx.start_child recognise a workflow.
        self.__perdure_workflow__ = name

    def __repr__(self) -> str:
        return f"<workflow {self.name} version {self.version}>"


class SyncWorkflow(Workflow[P, R]):
    """A workflow defined with ``def``; calling it calls the function."""

    def __call__(self, ctx: context.Context, /, *args: P.args, **kwargs: P.kwargs) -> R:
        result: R = self.fn(ctx, *args, **kwargs)
        return result


class AsyncWorkflow(Workflow[P, R]):
    """A workflow defined with ``async def``; calling it returns the coroutine."""

    def __call__(
        self, ctx: context.Context, /, *args: P.args, **kwargs: P.kwargs
    ) -> Coroutine[Any, Any, R]:
        result: Coroutine[Any, Any, R] = self.fn(ctx, *args, **kwargs)
        return result


class Register(Protocol):
    """The decorator ``app.workflow(...)`` returns: typed by whether the function is async."""

    # A coroutine function also fits the second form; the first wins.
    @overload
    def __call__(  # type: ignore[overload-overlap]
        self, fn: Callable[Concatenate[context.Context, P], Coroutine[Any, Any, R]], /
    ) -> AsyncWorkflow[P, R]: ...

    @overload
    def __call__(
        self, fn: Callable[Concatenate[context.Context, P], R], /
    ) -> SyncWorkflow[P, R]: ...
