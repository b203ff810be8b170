"""Wake idle workers on this host at once: Unix datagram sockets in a shared folder.

An embedded store has no server to push notifications, so every process that
waits for work on a database file binds a socket in a folder named after the
file; whoever makes a run ready sends one byte to each socket there. Sending
never blocks and never fails the caller: a full or dead socket is skipped
(and a dead one removed). A lost datagram costs one poll interval, nothing
more, because waiters also wake on their timeout.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import os
import select
import socket
import tempfile
import threading

_COUNTER = itertools.count()
_PREFIX = "perdure-wake-"
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
        with contextlib.suppress(BlockingIOError, InterruptedError):
            while sock.recv(64):
                pass
        return True

    def notify(self) -> None:
        """Wake every waiter on this file on this host."""
        try:
            names = os.listdir(self.folder)
        except FileNotFoundError:
            return
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as out:
            out.setblocking(False)
            for name in names:
                path = os.path.join(self.folder, name)
                try:
                    out.sendto(b"!", path)
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
