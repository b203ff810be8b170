"""The shared store's connection layer: the URL, the pool, transactions, LISTEN.

:class:`Connections` checks a PostgreSQL URL without connecting (and keeps a
copy without its password for messages), opens a pool of autocommit
connections, runs work in one transaction with database failures translated
to store errors (``_transact``), and waits for ``NOTIFY perdure_ready`` on a
dedicated connection (``wait_ready``). Stores a program leaves open are closed
by an exit hook (``_close_at_exit``). :class:`perdure.store.postgres.store.PostgresStore`
builds the store operations on it.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import random
import re
import select
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any, TypeVar, cast

import psycopg
import psycopg.errors
from psycopg.conninfo import conninfo_to_dict
from psycopg.pq import ConnStatus, TransactionStatus
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool, PoolClosed, PoolTimeout
from psycopg_pool.base import AttemptWithBackoff

from perdure import errors
from perdure.store import records, sqlfiles, warmport
from perdure.store.postgres import bridge

# The adapter logs under one name, whichever of its modules speaks.
log = logging.getLogger("perdure.store.postgres")

T = TypeVar("T")
Row = dict[str, Any]
Cursor = psycopg.Cursor[Row]

_Q = sqlfiles.queries("postgres")
_CONNECT_TIMEOUT = 5
_POOL_MAX = 10
_POOL_WAIT = 30.0
_ATTEMPTS = 5
# A transaction cut off by a lost connection before it committed is run again
# on a fresh connection this many times, within this many seconds: a primary
# that failed over, or a connection the server closed, costs the caller
# nothing; a store that stays away is still reported at once.
_LOST_ATTEMPTS = 3
_LOST_BUDGET = 2.0
# psycopg_pool waits 1, 2, 4, 8... s between attempts to replace a lost
# connection: after a failover the promoted standby was served up to 6 s
# after it answered. perdure tries every half second at most.
_RECONNECT_FIRST = 0.1
_RECONNECT_MAX = 0.5
_LISTEN_SLICE = 1.0

# Run ids named by wake-ups that no claimer has looked at yet, at most; past
# it a wake-up counts as naming nothing (the claim is the ordinary one).
_WOKEN_HELD = 1024
_EXIT_TIMEOUT = 1.0

# Stores still open; closed at interpreter exit (see _close_at_exit).
_open: weakref.WeakSet[Connections] = weakref.WeakSet()


def _close_at_exit() -> None:
    """Close the stores a program left open, while the pools' threads still run.

    Otherwise a pool is stopped by its finalizer during the interpreter's
    teardown, when its daemon threads may have been frozen holding a lock the
    finalizer then waits on forever: a script that never calls ``close()``
    could hang at exit.
    """
    for conns in list(_open):
        try:
            conns.close(timeout=_EXIT_TIMEOUT)
        except Exception as exc:  # exiting anyway; one store must not keep the others open
            log.warning("could not close the store %s at exit: %s", conns.url, exc)


atexit.register(_close_at_exit)


def _redact(url: str) -> str:
    """Return ``url`` with any password removed (from the userinfo and the query)."""
    url = re.sub(r"^([a-zA-Z][a-zA-Z0-9+.-]*://[^:@/?#]*):[^@/?#]*@", r"\1@", url)
    url = re.sub(r"([?&])password=[^&#]*&?", r"\1", url)
    return url.rstrip("?&")


def _reason(exc: BaseException) -> str:
    """Return the useful part of a psycopg/libpq message, on one line."""
    line = next((part for part in str(exc).splitlines() if part.strip()), type(exc).__name__)
    line = line.rsplit(" failed: ", 1)[-1]
    return re.sub(r"^(FATAL|ERROR):\s+", "", line).strip().rstrip(".")


def _connect_kwargs(url: str, shown: str) -> dict[str, Any]:
    """Check ``url`` without connecting; return the connection options perdure adds."""
    scheme = url.split("://", 1)[0] if "://" in url else ""
    if scheme not in ("postgresql", "postgres"):
        raise errors.InvalidStoreURL(
            f"not a PostgreSQL URL: {shown!r} (use postgresql://user@host:port/database)"
        )
    try:
        params = conninfo_to_dict(url)
    except psycopg.ProgrammingError as exc:
        reason = _reason(exc).replace(url, shown)
        raise errors.InvalidStoreURL(f"malformed PostgreSQL URL {shown!r}: {reason}") from None
    for number in str(params.get("port") or "5432").split(","):
        if not number.isdigit() or not 0 < int(number) < 65536:
            raise errors.InvalidStoreURL(
                f"malformed PostgreSQL URL {shown!r}: port {number!r} is not a port number"
            )
    extra: dict[str, Any] = {
        "connect_timeout": _CONNECT_TIMEOUT,
        "application_name": "perdure",
        # A server or network that vanishes without a reset (a partition, a
        # host gone) must not hold a call forever: probe an idle connection
        # after 10 s, give up after 3 unanswered probes, and give up on data
        # the peer has not acknowledged for 30 s.
        "keepalives": 1,
        "keepalives_idle": 10,
        "keepalives_interval": 5,
        "keepalives_count": 3,
        "tcp_user_timeout": 30_000,
    }
    return {k: v for k, v in extra.items() if k not in params}


def _gone(conn: psycopg.Connection[Any]) -> bool:
    """Whether an idle pooled connection was closed by the server (or its host), without I/O.

    An idle connection has nothing to read unless the server sent something
    on its own: a notice, or the end of the connection (a backend terminated,
    a server that stopped or crashed). Only then is the input read, which
    tells the two apart. A peer gone silent is left to the keepalives.
    """
    if conn.closed or conn.broken:
        return True
    try:
        poller = select.poll()  # not select(): a process may hold over 1024 descriptors
        poller.register(conn.fileno(), select.POLLIN)
        if poller.poll(0):
            conn.pgconn.consume_input()
    except (OSError, ValueError, psycopg.Error):
        return True
    return bool(conn.pgconn.status != ConnStatus.OK)


def _lost(exc: psycopg.Error, conn: psycopg.Connection[Any] | None) -> bool:
    """Whether ``exc`` came with the loss of ``conn`` (not a statement refused or canceled)."""
    return (
        isinstance(exc, psycopg.OperationalError)
        and conn is not None
        and (conn.closed or conn.broken)
    )


class _Attempts(AttemptWithBackoff):
    """psycopg_pool's reconnection backoff, starting at 0.1 s and capped at 0.5 s."""

    INITIAL_DELAY = _RECONNECT_FIRST

    def update_delay(self, now: float) -> None:
        super().update_delay(now)
        self.delay = min(self.delay, _RECONNECT_MAX)


