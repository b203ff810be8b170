"""Async twins of sync calls: the same call, run without blocking the event loop.

Each sync call of a Client or an App gets its async form from one of these
(``start``/``astart``), so the two are never written twice.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")


def athread(fn: Callable[P, R]) -> Callable[P, Awaitable[R]]:
    """Derive the async twin of a call on a store: the same call, without blocking the loop.

    The first argument is the object the call is a method of (a Client or an
    App), whose ``store`` decides how: a store that runs calls on the event
    loop (``call_async``: PostgreSQL, on psycopg's async connections) runs it
    there; any other runs it on a thread.
    """

    @functools.wraps(fn)
    async def twin(*args: P.args, **kwargs: P.kwargs) -> R:
        store = getattr(args[0], "store", None) if args else None
        native: Callable[..., Awaitable[R]] | None = getattr(store, "call_async", None)
        if native is not None:
            return await native(fn, *args, **kwargs)
        return await asyncio.to_thread(fn, *args, **kwargs)

    twin.__doc__ = f"Async form of ``{fn.__name__}``."
    return twin


def blocking_twin(fn: Callable[P, R]) -> Callable[P, Awaitable[R]]:
    """Derive the async twin of a call that waits on other threads: it runs on a thread."""

    @functools.wraps(fn)
    async def twin(*args: P.args, **kwargs: P.kwargs) -> R:
        return await asyncio.to_thread(fn, *args, **kwargs)

    twin.__doc__ = f"Async form of ``{fn.__name__}``."
    return twin
