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
import inspect
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from datetime import timedelta
from typing import (
    Any,
    Concatenate,
    Generic,
    Literal,
    ParamSpec,
    Protocol,
    Self,
    TypeVar,
    cast,
    overload,
)

from perdure import codec, context, errors, payloads
from perdure.store import scheduleport

P = ParamSpec("P")
R = TypeVar("R")
H = TypeVar("H", bound=Callable[..., Any])
ParentClose = Literal["abandon", "cancel"]


@dataclass(frozen=True)
class WorkflowDef:
    """A registered workflow."""

    name: str
    version: str
    fn: Callable[..., Any]
    is_async: bool
    params: dict[str, Any]
    returns: Any
    # What a child run of this workflow does when its parent ends first.
    parent_close: ParentClose = "abandon"
    # Filled by @workflow.validator(name) and @workflow.query(name).
    validators: dict[str, Callable[[Any], Any]] = field(default_factory=dict)
    queries: dict[str, Callable[[Any], Any]] = field(default_factory=dict)

    @functools.cached_property
    def signature(self) -> inspect.Signature:
        """The workflow function's signature, read once: every start checks its arguments."""
        return inspect.signature(self.fn)


def takes_key(wf: WorkflowDef) -> bool:
    """Whether the workflow has a parameter named ``key`` (then ``key=`` is its argument)."""
    return "key" in list(wf.signature.parameters)[1:]


def split_key(
    wf: WorkflowDef, workflow: Any, key: Any, kwargs: dict[str, Any]
) -> tuple[str | None, dict[str, Any]]:
    """Return the run key and the workflow's keyword arguments of a start.

    ``key=`` is the run key, unless the workflow has a parameter named
    ``key``: then it is that argument, and the run key comes from
    ``workflow.keyed(...)`` only.

    Raises:
        errors.InvalidInput: two run keys, or one that is not a string.
    """
    bound: str | None = getattr(workflow, "__perdure_key__", None)
    if key is not None and takes_key(wf):
        kwargs, key = {**kwargs, "key": key}, None
    if bound is not None:
        if key is not None:
            raise errors.InvalidInput(
                f"two run keys for one start of {wf.name}: {bound!r} and {key!r}"
            )
        key = bound
    if key is not None and not isinstance(key, str):
        raise errors.InvalidInput(f"a run key is a string, got {type(key).__name__}")
    return key, kwargs


def split_dry_run(
    wf: WorkflowDef, dry_run: Any, kwargs: dict[str, Any]
) -> tuple[bool, dict[str, Any]]:
    """Return whether a start is a dry run, and the workflow's keyword arguments.

    ``dry_run=`` marks the run, unless the workflow has a parameter of that
    name: then it is that argument and the run is a real one.

    Raises:
        errors.InvalidInput: ``dry_run`` is not a bool.
    """
    if "dry_run" in list(wf.signature.parameters)[1:]:
        return False, ({**kwargs, "dry_run": dry_run} if dry_run is not False else kwargs)
    if not isinstance(dry_run, bool):
        raise errors.InvalidInput(f"dry_run is True or False, got {dry_run!r}")
    return dry_run, kwargs


def check_arguments(wf: WorkflowDef, args: Any, kwargs: dict[str, Any]) -> None:
    """Refuse arguments the workflow's signature or type hints do not take.

    Raises:
        errors.InvalidInput: they do not bind to the signature.
        errors.InvalidPayload: a value does not fit its parameter's type hint.
    """
    try:
        bound = wf.signature.bind(None, *args, **kwargs)
    except TypeError as exc:
        raise errors.InvalidInput(f"bad arguments for workflow {wf.name}: {exc}") from None
    for param, value in list(bound.arguments.items())[1:]:
        if param in wf.params:
            try:
                codec.convert(codec.decode(codec.encode(value)), wf.params[param])
            except errors.InvalidPayload as exc:
                raise errors.InvalidPayload(
                    f"argument {param!r} of workflow {wf.name}: {exc}"
                ) from None


def child_call(
    reg: Registry, workflow: Any, key: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[str | None, dict[str, Any]]:
    """What a run starting a child checks (see ``Runtime.child_call`` in the context)."""
    name, _, _ = reg.workflow_ref(workflow)
    wf = reg.workflow_def(name)
    if wf is None:  # workflow_ref found it: only a registry that lies gets here
        raise errors.WorkflowNotFound(name, [])
    key, kwargs = split_key(wf, workflow, key, kwargs)
    check_arguments(wf, args, kwargs)
    return key, kwargs


class Registry(Protocol):
    """What the worker needs from the app."""

    name: str
    max_failures: int
    payload_limit: int
    payloads: payloads.Payloads
    retention: timedelta | None

    def workflow_def(self, name: str) -> WorkflowDef | None: ...

    def workflow_versions(self) -> list[tuple[str, str]]: ...

    def workflow_ref(self, workflow: Any) -> tuple[str, str, Any]: ...

    def schedule_specs(self) -> list[scheduleport.ScheduleSpec]: ...


class Workflow(Generic[P, R]):
    """A registered workflow taking ``P`` (after its Context) and ending with ``R``."""

    def __init__(
        self,
        fn: Callable[..., Any],
        name: str,
        version: str,
        definition: WorkflowDef | None = None,
    ) -> None:
        functools.update_wrapper(cast(Callable[..., Any], self), fn)
        self.fn = fn
        self.name = name
        self.version = version
        self._definition = definition
        # How app.workflow_ref and ctx.start_child recognise a workflow.
        self.__perdure_workflow__ = name

    def __repr__(self) -> str:
        key = getattr(self, "__perdure_key__", None)
        return f"<workflow {self.name} version {self.version}{f' key {key!r}' if key else ''}>"

    def keyed(self, key: str) -> Self:
        """This workflow, to be started under the idempotency ``key``.

        ``app.start(checkout.keyed("order-7"), ...)`` (or
        ``ctx.start_child(...)``) is the same as passing ``key=``, with two
        differences: it cannot collide with a parameter of the workflow named
        ``key``, and type checkers still check the other arguments.
        """
        if not isinstance(key, str) or not key:
            raise errors.InvalidInput(f"a run key is a non-empty string, got {key!r}")
        copy = object.__new__(type(self))
        copy.__dict__.update(self.__dict__)
        copy.__dict__["__perdure_key__"] = key
        return copy

    def _handlers(self, what: str) -> dict[str, Callable[[Any], Any]]:
        if self._definition is None:
            raise errors.InvalidInput(f"workflow {self.name} is not registered with an app")
        found: dict[str, Callable[[Any], Any]] = getattr(self._definition, what)
        return found

    def _register(self, what: str, name: str) -> Callable[[H], H]:
        if not isinstance(name, str) or not name or "/" in name:
            raise errors.InvalidInput(f"a {what[:-1]} name {name!r} must be non-empty, without '/'")
        handlers = self._handlers(what)

        def register(fn: H) -> H:
            if name in handlers:
                raise errors.InvalidInput(f"workflow {self.name} has two {what} named {name!r}")
            handlers[name] = fn
            return fn

        return register

    def validator(self, name: str) -> Callable[[H], H]:
        """Register ``fn(payload)`` to check updates named ``name`` before they are stored.

        It runs in the sender's process (``app.update``); whatever it raises
        refuses the update with ``UpdateRejected`` carrying its message.
        """
        return self._register("validators", name)

    def query(self, name: str) -> Callable[[H], H]:
        """Register ``fn(view: RunView)``, a read-only question ``app.query`` answers.

        It runs in the asker's process, on the run's durable journal; it must
        not write anything.
        """
        return self._register("queries", name)


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
