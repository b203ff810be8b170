"""A payload codec that encrypts with Fernet, keys rotated without rewriting history.

Needs the ``crypto`` extra (``pip install 'perdure[crypto]'``): ``cryptography``
is imported when a :class:`FernetCodec` is made, never by ``import perdure``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from perdure import errors


class FernetCodec:
    """Encrypt payloads with the first key; decrypt with any of them.

    Rotating keys: put the new key first and keep the old ones after it.
    Payloads written from then on use the new key; payloads already stored
    (a journal is never rewritten) are still read with the key that wrote
    them, through ``cryptography.fernet.MultiFernet``. A key may be dropped
    once no live or kept run holds a payload it wrote.

    Args:
        keys: URL-safe base64 Fernet keys (``Fernet.generate_key()``), newest first.
        id: the name stored with every payload this codec seals.
    """

    def __init__(self, keys: Sequence[str | bytes], *, id: str = "fernet") -> None:
        try:
            from cryptography.fernet import Fernet, MultiFernet
        except ImportError:  # pragma: no cover - depends on the environment
            raise errors.InvalidInput(
                "FernetCodec needs the cryptography package: pip install 'perdure[crypto]'"
            ) from None
        if isinstance(keys, str | bytes) or not keys:
            raise errors.InvalidInput("FernetCodec takes a list of keys, newest first")
        try:
            self._fernet: Any = MultiFernet([Fernet(key) for key in keys])
        except (ValueError, TypeError) as exc:
            raise errors.InvalidInput(f"not a Fernet key: {exc}") from None
        self.id = id

    def __repr__(self) -> str:
        return f"FernetCodec(id={self.id!r})"

    def encode(self, data: bytes) -> bytes:
        token: bytes = self._fernet.encrypt(data)
        return token

    def decode(self, data: bytes) -> bytes:
        plain: bytes = self._fernet.decrypt(data)
        return plain
