"""Static checks of the payload codec and payload store protocols; mypy reads this, nothing runs it.

A class of the right shape is a ``PayloadCodec`` (or ``PayloadStore``)
without inheriting from it; one of another shape is an error.
"""

from __future__ import annotations

import perdure


class Rot13Bytes:
    id = "rot"

    def encode(self, data: bytes) -> bytes:
        return bytes((b + 13) % 256 for b in data)

    def decode(self, data: bytes) -> bytes:
        return bytes((b - 13) % 256 for b in data)


class Memory:
    def __init__(self) -> None:
        self.blobs: dict[str, bytes] = {}

    def put(self, digest: str, data: bytes) -> None:
        self.blobs[digest] = data

    def get(self, digest: str) -> bytes | None:
        return self.blobs.get(digest)


class TextCodec:
    id = "text"

    def encode(self, data: str) -> str:
        return data

    def decode(self, data: str) -> str:
        return data


perdure.App("sqlite:///typing.db", codec=Rot13Bytes(), payload_store=Memory())
perdure.App(
    "sqlite:///typing.db",
    codec=perdure.FernetCodec([b"key"]),
    payload_store=perdure.FilePayloadStore("/tmp/blobs"),
    offload_above=1024,
)
perdure.App("sqlite:///typing.db", codec=TextCodec())  # type: ignore[arg-type]
