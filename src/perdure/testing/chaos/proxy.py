"""A loopback TCP proxy between PostgreSQL clients and the server that breaks connections.

Each accepted connection (a :class:`Link`) is relayed by two threads. Faults:

* ``latency``: seconds added before every chunk relayed, both ways;
* :meth:`Link.reset`: both sockets closed with ``SO_LINGER`` 0 (a TCP RST);
* :meth:`Link.blackhole`: nothing relayed for ``seconds`` (the bytes stay
  unread, no error on either side), then a reset, as a middlebox dropping a
  flow and timing it out;
* :meth:`Proxy.cut_after_commit`: the next ``COMMIT`` a client sends is
  relayed to the server, and when the server's answer comes back the link is
  reset instead of relaying it: the transaction committed, and the client
  cannot know it did (an *ambiguous commit*).

``COMMIT`` is recognised in the frontend stream of the PostgreSQL protocol
v3: after the untyped startup packets (an SSL or GSS request, then the
startup message), every message is a type byte and a big-endian int32 length
that counts itself. A ``Q`` (simple query) whose text, or a ``P`` (parse)
whose statement, starts with ``COMMIT`` or ``END`` is a commit. The proxy
cannot read TLS, so its URL asks for ``sslmode=disable`` (:meth:`Proxy.url`).
"""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import threading
import time
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

_UNTYPED_REQUESTS = (80877103, 80877104)  # SSLRequest, GSSENCRequest: the startup follows
_SLICE = 0.05


def is_commit(kind: bytes, body: bytes) -> bool:
    """Tell whether a frontend message (type byte, body after the length) commits."""
    if kind == b"Q":
        text = body
    elif kind == b"P":
        _name, _, text = body.partition(b"\0")
    else:
        return False
    words = text.split(b"\0", 1)[0].strip().upper()
    return words.startswith((b"COMMIT", b"END"))


class FrontendParser:
    """Split a client's byte stream into whole protocol messages."""

    def __init__(self) -> None:
        self._buffer = b""
        self._startup = True

    def feed(self, data: bytes) -> list[tuple[bytes, bytes]]:
        """Return the messages ``data`` completes: (type, raw bytes); type b"" at startup."""
        self._buffer += data
        found: list[tuple[bytes, bytes]] = []
        while True:
            if self._startup:
                if len(self._buffer) < 8:
                    return found
                (length,) = struct.unpack("!i", self._buffer[:4])
                if len(self._buffer) < length:
                    return found
                (code,) = struct.unpack("!i", self._buffer[4:8])
                self._startup = code in _UNTYPED_REQUESTS
                found.append((b"", self._buffer[:length]))
                self._buffer = self._buffer[length:]
                continue
            if len(self._buffer) < 5:
                return found
            (length,) = struct.unpack("!i", self._buffer[1:5])
            if len(self._buffer) < 1 + length:
                return found
            found.append((self._buffer[:1], self._buffer[: 1 + length]))
            self._buffer = self._buffer[1 + length :]


class Link:
    """One client connection relayed to the server."""

    def __init__(self, proxy: Proxy, client: socket.socket, server: socket.socket) -> None:
        self.proxy = proxy
        self.client = client
        self.server = server
        self.commits = 0
        self.closed = threading.Event()
        self._holed = threading.Event()
        self._cut = threading.Event()
        self._parser = FrontendParser()
        self._lock = threading.Lock()

    def start(self) -> None:
        for source, sink, up in (
            (self.client, self.server, True),
            (self.server, self.client, False),
        ):
            threading.Thread(target=self._pump, args=(source, sink, up), daemon=True).start()

    def reset(self) -> None:
        """Close both sockets with a TCP RST."""
        with self._lock:
            if self.closed.is_set():
                return
            self.closed.set()
            for sock in (self.client, self.server):
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                with contextlib.suppress(OSError):
                    sock.close()

    def blackhole(self, seconds: float) -> None:
        """Relay nothing for ``seconds``, then reset."""
        self._holed.set()
        timer = threading.Timer(seconds, self.reset)
        timer.daemon = True
        timer.start()

    def _pump(self, source: socket.socket, sink: socket.socket, up: bool) -> None:
        try:
            while not self.closed.is_set():
                if self._holed.is_set():
                    time.sleep(_SLICE)
                    continue
                readable, _, _ = select.select([source], [], [], _SLICE)
                if not readable or self._holed.is_set():
                    continue
                data = source.recv(65536)
                if not data:
                    break
                if self.proxy.latency:
                    time.sleep(self.proxy.latency)
                if not up:
                    if self._cut.is_set():
                        # The server answered the COMMIT (it is done): the client never hears.
                        self.reset()
                        return
                    sink.sendall(data)
                    continue
                for kind, raw in self._parser.feed(data):
                    sink.sendall(raw)
                    if is_commit(kind, raw[5:]):
                        self.commits += 1
                        if self.proxy.take_cut():
                            self._cut.set()
        except (OSError, ValueError):
            pass
        # One side ended: end the other (a plain close, as a peer going away does).
        with self._lock:
            if not self.closed.is_set():
                self.closed.set()
                for sock in (self.client, self.server):
                    with contextlib.suppress(OSError):
                        sock.close()


class Proxy:
    """Relay 127.0.0.1:``port`` to ``upstream``; inject faults into the links.

    Use it as a context manager, or :meth:`start` and :meth:`close`.
    """

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.latency = 0.0
        self.links: list[Link] = []
        self.cuts = 0
        """Links reset right after relaying a COMMIT (ambiguous commits)."""
        self._armed = 0
        self._lock = threading.Lock()
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._stopped = threading.Event()

    @classmethod
    def to(cls, url: str) -> Proxy:
        """Return a proxy (not started) to the server of the PostgreSQL ``url``."""
        parts = urlsplit(url)
        return cls(parts.hostname or "127.0.0.1", parts.port or 5432)

    def url(self, url: str) -> str:
        """Return ``url`` pointed at the proxy, with TLS off (the proxy reads the stream)."""
        parts = urlsplit(url)
        user = parts.netloc.rpartition("@")[0]
        netloc = f"{user}@127.0.0.1:{self.port}" if user else f"127.0.0.1:{self.port}"
        query = dict(parse_qsl(parts.query))
        query["sslmode"] = "disable"
        return urlunsplit(parts._replace(netloc=netloc, query=urlencode(query)))

    def start(self) -> Proxy:
        self._listener.listen(128)
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def __enter__(self) -> Proxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def live(self) -> list[Link]:
        """Return the links still open."""
        with self._lock:
            self.links = [link for link in self.links if not link.closed.is_set()]
            return list(self.links)

    def cut_after_commit(self, times: int = 1) -> None:
        """Reset the link of each of the next ``times`` COMMITs, right after relaying it."""
        with self._lock:
            self._armed += times

    def take_cut(self) -> bool:
        """Use one armed cut, if any (called by a link that just relayed a COMMIT)."""
        with self._lock:
            if self._armed <= 0:
                return False
            self._armed -= 1
            self.cuts += 1
            return True

    def close(self) -> None:
        """Stop accepting and reset every link."""
        self._stopped.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        for link in self.live():
            link.reset()

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream, timeout=10)
                server.settimeout(None)
            except OSError:
                client.close()
                continue
            for sock in (client, server):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            link = Link(self, client, server)
            with self._lock:
                self.links.append(link)
            link.start()
