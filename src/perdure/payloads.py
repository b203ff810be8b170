"""The one layer every payload crosses: size bound, codec, and offload to a payload store.

A payload (a run's inputs or result, a step's output, a signal, a message, an
update and its answer, an event, a stream item) is JSON text in the store.
With an app's :class:`PayloadCodec` the text is sealed before it is stored:
the codec turns the JSON text's bytes into other bytes (encrypted,
compressed), kept in an *envelope*, itself a JSON value, so that both stores
hold it in the columns they already have and the records around it (a
journal body, a child's outcome) carry it like any other value::

    {"$codec": "fernet", "data": "<base64 of the codec's bytes>"}

Above ``offload_above`` bytes, with a :class:`PayloadStore`, the bytes go to
the payload store and the envelope keeps a reference and their digest::

    {"$blob": "sha256:<hex>", "size": 1048576, "codec": "fernet"}   # or "codec": null

The engine never reads inside an envelope: it is sealed where a value comes
in (a client's call, a step's return, ``ctx.set_event``) and opened where a
value goes out (to workflow code, to a client's caller). ``payload_limit``
bounds the plaintext JSON, before the codec, offloaded or not.

A payload that is itself an object with a ``"$codec"`` or ``"$blob"`` key is
kept in an envelope of the ``identity`` codec, so it is never misread.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from perdure import codec, errors

DEFAULT_OFFLOAD_ABOVE = 256 * 1024
"""Sealed payloads longer than this many bytes go to the payload store (256 KiB)."""

OFFLOAD_PAYLOAD_LIMIT = 64 * 1024 * 1024
"""The default ``payload_limit`` of an app with a payload store (64 MiB)."""

IDENTITY = "identity"


@runtime_checkable
class PayloadCodec(Protocol):
    """Turns a payload's bytes into the bytes stored, and back.

    ``id`` names the codec in every payload it seals, so that a reader knows
    which codec wrote it. Rotating keys keeps the id: the codec's ``decode``
    must accept what older keys wrote (see :class:`perdure.fernet.FernetCodec`).
    """

    id: str

    def encode(self, data: bytes) -> bytes:
        """Return the stored form of ``data`` (the UTF-8 JSON text of a payload)."""
        ...

    def decode(self, data: bytes) -> bytes:
        """Return the bytes ``encode`` was given.

        Raises:
            Exception: the bytes cannot be decoded (a key is missing, they were altered).
        """
        ...


@runtime_checkable
class PayloadStore(Protocol):
    """Holds large payloads' bytes, by their SHA-256 digest (hex)."""

    def put(self, digest: str, data: bytes) -> None:
        """Keep ``data`` under ``digest`` (writing the same digest twice is harmless)."""
        ...

    def get(self, digest: str) -> bytes | None:
        """Return the bytes kept under ``digest``, or None when there are none."""
        ...


