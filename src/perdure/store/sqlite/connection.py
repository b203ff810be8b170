"""The embedded store's connection layer: the file, the pool and the write path.

:class:`Connections` opens the database file named by a ``sqlite:///`` URL,
lends pooled connections to reads and runs every write in a ``BEGIN
IMMEDIATE`` transaction shared by the writers of one process (group commit,
``_write``); ``_transact`` hands either to a body as a :class:`Tx`. Named
queries may hold several statements, run in order; list parameters are
passed as JSON arrays and instants as microseconds. Waiters on this host are
woken through :mod:`perdure.store.sqlite.wakeup`.
:class:`perdure.store.sqlite.store.SqliteStore` builds the store operations on it.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import suppress
from datetime import datetime
from typing import Any, TypeVar

from perdure import errors
from perdure.store import port, rows, sqlfiles
from perdure.store.sqlite import wakeup

T = TypeVar("T")

_BUSY_TIMEOUT = 10.0
LIVE_TOPIC = "#live"


def _journal_mode_wal(conn: sqlite3.Connection) -> str:
    """Switch the file to write-ahead logging and return the mode it is in.

    Changing the journal mode takes a lock that SQLite does not wait for
    through the busy handler: while another process creates the same file,
    the pragma fails at once with "database is locked". It is retried here,
    within the same bound as any other busy wait.
    """
    deadline = time.monotonic() + _BUSY_TIMEOUT
    pause = 0.002
    while True:
        try:
            return str(conn.execute("PRAGMA journal_mode = WAL").fetchone()[0])
        except sqlite3.OperationalError as exc:
            busy = "locked" in str(exc) or "busy" in str(exc)
            if not busy or time.monotonic() >= deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 0.1)


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


def statements(script: str) -> list[str]:
    """Split ``script`` into complete statements (``executescript`` would commit first)."""
    found: list[str] = []
    pending = ""
    for line in script.splitlines(keepends=True):
        pending += line
        if sqlite3.complete_statement(pending):
            found.append(pending.strip())
            pending = ""
    leftover = [ln for ln in pending.splitlines() if ln.strip() and not ln.strip().startswith("--")]
    if leftover:
        raise ValueError(f"an incomplete SQL statement: {leftover[0]!r}")
    return found


# SQLite runs one statement per call: a named query may hold several, run in order.
_Q = {name: statements(text + ";") for name, text in sqlfiles.queries("sqlite").items()}
# The queries of one statement (nearly all), looked up once per call.
_ONE = {name: found[0] for name, found in _Q.items() if len(found) == 1}


def _param(value: Any) -> Any:
    """Return ``value`` as SQLite holds it: instants as microseconds, lists as JSON arrays."""
    if isinstance(value, datetime):
        return rows.to_us(value)
    if isinstance(value, list | tuple):
        return json.dumps([_param(item) for item in value])
    return value


class Result:
    """What a named query returned: its rows and how many rows it changed."""

    __slots__ = ("_rows", "rowcount")

    def __init__(self, found: list[sqlite3.Row], rowcount: int) -> None:
        self._rows = found
        self.rowcount = rowcount

    def fetchone(self) -> sqlite3.Row | None:
        return self._rows[0] if self._rows else None

    def fetchall(self) -> list[sqlite3.Row]:
        return self._rows

    def __iter__(self) -> Iterator[sqlite3.Row]:
        return iter(self._rows)


# SQLite's result codes for a file that is not, or no longer, a sound database.
_DAMAGED = frozenset({"SQLITE_CORRUPT", "SQLITE_NOTADB"})


def failure(path: str, doing: str, exc: sqlite3.Error) -> errors.StoreError:
    """Return the store error for a SQLite failure: damaged file, or unavailable."""
    name = getattr(exc, "sqlite_errorname", "")
    if name in _DAMAGED or type(exc) is sqlite3.DatabaseError:
        return errors.StoreDamaged(
            f"the SQLite store {path} is damaged ({exc}); {doing} failed and nothing was "
            "written. Restore it from a backup."
        )
    return errors.StoreUnavailable(f"the SQLite store {path}: {doing} failed: {exc}.")


# Values SQLite takes as they are: checked first, since nearly every value is one.
_PLAIN = frozenset({str, int, float, bool, bytes, type(None)})


def _execute(conn: sqlite3.Connection, query: str, params: dict[str, Any], path: str) -> Result:
    """Run a named query (``params`` is converted in place).

    Raises:
        errors.StoreUnavailable: SQLite could not run it (locked, I/O, no schema).
    """
    # Rows by column name for the adapter only: the connection itself keeps
    # plain tuples for the bodies of transaction_step.
    cursor = conn.cursor()
    cursor.row_factory = sqlite3.Row
    # One pass in C over the types; the loop runs only when a value needs converting.
    if not _PLAIN.issuperset(map(type, params.values())):
        for name, value in params.items():
            if value.__class__ not in _PLAIN:
                params[name] = _param(value)
    single = _ONE.get(query)
    try:
        if single is not None:  # nearly every query: no accumulation
            cursor.execute(single, params)
            # fetchall also finishes the statement, which COMMIT requires.
            found = cursor.fetchall()
            changed = cursor.rowcount
            return Result(found, changed if changed > 0 else 0)
        statements = _Q[query]
        found = []
        changed = 0
        for statement in statements:
            cursor.execute(statement, params)
            found += cursor.fetchall()
            changed += max(0, cursor.rowcount)
    except sqlite3.IntegrityError:
        raise  # a broken constraint is the adapter's defect, not the file's
    except sqlite3.DatabaseError as exc:
        raise failure(path, f"the query {query}", exc) from exc
    return Result(found, changed)


# A group commits once it holds this many writes, however many are queued.
_GROUP_LIMIT = 64


class _Group:
    """Writes that share one commit."""

    def __init__(self) -> None:
        self.members = 0
        self.committed = threading.Event()
        self.error: errors.StoreError | None = None


class Tx:
    """One connection inside one transaction (or one read), with the instant it runs at."""

    __slots__ = ("_now_us", "announce", "conn", "notify", "now", "path", "told")

    def __init__(self, conn: sqlite3.Connection, now: datetime, path: str) -> None:
        self.conn = conn
        self.now = now
        self.path = path
        self._now_us = rows.to_us(now)
        # Set by a write that makes a run ready: waiters are woken after COMMIT.
        self.notify = False
        # Set by a write that changes a live run: its watchers are woken after COMMIT.
        self.announce = False
        # Answers told to those watchers with the wake-up (wakeup.told).
        self.told: list[bytes] = []

    def execute(self, query: str, params: dict[str, Any]) -> Result:
        """Run the named query ``query``; ``now`` is always passed."""
        params["now"] = self._now_us
        return _execute(self.conn, query, params, self.path)


class Connections:
    """The connections of one store object to one SQLite database file."""

    def __init__(self, url: str, *, clock: port.Clock | None, create: bool = True) -> None:
        """Open (creating if missing, unless ``create`` is False) the file named by ``url``.

        Raises:
            errors.InvalidStoreURL: the URL names no file.
            errors.StoreUnavailable: the file cannot be created or opened, or
                it does not exist and ``create`` is False.
        """
        self.path = database_path(url)
        # Absolute, so that every message names the one file, whatever the directory.
        self.url = f"sqlite:///{self.path}"
        _check_location(self.path)
        if not create and not os.path.isfile(self.path):
            raise errors.StoreUnavailable(
                f"there is no SQLite store at {self.path}: the file does not exist. Give the "
                "store with --store URL or $PERDURE_STORE (perdure migrate creates an empty one)."
            )
        self._clock: port.Clock = clock or port.SystemClock()
        self._lock = threading.Lock()
        self._mutex = threading.Lock()
        self._queue_lock = threading.Lock()
        self._queued = 0
        self._group: _Group | None = None
        self._conn_for_writes: sqlite3.Connection | None = None
        self._closed = False
        # Connect now so that a bad location fails here, and the file exists.
        self._idle: list[sqlite3.Connection] = [self._connect()]
        self._wakeup = wakeup.Channel(self.path)
        # Watchers of live runs listen on channels of their own (see watch()).
        self._live = wakeup.Channel(self.path, LIVE_TOPIC)
        self._watchers = wakeup.Listeners(self.path, LIVE_TOPIC)

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
            raise failure(self.path, "opening it", exc) from exc
        try:
            mode = _journal_mode_wal(conn)
            conn.execute("PRAGMA synchronous = FULL")
        except sqlite3.Error as exc:
            conn.close()
            raise failure(self.path, "opening it", exc) from exc
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

    # A plain call rather than a context manager: it runs once per step.
    def _write(self, work: Callable[[Tx], T]) -> tuple[T, Tx]:
        """Run ``work`` as part of a durable write; return once it is committed.

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
            # The group's first body needs no savepoint: should it fail, the
            # transaction holds nothing else, so rolling all of it back does the
            # same. Most groups have one body, so most writes run two statements
            # fewer.
            alone = group.members == 0
            if not alone:
                self._statement(conn, "SAVEPOINT body")
            try:
                # The clock is read under the lock, so instants follow commit order.
                tx = Tx(conn, self._now(), self.path)
                result = work(tx)
            except BaseException:
                if alone:
                    self._commit(group, abandon=True)
                    group = None
                else:
                    with suppress(sqlite3.Error):
                        conn.execute("ROLLBACK TO body")
                        conn.execute("RELEASE body")
                raise
            if not alone:
                self._statement(conn, "RELEASE body")
            group.members += 1
        finally:
            if group is not None and (self._queued == 0 or group.members >= _GROUP_LIMIT):
                self._commit(group)
            self._mutex.release()
        group.committed.wait()
        if group.error is not None:
            raise group.error
        return result, tx

    def _statement(self, conn: sqlite3.Connection, sql: str) -> None:
        try:
            conn.execute(sql)
        except sqlite3.DatabaseError as exc:
            raise failure(self.path, "a write", exc) from exc

    def _join_group(self) -> _Group:
        if self._group is not None:
            return self._group
        conn = self._acquire()
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.DatabaseError as exc:
            self._release(conn)
            raise failure(self.path, "locking it for writing", exc) from exc
        self._conn_for_writes = conn
        self._group = _Group()
        return self._group

    def _commit(self, group: _Group, *, abandon: bool = False) -> None:
        """End the group's transaction: commit it, or roll back one whose only body failed."""
        conn = self._conn_for_writes
        self._group, self._conn_for_writes = None, None
        assert conn is not None
        try:
            if not abandon:
                conn.execute("COMMIT")
        except sqlite3.Error as exc:
            group.error = failure(self.path, "a commit", exc)
        finally:
            # Abandoned, or a COMMIT that failed: roll back. If even ROLLBACK
            # fails, _release discards the connection, still in its transaction.
            with suppress(sqlite3.Error):
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
            self._release(conn)
            group.committed.set()

    def _now(self) -> datetime:
        now = self._clock.now()
        if now.tzinfo is None or now.utcoffset() is None:
            raise errors.InvalidInput("the store's clock must return aware datetimes")
        return now

    def _transact(self, work: Callable[[Tx], T], *, retry: bool = True, single: bool = False) -> T:
        """Run ``work`` in one durable write, or as one read when it is ``single``.

        A read needs no transaction: in WAL mode each statement sees one
        snapshot. Writes wait for the database lock instead of failing, so
        nothing is retried (``retry`` is for the signature's sake). Waiters
        are woken once the write that set ``notify`` is committed.
        """
        if single:
            conn = self._acquire()
            try:
                return work(Tx(conn, self._now(), self.path))
            finally:
                self._release(conn)
        result, tx = self._write(work)
        if tx.notify:
            self.notify_ready()
        if tx.announce:
            self._live.notify(*tx.told)
        return result

    def wait_ready(self, timeout: float) -> bool:
        """Block until a run may have become ready on this file, or ``timeout`` passes.

        Any process on this host that writes to the file wakes the waiters
        (see :mod:`perdure.store.sqlite.wakeup`); others are found by polling.
        """
        return self._wakeup.wait(timeout)

    def notify_ready(self) -> None:
        """Wake every ``wait_ready`` caller on this file, in every process of this host."""
        self._wakeup.notify()

    def close(self) -> None:
        """Close every idle connection now and busy ones when they return. Idempotent."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
        self._wakeup.close()
        self._live.close()
        self._watchers.close()