class _Pool(ConnectionPool[psycopg.Connection[Any]]):
    """A pool that replaces a lost connection every half second at most (:class:`_Attempts`)."""

    def _add_connection(self, attempt: AttemptWithBackoff | None, growing: bool = False) -> None:
        if attempt is None:
            attempt = _Attempts(timeout=self.reconnect_timeout)
        super()._add_connection(attempt, growing)


@contextlib.contextmanager
def _opened(conn: psycopg.Connection[Any], begin: str) -> Iterator[None]:
    """A transaction opened by the statements ``begin`` (one round trip), committed on exit."""
    conn.execute(begin)
    try:
        yield
    except BaseException:
        # The transaction is abandoned; a connection lost meanwhile is the pool's to drop.
        with contextlib.suppress(psycopg.Error):
            if conn.info.transaction_status != TransactionStatus.IDLE:
                conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


class Connections:
    """The connections of one store object to one PostgreSQL database."""

    def __init__(self, url: str) -> None:
        """Check ``url``, connect and open the pool; nothing is written.

        Raises:
            errors.InvalidStoreURL: ``url`` is not a usable PostgreSQL URL.
            errors.StoreUnavailable: the server cannot be reached or refuses us.
        """
        self.url = _redact(url)
        self._conninfo = url
        self._kwargs = _connect_kwargs(url, self.url)
        self._closed = False
        self._listen_conn: psycopg.Connection[Any] | None = None
        self._listen_lock = threading.Lock()
        self._wake_cond = threading.Condition()
        self._wakes = 0
        # What the wake-ups named since the last woken() (see warmport.Woken).
        self._woken_runs: set[str] = set()
        self._woken_other = False
        # The updates that wake-ups carried (as JSON), by the run they named.
        self._woken_updates: dict[str, str] = {}
        try:
            # One plain connection first: the pool would only time out, without the reason.
            psycopg.connect(url, **self._kwargs).close()
        except psycopg.Error as exc:
            raise errors.StoreUnavailable(
                f"cannot connect to the PostgreSQL store {self.url}: {_reason(exc)}"
            ) from None
        self._pool: ConnectionPool[psycopg.Connection[Any]] = _Pool(
            url,
            # Autocommit, so that a single-statement write is one round trip;
            # multi-statement work opens its transaction explicitly.
            kwargs={**self._kwargs, "autocommit": True},
            min_size=1,
            max_size=_POOL_MAX,
            timeout=_POOL_WAIT,
            open=False,
            name="perdure",
        )
        try:
            self._pool.open(wait=True, timeout=_CONNECT_TIMEOUT * 2)
        except PoolTimeout:
            self._pool.close()
            raise errors.StoreUnavailable(
                f"cannot open connections to the PostgreSQL store {self.url}"
            ) from None
        self._async_conns = bridge.LoopConnections(self._connect_async, _POOL_MAX)
        _open.add(self)

    def _transact(
        self,
        work: Callable[[Cursor], T],
        *,
        retry: bool = True,
        single: bool = False,
        begin: str | None = None,
        idempotent: bool = False,
    ) -> T:
        """Run ``work`` in one transaction, translating database failures to store errors.

        A deadlock or serialization failure rolls back everything ``work`` did,
        so it is run again (unless ``retry`` is False). ``single`` work is one
        statement, atomic by itself: it runs without BEGIN and COMMIT. A lost
        single statement may have happened, so it is not run again, unless
        it is ``idempotent`` (a put-if-absent: running it twice is running
        it once). ``begin`` (statements without parameters, the first of them BEGIN)
        opens the transaction in one round trip with what it sets up. Inside
        a bridged call (:meth:`call_async`) the transaction runs on the
        caller's event loop instead of a pooled connection, opened plainly.
        """
        if bridge.bridged():
            return bridge.await_(self._atransact(work, retry=retry, single=single))
        attempts = _ATTEMPTS if retry else 1
        lost = 0
        give_up_at = 0.0
        attempt = 0
        while True:
            attempt += 1
            committing = False
            conn: psycopg.Connection[Any] | None = None
            try:
                with (
                    self._connection(give_up_at) as conn,
                    contextlib.nullcontext()
                    if single
                    else _opened(conn, begin)
                    if begin
                    else conn.transaction(),
                    conn.cursor(row_factory=dict_row) as cur,
                ):
                    result = work(cur)
                    # Past here a lost connection leaves the outcome unknown.
                    committing = True
                return result
            except (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure) as exc:
                if attempt >= attempts:
                    raise errors.StoreError(f"PostgreSQL kept aborting: {_reason(exc)}") from exc
                time.sleep(random.uniform(0, 0.005 * attempt))
            except PoolClosed as exc:
                raise errors.StoreError(f"the store {self.url} is closed") from exc
            except PoolTimeout as exc:
                if lost:
                    raise errors.StoreUnavailable(
                        f"lost the PostgreSQL store {self.url}: no connection came back"
                        f" within {_LOST_BUDGET:g} s"
                    ) from exc
                raise errors.StoreUnavailable(
                    f"no connection to the PostgreSQL store {self.url} came free in time"
                ) from exc
            except psycopg.Error as exc:
                # Lost before its commit, the transaction did not happen: run
                # it again on a fresh connection, a few times and briefly.
                # A single statement, or a lost commit, may have happened.
                again = idempotent or not (single or committing)
                if not (retry and again and _lost(exc, conn)):
                    raise self._failure(exc) from exc
                lost += 1
                if lost == 1:
                    give_up_at = time.monotonic() + _LOST_BUDGET
                if lost >= _LOST_ATTEMPTS or time.monotonic() >= give_up_at:
                    raise self._failure(exc) from exc
                log.info("lost a connection to the store %s, trying again: %s", self.url, exc)
                time.sleep(min(_RECONNECT_FIRST * 2 ** (lost - 1), _RECONNECT_MAX))

    @contextlib.contextmanager
    def _connection(self, give_up_at: float) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection that the server has not closed while it sat in the pool.

        Closed ones are dropped (the pool replaces them) and the next one is
        taken, so that a failover or a server restart does not fail one call
        per connection left in the pool. ``give_up_at`` (a monotonic time;
        0: the pool's own timeout) bounds the wait of a retried transaction.
        """
        dropped = 0
        while True:
            timeout = max(0.0, give_up_at - time.monotonic()) if give_up_at else None
            conn = self._pool.getconn(timeout=timeout)
            # Past a pool's worth, the pool's fresh ones are failing: let the
            # work meet the failure and report it.
            if dropped >= _POOL_MAX or not _gone(conn):
                break
            dropped += 1
            conn.close()
            self._pool.putconn(conn)
        try:
            with conn:
                yield conn
        finally:
            self._pool.putconn(conn)

    async def _atransact(self, work: Callable[[Cursor], T], *, retry: bool, single: bool) -> T:
        """:meth:`_transact` on an async connection of the running loop; ``work`` is bridged."""
        attempts = _ATTEMPTS if retry else 1
        for attempt in range(1, attempts + 1):
            if self._closed:
                raise errors.StoreError(f"the store {self.url} is closed")
            try:
                conn = await self._async_conns.acquire()
                try:
                    async with contextlib.nullcontext() if single else conn.transaction():
                        cursor = bridge.Cursor(conn.cursor(row_factory=dict_row))
                        return await bridge.run(work, cast(Cursor, cursor))
                finally:
                    self._async_conns.release(conn)
            except (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure) as exc:
                if attempt == attempts:
                    raise errors.StoreError(f"PostgreSQL kept aborting: {_reason(exc)}") from exc
                await asyncio.sleep(random.uniform(0, 0.005 * attempt))
            except psycopg.Error as exc:
                raise self._failure(exc) from exc
        raise AssertionError("unreachable")  # pragma: no cover

    async def call_async(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run ``fn`` (sync code that calls this store) with its I/O on the running loop.

        Every transaction ``fn`` opens runs on one of psycopg's async
        connections of the caller's event loop: an async client call
        occupies no thread. ``fn`` must not block otherwise (no sleeps, no
        waits on other threads).
        """
        return await bridge.run(fn, *args, **kwargs)

    async def _connect_async(self) -> psycopg.AsyncConnection[Any]:
        try:
            return await psycopg.AsyncConnection.connect(
                self._conninfo, autocommit=True, **self._kwargs
            )
        except psycopg.Error as exc:
            raise errors.StoreUnavailable(
                f"cannot connect to the PostgreSQL store {self.url}: {_reason(exc)}"
            ) from None

    def _failure(self, exc: psycopg.Error) -> errors.StoreError:
        """Return the store error for a database failure (not a deadlock)."""
        if isinstance(exc, psycopg.errors.UndefinedTable):
            return errors.StoreError(
                f"the PostgreSQL store {self.url} has no perdure schema; run migrate() first"
            )
        if isinstance(exc, psycopg.OperationalError):
            # Class 08 (connection) and 57 (shutdown), or no server answer at all.
            if exc.sqlstate is None or exc.sqlstate[:2] in ("08", "57"):
                return errors.StoreUnavailable(
                    f"lost the PostgreSQL store {self.url}: {_reason(exc)}"
                )
            return errors.StoreError(f"PostgreSQL refused: {_reason(exc)}")
        return errors.StoreError(f"PostgreSQL refused: {_reason(exc)}")

    def close(self, timeout: float = 5.0) -> None:
        """Release connections, waiting up to ``timeout`` seconds for the pool's threads.

        Idempotent.
        """
        if self._closed:
            return
        self._closed = True
        _open.discard(self)
        self._pool.close(timeout=timeout)
        self._async_conns.close()
        # A listener notices _closed within one slice of its wait and lets go.
        with self._listen_lock:
            if self._listen_conn is not None:
                self._listen_conn.close()
                self._listen_conn = None
        with self._wake_cond:
            self._wake_cond.notify_all()

    def wait_ready(self, timeout: float) -> bool:
        """Block until a run may have become ready (a NOTIFY), or ``timeout`` seconds pass.

        One caller at a time listens on the dedicated connection; the others
        wait on a condition it signals, and take over when it leaves.
        """
        deadline = time.monotonic() + max(0.0, timeout)
        with self._wake_cond:
            seen = self._wakes
        while not self._closed:
            if self._listen_lock.acquire(blocking=False):
                try:
                    if self._wakes != seen:
                        return True
                    notified = self._listen(deadline)
                finally:
                    self._listen_lock.release()
                with self._wake_cond:
                    self._wakes += notified
                    # Wake the others: to share the news, or to take over listening.
                    self._wake_cond.notify_all()
                    return self._wakes != seen
            with self._wake_cond:
                remaining = deadline - time.monotonic()
                if self._wakes != seen or remaining <= 0:
                    return self._wakes != seen
                self._wake_cond.wait(remaining)
        return False

    def _listen(self, deadline: float) -> bool:
        """Wait for a notification until ``deadline``; the caller holds ``_listen_lock``."""
        if self._listen_conn is None:
            try:
                conn = psycopg.connect(self._conninfo, autocommit=True, **self._kwargs)
                conn.execute(_Q["listen"])
            except psycopg.Error as exc:
                # The caller polls anyway: wait out its timeout (a local
                # notify_ready still wakes it) rather than fail its loop.
                log.warning("cannot listen on the store %s: %s", self.url, _reason(exc))
                with self._wake_cond:
                    self._wake_cond.wait(max(0.0, deadline - time.monotonic()))
                return False
            self._listen_conn = conn
        conn = self._listen_conn
        try:
            while not self._closed:
                remaining = deadline - time.monotonic()
                slice_ = max(0.0, min(remaining, _LISTEN_SLICE))
                # Stops after the first packet, whole: leaving the loop early
                # would drop the rest of its notifications, and what they named.
                heard = False
                for notice in conn.notifies(timeout=slice_, stop_after=1):
                    self._named(notice.payload)
                    heard = True
                if heard:
                    return True
                if remaining <= _LISTEN_SLICE:
                    return False
        except psycopg.Error:
            # A broken listener is reopened by the next call; this one wakes its
            # caller, as a spurious wake-up is allowed and cheaper than a stall.
            conn.close()
            self._listen_conn = None
            self._named("")
            return True
        return False

    def _named(self, payload: str) -> None:
        """Note what a wake-up named: a run (``app``, U+001F, ``run_id``) or nothing.

        An update's delivery may add U+001F and the update, as JSON.
        """
        _, sep, named = payload.partition("\x1f")
        run_id, _, carried = named.partition("\x1f")
        with self._wake_cond:
            if sep and run_id and len(self._woken_runs) < _WOKEN_HELD:
                self._woken_runs.add(run_id)
                if carried:
                    self._woken_updates[run_id] = carried
            else:
                self._woken_other = True

    def woken(self) -> warmport.Woken:
        """Return and forget what the wake-ups since the last call named."""
        with self._wake_cond:
            runs, other = frozenset(self._woken_runs), self._woken_other
            carried = self._woken_updates
            self._woken_runs.clear()
            self._woken_other = False
            self._woken_updates = {}
        updates = {}
        for run_id, text in carried.items():
            update = self._carried_update(run_id, text)
            if update is not None:
                updates[run_id] = update
        return warmport.Woken(runs, other, updates)

    def _carried_update(self, run_id: str, text: str) -> records.UpdateRecord | None:
        """The update a wake-up of ``run_id`` carried as ``text``; None: none readable."""
        return None