class FilePayloadStore:
    """A :class:`PayloadStore` in a directory: one file per digest, written atomically.

    Files are named ``<dir>/<first two hex digits>/<digest>``; a file is
    written to a temporary name, flushed to disk and renamed, so a reader
    never sees half of one. Every worker and client of an app must see the
    same directory (a shared volume).
    """

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)

    def __repr__(self) -> str:
        return f"FilePayloadStore({str(self.directory)!r})"

    def path(self, digest: str) -> Path:
        if len(digest) != 64 or not all(c in "0123456789abcdef" for c in digest):
            raise errors.InvalidInput(f"{digest!r} is not a SHA-256 digest in hex")
        return self.directory / digest[:2] / digest

    def put(self, digest: str, data: bytes) -> None:
        target = self.path(digest)
        if target.exists():
            return  # content-addressed: the same digest holds the same bytes
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(dir=target.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
            os.replace(temp, target)
        except BaseException:
            Path(temp).unlink(missing_ok=True)
            raise

    def get(self, digest: str) -> bytes | None:
        try:
            return self.path(digest).read_bytes()
        except FileNotFoundError:
            return None

    def delete(self, digest: str) -> None:
        """Remove the bytes kept under ``digest``, if any."""
        self.path(digest).unlink(missing_ok=True)


def sealed(value: Any) -> bool:
    """Whether a decoded JSON value is an envelope (a sealed or offloaded payload)."""
    return isinstance(value, dict) and ("$codec" in value or "$blob" in value)


def blob_digest(value: Any) -> str | None:
    """Return the digest (hex) an offloaded payload's envelope refers to, else None."""
    if isinstance(value, dict) and isinstance(value.get("$blob"), str):
        ref: str = value["$blob"]
        return ref.removeprefix("sha256:")
    return None


def _looks_sealed(text: str) -> bool:
    """Whether JSON ``text`` is an object an opener would take for an envelope."""
    # The substring tests are cheap and rule out nearly every payload.
    return (
        text.startswith("{")
        and ('"$codec"' in text or '"$blob"' in text)
        and sealed(codec.decode(text))
    )


class Payloads:
    """An app's payload layer: its size bound, its codec and its payload store.

    ``strict`` readers (workers) refuse an envelope they cannot open; others
    (a client without the codec, the command line, the console) give the
    envelope back as it is stored, so an operator sees ciphertext, not an error.
    """

    def __init__(
        self,
        limit: int = codec.DEFAULT_PAYLOAD_LIMIT,
        payload_codec: PayloadCodec | None = None,
        store: PayloadStore | None = None,
        offload_above: int = DEFAULT_OFFLOAD_ABOVE,
        *,
        strict: bool = True,
    ) -> None:
        if limit < 1:
            raise errors.InvalidInput(f"payload_limit must be at least 1, got {limit}")
        if offload_above < 1:
            raise errors.InvalidInput(f"offload_above must be at least 1, got {offload_above}")
        if payload_codec is not None:
            if not isinstance(payload_codec, PayloadCodec):
                raise errors.InvalidInput("codec must have an id, encode(bytes) and decode(bytes)")
            codec.check_text("a codec id", payload_codec.id, limit=100)
            if payload_codec.id == IDENTITY:
                raise errors.InvalidInput(f"the codec id {IDENTITY!r} is reserved")
        if store is not None and not isinstance(store, PayloadStore):
            raise errors.InvalidInput("payload_store must have put(digest, data) and get(digest)")
        self.limit = limit
        self.codec = payload_codec
        self.store = store
        self.offload_above = offload_above
        self.strict = strict

    @property
    def plain(self) -> bool:
        """Whether payloads are stored as they are (no codec, no payload store)."""
        return self.codec is None and self.store is None

    def lenient(self) -> Payloads:
        """Return this layer for readers that show what they cannot open."""
        return Payloads(self.limit, self.codec, self.store, self.offload_above, strict=False)

    # -- in ---------------------------------------------------------------------

    def seal(self, value: Any, what: str, *, envelope: int = 0) -> str:
        """Return ``value`` as the JSON text to store.

        Raises:
            errors.InvalidPayload: not a JSON value, or nested too deeply.
            errors.PayloadTooLarge: its JSON is over the limit.
        """
        return self.seal_text(codec.encode(value, envelope=envelope), what)

    def seal_text(self, text: str, what: str) -> str:
        """Return the JSON text ``text`` as it is stored (sealed, maybe offloaded)."""
        codec.check_size(text, self.limit, what)
        if self.plain and not _looks_sealed(text):
            return text
        data = text.encode("utf-8")
        codec_id: str | None = None
        if self.codec is not None:
            data = self.codec.encode(data)
            codec_id = self.codec.id
        if self.store is not None and len(data) > self.offload_above:
            digest = hashlib.sha256(data).hexdigest()
            self.store.put(digest, data)
            return codec.encode({"$blob": f"sha256:{digest}", "size": len(data), "codec": codec_id})
        if codec_id is None:
            if not _looks_sealed(text):
                return text
            codec_id = IDENTITY
        return codec.encode({"$codec": codec_id, "data": base64.b64encode(data).decode("ascii")})

    def sealed_value(self, value: Any, what: str) -> Any:
        """Return ``value`` as the JSON value a record embeds (an envelope when sealed)."""
        return codec.decode(self.seal(value, what))

    # -- out --------------------------------------------------------------------

    def open_text(self, text: str | None) -> Any:
        """Decode stored JSON text and open it if it is an envelope."""
        return self.open(codec.decode(text or "null"))

    def open(self, value: Any) -> Any:
        """Return the payload an envelope holds (any other value as it is).

        Raises:
            errors.PayloadUnreadable: a strict reader cannot open it (no codec,
                another codec, a key it lacks, altered bytes).
            errors.PayloadMissing: its bytes are not in the payload store.
            errors.PayloadDigestMismatch: the payload store's bytes are not the ones referred to.
        """
        if not isinstance(value, dict):
            return value
        if "$blob" in value:
            return self._open_blob(value)
        if "$codec" not in value:
            return value
        codec_id, data = value.get("$codec"), value.get("data")
        if not isinstance(codec_id, str) or not isinstance(data, str):
            raise errors.PayloadUnreadable("a sealed payload's envelope is not of its shape")
        if codec_id != IDENTITY and self.codec is None and not self.strict:
            return value
        try:
            raw = base64.b64decode(data.encode("ascii"), validate=True)
        except (binascii.Error, ValueError, UnicodeEncodeError) as exc:
            raise errors.PayloadUnreadable(f"a sealed payload is not base64: {exc}") from None
        return self._decoded(codec_id, raw)

    def reveal(self, value: Any) -> Any:
        """Return a decoded JSON value with every envelope inside it opened, for display.

        A journal body or an outcome carries payloads at places only its kind
        knows; an operator's view opens them wherever they are. What cannot be
        opened is shown as stored.
        """
        if isinstance(value, list):
            return [self.reveal(item) for item in value]
        if not isinstance(value, dict):
            return value
        if sealed(value):
            try:
                return self.lenient().open(value)
            except errors.PayloadUnreadable:
                return value
        return {key: self.reveal(item) for key, item in value.items()}

    def _decoded(self, codec_id: str | None, raw: bytes) -> Any:
        if codec_id is not None and codec_id != IDENTITY:
            if self.codec is None:
                raise errors.PayloadUnreadable(
                    f"the payload was sealed by codec {codec_id!r} and this app has no codec "
                    "(App(codec=...), or --codec on the command line)"
                )
            if codec_id != self.codec.id:
                raise errors.PayloadUnreadable(
                    f"the payload was sealed by codec {codec_id!r}, not by {self.codec.id!r}"
                )
            try:
                raw = self.codec.decode(raw)
            except Exception as exc:
                raise errors.PayloadUnreadable(
                    f"codec {codec_id!r} cannot decode the payload ({type(exc).__name__}: {exc})"
                ) from None
        try:
            return codec.decode(raw.decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise errors.PayloadUnreadable(f"a decoded payload is not UTF-8: {exc}") from None

    def _open_blob(self, value: dict[str, Any]) -> Any:
        digest, codec_id = blob_digest(value), value.get("codec")
        if digest is None or not (codec_id is None or isinstance(codec_id, str)):
            raise errors.PayloadUnreadable("an offloaded payload's envelope is not of its shape")
        if self.store is None or (codec_id is not None and self.codec is None):
            if not self.strict:
                return value
            if self.store is None:
                raise errors.PayloadUnreadable(
                    f"the payload sha256:{digest} is in a payload store and this app has none "
                    "(App(payload_store=...))"
                )
        assert self.store is not None
        data = self.store.get(digest)
        if data is None:
            raise errors.PayloadMissing(f"the payload store has no payload sha256:{digest}")
        found = hashlib.sha256(data).hexdigest()
        if found != digest:
            raise errors.PayloadDigestMismatch(
                f"the payload store's bytes for sha256:{digest} have digest sha256:{found}"
            )
        return self._decoded(codec_id, data)


PLAIN = Payloads()
"""The layer of an app with no codec and no payload store, at the default limit."""
