"""Native-async calls on PostgreSQL: the sync code, its statements awaited on async connections.

A store call made through :func:`run` executes in a greenlet. Each
transaction it opens (``Connections._transact``) is handed back to the event
loop, which runs it on one of psycopg's ``AsyncConnection`` objects; each
statement inside is awaited there, and the greenlet resumes with its rows.
So one body of code serves the sync and the async forms of every call, and
an ``async`` caller never occupies a thread. SQLAlchemy's asyncio support
bridges its sync core to async drivers the same way.

:func:`await_` may only be called inside :func:`run`; code that may run
either way asks :func:`bridged` first.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
import weakref
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar, cast

import psycopg

T = TypeVar("T")

# Set in the context a bridged call runs in. Code outside one (every worker
# thread) reads this variable only: greenlet is neither imported nor asked.
_BRIDGED: contextvars.ContextVar[bool] = contextvars.ContextVar("perdure_bridged", default=False)


def bridged() -> bool:
    """Whether the calling code runs inside :func:`run` (its I/O must be awaited)."""
    return _BRIDGED.get()


def await_(awaitable: Awaitable[T]) -> T:
    """Have the event loop await ``awaitable`` and return its result (inside :func:`run`)."""
    if not _BRIDGED.get():
        raise RuntimeError("await_ outside a bridged call")
    import greenlet

    return cast(T, greenlet.getcurrent().parent.switch(awaitable))


async def run(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Call ``fn(*args, **kwargs)`` (sync code) with every awaitable it hands over awaited here."""
    import greenlet  # only callers of the async forms need it

    child = greenlet.greenlet(fn, parent=greenlet.getcurrent())
    # The caller's context variables (a trace's span, say) go along.
    context = contextvars.copy_context()
    context.run(_BRIDGED.set, True)
    child.gr_context = context
    result = child.switch(*args, **kwargs)
    while not child.dead:
        try:
            value = await result
        except BaseException as exc:  # thrown into the sync code, which decides
            result = child.throw(exc)
        else:
            result = child.switch(value)
    return cast(T, result)


class Cursor:
    """A sync face on an ``AsyncCursor``, for store code running inside :func:`run`."""

    def __init__(self, cursor: psycopg.AsyncCursor[Any]) -> None:
        self._cursor = cursor

    def execute(self, query: Any, params: Any = None, *, prepare: bool | None = None) -> Cursor:
        await_(self._cursor.execute(query, params, prepare=prepare))
        return self

    def fetchone(self) -> Any:
        return await_(self._cursor.fetchone())

    def fetchall(self) -> list[Any]:
        return await_(self._cursor.fetchall())

    def __iter__(self) -> Iterator[Any]:
        return iter(self.fetchall())

    @property
    def rowcount(self) -> int:
        return self._cursor.rowcount

    @property
    def connection(self) -> Any:
        # Only the worker's claim (not a client call) opens savepoints.
        raise RuntimeError("a bridged store call cannot open a nested transaction")


class _Loop:
    """One event loop's connections: the idle ones, and a bound on those in use."""

    def __init__(self, size: int) -> None:
        self.idle: list[psycopg.AsyncConnection[Any]] = []
        self.free = asyncio.Semaphore(size)


class LoopConnections:
    """Async connections per event loop (a connection serves the loop it was made on).

    At most ``size`` are in use per loop at once; more callers wait for one
    to come back rather than open connections that would be closed again.
    """

    def __init__(self, connect: Callable[[], Awaitable[psycopg.AsyncConnection[Any]]], size: int):
        self._connect = connect
        self._size = size
        self._lock = threading.Lock()
        self._loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Loop] = (
            weakref.WeakKeyDictionary()
        )
        self._closed = False

    def _of(self, loop: asyncio.AbstractEventLoop) -> _Loop:
        with self._lock:
            found = self._loops.get(loop)
            if found is None:
                found = self._loops[loop] = _Loop(self._size)
                # A loop that ends (asyncio.run returns) takes its connections along.
                weakref.finalize(loop, _discard_all, found.idle)
            return found

    async def acquire(self) -> psycopg.AsyncConnection[Any]:
        state = self._of(asyncio.get_running_loop())
        await state.free.acquire()
        try:
            with self._lock:
                if state.idle:
                    return state.idle.pop()
            return await self._connect()
        except BaseException:
            state.free.release()
            raise

    def release(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Keep ``conn`` for the next call on this loop, unless it is broken or in a transaction."""
        state = self._of(asyncio.get_running_loop())
        idle = conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        try:
            with self._lock:
                if not self._closed and not conn.closed and idle:
                    state.idle.append(conn)
                    return
            _discard(conn)
        finally:
            state.free.release()

    def close(self) -> None:
        """Close every idle connection, of every loop (from any thread, without awaiting)."""
        with self._lock:
            self._closed = True
            kept = [conn for state in self._loops.values() for conn in state.idle]
            for state in self._loops.values():
                state.idle.clear()
        _discard_all(kept)


def _discard_all(conns: list[Any]) -> None:
    while conns:
        _discard(conns.pop())


def _discard(conn: psycopg.AsyncConnection[Any]) -> None:
    # Closing the libpq connection needs no event loop; its loop may be gone.
    with contextlib.suppress(Exception):
        conn.pgconn.finish()
