"""The embedded store's connection layer: the file, the pool and the write path.

:class:`Connections` opens the database file named by a ``sqlite:///`` URL,
lends pooled connections to reads (``_fetch``) and runs every write in a
``BEGIN IMMEDIATE`` transaction shared by the writers of one process (group
commit, ``_write``), handing each body a :class:`_Tx`.
:class:`perdure.store.sqlite.store.SqliteStore` builds the store operations on it.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import Any

from perdure import errors
from perdure.store import port, sqlfiles
from perdure.store.sqlite import rows

_Q = sqlfiles.queries("sqlite")
_BUSY_TIMEOUT = 10.0


def database_path(url: str) -> str:
    """Return the absolute file path named by a ``sqlite:///`` URL.

    Raises:
        errors.InvalidStoreURL: the URL is not ``sqlite:///path`` or names no file.
    """
    prefix = "sqlite:///"
    if not url.startswith(prefix):
        raise errors.InvalidStoreURL(
            f"unsupported SQLite URL {url!r}: use sqlite:///relative.db or sqlite:////abs/path.db"
        )
    rest = url[len(prefix) :]
    if rest.lstrip("/") in ("", ":memory:"):
        raise errors.InvalidStoreURL(
            f"the SQLite URL {url!r} names no file; a store must outlive its process"
        )
    return os.path.abspath(rest)


def _check_location(path: str) -> None:
    folder = os.path.dirname(path)
    if os.path.isdir(path):
        problem = "it is a directory"
    elif not os.path.isdir(folder):
        problem = f"the directory {folder} does not exist"
    elif not os.access(folder, os.W_OK | os.X_OK):
        problem = f"the directory {folder} is not writable"
    elif os.path.exists(path) and not os.access(path, os.R_OK | os.W_OK):
        problem = "the file is not readable and writable"
    else:
        return
    raise errors.StoreUnavailable(f"cannot open the SQLite store {path}: {problem}.")


def _execute(
    conn: sqlite3.Connection, query: str, params: dict[str, Any]
) -> tuple[list[sqlite3.Row], int]:
    """Run a named query; return its rows and how many rows it changed.

    Raises:
        errors.StoreUnavailable: SQLite could not run it (locked, I/O, no schema).
    """
    # Rows by column name for the adapter only: the connection itself keeps
    # plain tuples for the bodies of transaction_step.
    cursor = conn.cursor()
    cursor.row_factory = sqlite3.Row
    try:
        cursor.execute(_Q[query], params)
        # fetchall also finishes the statement, which COMMIT requires.
        return cursor.fetchall(), cursor.rowcount
    except sqlite3.OperationalError as exc:
        raise errors.StoreUnavailable(f"the SQLite query {query} failed: {exc}") from exc


# A group commits once it holds this many writes, however many are queued.
_GROUP_LIMIT = 64


class _Group:
    """Writes that share one commit."""

    def __init__(self) -> None:
        self.members = 0
        self.committed = threading.Event()
        self.error: errors.StoreUnavailable | None = None


class _Tx:
    """One connection inside one transaction, with the instant it runs at."""

    __slots__ = ("conn", "limit", "now")

    def __init__(self, conn: sqlite3.Connection, now: int, limit: int) -> None:
        self.conn = conn
        self.now = now
        self.limit = limit

    def rows(self, query: str, **params: Any) -> list[sqlite3.Row]:
        return _execute(self.conn, query, {"now": self.now, **params})[0]

    def one(self, query: str, **params: Any) -> sqlite3.Row | None:
        found = self.rows(query, **params)
        return found[0] if found else None

    def run(self, query: str, **params: Any) -> int:
        return _execute(self.conn, query, {"now": self.now, **params})[1]

    def append(
        self,
        run_id: str,
        last: int,
        marks: Sequence[port.Mark],
        generation: int,
        worker: str | None,
    ) -> None:
        """Store ``marks`` as receipts numbered up to ``last``; keep the newest ``limit``."""
        if not marks:
            return
        first = last - len(marks) + 1
        for mark in marks:
            rows.check_mark(mark)
        fixed = {"run_id": run_id, "at": self.now, "generation": generation, "worker": worker}
        for i, mark in enumerate(marks):
            self.run("ledger_append", **vars(mark), **fixed, sequence=first + i)
        if last > self.limit:
            self.run("ledger_trim", run_id=run_id, upto=last - self.limit)


class Connections:
    """The connections of one store object to one SQLite database file."""

    def __init__(self, url: str, *, clock: port.Clock | None, ledger_limit: int) -> None:
        """Open (creating if missing) the database file named by ``url``.

        Raises:
            errors.InvalidStoreURL: the URL names no file.
            errors.StoreUnavailable: the file cannot be created or opened.
        """
        self.url = url
        self.path = database_path(url)
        _check_location(self.path)
        self._clock: port.Clock = clock or port.SystemClock()
        self._limit = ledger_limit
        self._lock = threading.Lock()
        self._mutex = threading.Lock()
        self._queue_lock = threading.Lock()
        self._queued = 0
        self._group: _Group | None = None
        self._conn_for_writes: sqlite3.Connection | None = None
        self._closed = False
        # Connect now so that a bad location fails here, and the file exists.
        self._idle: list[sqlite3.Connection] = [self._connect()]

    # -- connections ------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        try:
            conn = sqlite3.connect(
                self.path,
                timeout=_BUSY_TIMEOUT,
                isolation_level=None,
                check_same_thread=False,
                cached_statements=128,
            )
        except sqlite3.Error as exc:
            raise errors.StoreUnavailable(
                f"cannot open the SQLite store {self.path}: {exc}."
            ) from exc
        try:
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            conn.execute("PRAGMA synchronous = FULL")
        except sqlite3.Error as exc:
            conn.close()
            raise errors.StoreUnavailable(
                f"cannot open the SQLite store {self.path}: {exc}."
            ) from exc
        if str(mode).lower() != "wal":
            conn.close()
            raise errors.StoreUnavailable(
                f"cannot open the SQLite store {self.path}: it refuses write-ahead logging."
            )
        return conn

    # A pool rather than one connection per thread, so that short-lived
    # threads leave no connections behind.
    def _acquire(self) -> sqlite3.Connection:
        with self._lock:
            if self._closed:
                raise errors.StoreUnavailable(f"the SQLite store {self.path} is closed.")
            if self._idle:
                return self._idle.pop()
        return self._connect()

    def _release(self, conn: sqlite3.Connection) -> None:
        with self._lock:
            if not self._closed and not conn.in_transaction:
                self._idle.append(conn)
                return
        conn.close()

    @contextmanager
    def _write(self) -> Iterator[_Tx]:
        """Run the body as part of a durable write; return once it is committed.

        Writers of this store object take turns on one open ``BEGIN
        IMMEDIATE`` transaction, each body in its own savepoint. The writer
        that finds no one queued behind it commits the whole group, so
        concurrent steps share one fsync (group commit), and no caller returns
        before the commit that holds its writes.
        """
        with self._queue_lock:
            self._queued += 1
        self._mutex.acquire()
        with self._queue_lock:
            self._queued -= 1
        group: _Group | None = None
        try:
            group = self._join_group()
            conn = self._conn_for_writes
            assert conn is not None
            self._statement(conn, "SAVEPOINT body")
            try:
                # The clock is read under the lock, so instants follow commit order.
                yield _Tx(conn, rows.to_us(self._clock.now()), self._limit)
            except BaseException:
                with suppress(sqlite3.Error):
                    conn.execute("ROLLBACK TO body")
                    conn.execute("RELEASE body")
                raise
            self._statement(conn, "RELEASE body")
            group.members += 1
        finally:
            if group is not None and (self._queued == 0 or group.members >= _GROUP_LIMIT):
                self._commit(group)
            self._mutex.release()
        group.committed.wait()
        if group.error is not None:
            raise group.error

    def _statement(self, conn: sqlite3.Connection, sql: str) -> None:
        try:
            conn.execute(sql)
        except sqlite3.OperationalError as exc:
            raise errors.StoreUnavailable(
                f"the SQLite store {self.path} could not write: {exc}."
            ) from exc

    def _join_group(self) -> _Group:
        if self._group is not None:
            return self._group
        conn = self._acquire()
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            self._release(conn)
            raise errors.StoreUnavailable(
                f"the SQLite store {self.path} could not be locked for writing: {exc}."
            ) from exc
        self._conn_for_writes = conn
        self._group = _Group()
        return self._group

    def _commit(self, group: _Group) -> None:
        conn = self._conn_for_writes
        self._group, self._conn_for_writes = None, None
        assert conn is not None
        try:
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            group.error = errors.StoreUnavailable(
                f"the SQLite store {self.path} could not commit: {exc}."
            )
            # If even ROLLBACK fails, _release discards the connection.
            with suppress(sqlite3.Error):
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
        finally:
            self._release(conn)
            group.committed.set()

    def _fetch(self, query: str, **params: Any) -> list[sqlite3.Row]:
        conn = self._acquire()
        try:
            # Reads need no transaction: in WAL mode each statement sees one snapshot.
            return _execute(conn, query, params)[0]
        finally:
            self._release(conn)

    def _close_connections(self) -> None:
        """Close every idle connection now and busy ones when they return."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
