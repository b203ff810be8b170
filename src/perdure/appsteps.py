"""The app's steps: ``@app.step`` and ``@app.transaction``, and the call a step becomes.

:class:`Steps` is a part of :class:`~perdure.app.App` (a base class of it).
A declared step stays callable as its function: called by a workflow it is
journaled through the workflow's Context, called anywhere else it is a plain
call (a transactional step refuses to be). Declaring a step registers nothing
with the app: the options travel on the function.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from datetime import timedelta
from typing import Any, Concatenate, ParamSpec, TypeVar, cast, overload

from perdure import codec, context, effects, errors

F = TypeVar("F", bound=Callable[..., Any])
P = ParamSpec("P")
R = TypeVar("R")


class Steps:
    """The step declarations of an App."""

    @overload
    def step(self, fn: F, /) -> F: ...

    @overload
    def step(
        self,
        fn: None = None,
        /,
        *,
        name: str | None = None,
        effect: effects.Effect = "idempotent",
        retry: effects.Retry | None = None,
        timeout: timedelta | float | None = None,
        dry_run: Callable[..., Any] | None = None,
    ) -> Callable[[F], F]: ...

    def step(
        self,
        fn: F | None = None,
        /,
        *,
        name: str | None = None,
        effect: effects.Effect = "idempotent",
        retry: effects.Retry | None = None,
        timeout: timedelta | float | None = None,
        dry_run: Callable[..., Any] | None = None,
    ) -> F | Callable[[F], F]:
        """Declare a step: inside a workflow, a call to it is journaled.

        ``effect`` is ``"pure"``, ``"idempotent"`` (retried under ``retry``) or
        ``"once"`` (its start is recorded first; never silently repeated).
        An attempt that runs past ``timeout`` fails with
        :class:`~perdure.StepTimedOut` (a sync step's thread runs on; its late
        result is discarded). Outside a workflow the function runs as a plain call.
        In a dry run an ``idempotent`` or ``once`` step is not called: it
        returns ``dry_run(*args, **kwargs)`` (a plain function), or ``None``.
        """
        seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
        _check_stub(dry_run)

        def declare(target: F) -> F:
            step_name = codec.check_text("a step name", name or target.__name__, limit=200)
            opts = effects.StepOptions(
                step_name,
                effect,
                retry or effects.DEFAULT_RETRY,
                timeout=seconds,
                dry_run=dry_run,
            )
            return _wrap(target, opts, transactional=False)

        return declare(fn) if fn is not None else declare

    @overload
    def transaction(self, name: Callable[Concatenate[Any, P], R], /) -> Callable[P, R]: ...

    @overload
    def transaction(
        self, name: str | None = None, *, dry_run: Callable[..., Any] | None = None
    ) -> Callable[[Callable[Concatenate[Any, P], R]], Callable[P, R]]: ...

    def transaction(
        self, name: str | Callable[..., Any] | None = None, *, dry_run: Any = None
    ) -> Any:
        """Declare a transactional step: ``fn(connection, ...)`` runs in the step's own commit.

        Use it as ``@app.transaction``, ``@app.transaction()`` or
        ``@app.transaction("name")``. The connection is the store's
        (``sqlite3.Connection`` or psycopg's); its writes and the journal entry
        commit together or not at all. In a dry run it is not called: it
        returns ``dry_run(*args, **kwargs)`` (without the connection), or ``None``.
        """
        if callable(name):
            return self.transaction(None)(name)
        if name is not None and not isinstance(name, str):
            raise errors.InvalidInput(f"a transaction step name must be a string, got {name!r}")
        _check_stub(dry_run)

        def declare(target: Callable[Concatenate[Any, P], R]) -> Callable[P, R]:
            step_name = codec.check_text("a step name", name or target.__name__, limit=200)
            opts = effects.StepOptions(
                step_name, "pure", effects.NO_RETRY, transactional=True, dry_run=dry_run
            )
            # Callers leave out the connection; the engine passes it in.
            return cast(Callable[P, R], _wrap(target, opts, transactional=True))

        return declare


def _check_stub(stub: Any) -> None:
    if stub is not None and (not callable(stub) or inspect.iscoroutinefunction(stub)):
        raise errors.InvalidInput(
            f"a step's dry_run= is a plain function called with the step's arguments, got {stub!r}"
        )


def _wrap(fn: F, opts: effects.StepOptions, *, transactional: bool) -> F:
    fn.__perdure_step__ = opts  # type: ignore[attr-defined]
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def async_step(*args: Any, **kwargs: Any) -> Any:
            ctx = context.current()
            # Inside another step's body a step is a plain call: the outer
            # step's outcome is what the journal records.
            if ctx is None or context.in_step():
                return await fn(*args, **kwargs)
            return await ctx.astep(fn, *args, **kwargs)

        async_step.__perdure_step__ = opts  # type: ignore[attr-defined]
        return async_step  # type: ignore[return-value]

    @functools.wraps(fn)
    def sync_step(*args: Any, **kwargs: Any) -> Any:
        ctx = context.current()
        if ctx is None or context.in_step():
            if transactional:
                raise errors.InvalidInput(
                    f"transactional step {opts.name} can only be called by a workflow, "
                    "not outside one or from inside another step"
                )
            return fn(*args, **kwargs)
        if transactional:
            return ctx.transaction(fn, *args, **kwargs)
        return ctx.step(fn, *args, **kwargs)

    sync_step.__perdure_step__ = opts  # type: ignore[attr-defined]
    return sync_step  # type: ignore[return-value]
