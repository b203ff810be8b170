"""Wake idle workers on this host at once: Unix datagram sockets in a shared folder.

An embedded store has no server to push notifications, so every process that
waits for work on a database file binds a socket in a folder named after the
file; whoever makes a run ready sends one byte to each socket there. Sending
never blocks and never fails the caller: a full or dead socket is skipped
(and a dead one removed). A lost datagram costs one poll interval, nothing
more, because waiters also wake on their timeout. An update's answer (a
short one) is sent as the datagram itself, so that its sender, woken by it,
need not read it back (:meth:`Channel.answer`).
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import select
import socket
import tempfile
import threading
from collections import OrderedDict

_COUNTER = itertools.count()
_PREFIX = "perdure-wake-"
_WAKE = b"!"
_TOLD_MAX = 7000
"""The longest answer told in a datagram, as JSON (PostgreSQL's notifications fit 8,000)."""
_TOLD_HELD = 256
"""Told answers a channel keeps (its watcher needs the one it waits for)."""
_pruned = False
_prune_lock = threading.Lock()


def _prune(tmp: str) -> None:
    """Remove sockets (and then folders) left by processes that are gone.

    A process killed without closing its store leaves its socket file, and a
    database that was deleted leaves its folder: both would pile up in the
    temporary directory. Done once per process, when it first listens.
    """
    global _pruned
    with _prune_lock:
        if _pruned:
            return
        _pruned = True
    with contextlib.suppress(OSError):
        for folder in os.listdir(tmp):
            if folder.startswith(_PREFIX):
                _prune_folder(os.path.join(tmp, folder))


def _prune_folder(folder: str) -> None:
    with contextlib.suppress(OSError):
        for name in os.listdir(folder):
            pid = name.split("-", 1)[0]
            if pid.isdigit() and not _alive(int(pid)):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(folder, name))
        os.rmdir(folder)  # only succeeds once it is empty


def told(run_id: str, update_id: str, response: str) -> bytes | None:
    """An update's answer as a datagram that wakes watchers and tells it; None if too long."""
    body = {"run_id": run_id, "update_id": update_id, "response": response}
    data = json.dumps(body, separators=(",", ":")).encode()
    return data if len(data) <= _TOLD_MAX else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Channel:
    """The wake-up channel of one database file, for one store object."""

    def __init__(self, key: str, topic: str = "") -> None:
        # A topic (such as changes of live runs) gets a folder of its own, so
        # its notifications do not wake the waiters of another.
        digest = hashlib.sha256((os.path.realpath(key) + topic).encode()).hexdigest()[:20]
        # Socket paths are limited to about 100 bytes, so the folder is short
        # and lives in the temporary directory rather than beside the file.
        self.folder = os.path.join(tempfile.gettempdir(), f"{_PREFIX}{digest}")
        self._sock: socket.socket | None = None
        self._path: str | None = None
        self._lock = threading.Lock()
        self._told: OrderedDict[tuple[str, str], str] = OrderedDict()

    def _listen(self) -> socket.socket:
        with self._lock:
            if self._sock is None:
                _prune(os.path.dirname(self.folder))
                os.makedirs(self.folder, mode=0o700, exist_ok=True)
                path = os.path.join(self.folder, f"{os.getpid()}-{next(_COUNTER)}.sock")
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                sock.bind(path)
                sock.setblocking(False)
                self._sock, self._path = sock, path
            return self._sock

    def listen(self) -> None:
        """Start listening now: notifications from here on are kept for ``wait``."""
        self._listen()

    def drain(self) -> None:
        """Take in the notifications that arrived so far, keeping the answers they told."""
        sock = self._sock
        if sock is None:
            return
        with contextlib.suppress(BlockingIOError, InterruptedError):
            while data := sock.recv(_TOLD_MAX + 1):
                if data[:1] == b"{":
                    self._keep(data)

    def _keep(self, data: bytes) -> None:
        try:
            body = json.loads(data)
            key, response = (body["run_id"], body["update_id"]), body["response"]
        except (ValueError, KeyError, TypeError):
            return  # not a told answer of this version: a wake-up all the same
        if isinstance(response, str):
            self._told[key] = response
            if len(self._told) > _TOLD_HELD:
                self._told.popitem(last=False)

    def answer(self, run_id: str, update_id: str) -> str | None:
        """The response an update was answered with, if a notification told it; else None."""
        return self._told.get((run_id, update_id))

    def wait(self, timeout: float) -> bool:
        """Block until a notification arrives or ``timeout`` seconds pass.

        Notifications that arrived since the last call count: they return at
        once.
        """
        try:
            sock = self._listen()
        except OSError:
            return False
        readable, _, _ = select.select([sock], [], [], max(0.0, timeout))
        if not readable:
            return False
        self.drain()
        return True

    def notify(self, *told: bytes) -> None:
        """Wake every waiter on this file on this host, telling them the answers ``told``."""
        try:
            names = os.listdir(self.folder)
        except FileNotFoundError:
            return
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as out:
            out.setblocking(False)
            for name in names:
                path = os.path.join(self.folder, name)
                try:
                    for data in told or (_WAKE,):
                        out.sendto(data, path)
                except (ConnectionRefusedError, FileNotFoundError):
                    # Its process is gone: nobody will read this socket again.
                    with contextlib.suppress(OSError):
                        os.unlink(path)
                except OSError:
                    # Full (the waiter is already due to wake) or not ours.
                    continue

    def close(self) -> None:
        """Stop listening and remove this object's socket. Idempotent."""
        with self._lock:
            sock, path = self._sock, self._path
            self._sock = self._path = None
        if sock is not None:
            sock.close()
        if path is not None:
            with contextlib.suppress(OSError):
                os.unlink(path)
            with contextlib.suppress(OSError):
                os.rmdir(self.folder)  # only succeeds once no one else listens


class Listeners:
    """Listening channels of one topic kept for the next watcher, rather than made anew.

    Binding a socket (and removing it again) costs a watcher more than the
    read it is waiting to make; a channel given back is drained and handed to
    the next watcher of this process. At most ``keep`` are kept.
    """

    def __init__(self, key: str, topic: str, keep: int = 8) -> None:
        self._key, self._topic, self._keep = key, topic, keep
        self._free: list[Channel] = []
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._closed = False

    def take(self) -> Channel:
        """A channel listening from now on (it raises ``OSError`` if it cannot listen)."""
        with self._lock:
            if self._pid != os.getpid():
                # A forked child must not read its parent's sockets.
                self._free, self._pid = [], os.getpid()
            channel = self._free.pop() if self._free else None
        if channel is None:
            channel = Channel(self._key, self._topic)
            channel.listen()
        else:
            channel.drain()
        return channel

    def give(self, channel: Channel) -> None:
        """Keep ``channel`` for the next watcher, or close it."""
        with self._lock:
            if not self._closed and self._pid == os.getpid() and len(self._free) < self._keep:
                self._free.append(channel)
                return
        channel.close()

    def close(self) -> None:
        """Close every channel kept. Idempotent; channels given back later are closed."""
        with self._lock:
            self._closed = True
            free, self._free = self._free, []
        for channel in free:
            channel.close()
