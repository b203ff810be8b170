"""The payload layer on its own: envelopes, refusals with a code, the file payload store."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

import pytest

import perdure
from perdure import payloads


class Reverse:
    id = "reverse"

    def encode(self, data: bytes) -> bytes:
        return data[::-1]

    def decode(self, data: bytes) -> bytes:
        return data[::-1]


def test_a_codec_seals_the_json_text_and_opens_it() -> None:
    layer = payloads.Payloads(payload_codec=Reverse())
    text = layer.seal({"a": [1, 2]}, "the value")
    envelope = json.loads(text)
    assert envelope["$codec"] == "reverse"
    assert base64.b64decode(envelope["data"]) == b'{"a":[1,2]}'[::-1]
    assert layer.open_text(text) == {"a": [1, 2]}


def test_without_a_codec_values_are_stored_as_json() -> None:
    assert payloads.PLAIN.seal({"a": 1}, "x") == '{"a":1}'
    assert payloads.PLAIN.open_text('{"a":1}') == {"a": 1}


def test_envelopes_a_reader_cannot_open_are_refused_by_strict_readers_only() -> None:
    sealed = payloads.Payloads(payload_codec=Reverse()).seal("hi", "x")
    with pytest.raises(perdure.PayloadUnreadable, match="has no codec"):
        payloads.PLAIN.open_text(sealed)
    assert payloads.PLAIN.lenient().open_text(sealed) == json.loads(sealed)

    class Other(Reverse):
        id = "other"

    with pytest.raises(perdure.PayloadUnreadable, match="not by 'other'"):
        payloads.Payloads(payload_codec=Other()).open_text(sealed)


@pytest.mark.parametrize(
    "envelope",
    [
        {"$codec": 1, "data": "x"},
        {"$codec": "reverse", "data": "***"},
        {"$blob": 5},
    ],
)
def test_a_malformed_envelope_is_unreadable(envelope: object) -> None:
    layer = payloads.Payloads(
        payload_codec=Reverse(), store=payloads.FilePayloadStore("/nonexistent")
    )
    with pytest.raises(perdure.PayloadUnreadable):
        layer.open(envelope)


def test_a_codec_that_fails_to_decode_is_named() -> None:
    class Broken(Reverse):
        def decode(self, data: bytes) -> bytes:
            raise ValueError("bad token")

    sealed = payloads.Payloads(payload_codec=Reverse()).seal("hi", "x")
    with pytest.raises(perdure.PayloadUnreadable, match="bad token"):
        payloads.Payloads(payload_codec=Broken()).open_text(sealed)


def test_bad_configuration_is_refused() -> None:
    with pytest.raises(perdure.InvalidInput, match="codec must have"):
        payloads.Payloads(payload_codec=object())  # type: ignore[arg-type]
    with pytest.raises(perdure.InvalidInput, match="reserved"):
        Reverse.id = "identity"
        try:
            payloads.Payloads(payload_codec=Reverse())
        finally:
            Reverse.id = "reverse"
    with pytest.raises(perdure.InvalidInput, match="offload_above"):
        payloads.Payloads(offload_above=0)
    with pytest.raises(perdure.InvalidInput, match="newest first"):
        perdure.FernetCodec("not-a-list")
    with pytest.raises(perdure.InvalidInput, match="not a Fernet key"):
        perdure.FernetCodec(["short"])


def test_the_file_payload_store_is_content_addressed_and_atomic(tmp_path: Path) -> None:
    store = perdure.FilePayloadStore(tmp_path / "blobs")
    data = b"hello"
    digest = hashlib.sha256(data).hexdigest()
    assert store.get(digest) is None
    store.put(digest, data)
    store.put(digest, data)  # again: harmless
    assert store.get(digest) == data
    assert store.path(digest) == tmp_path / "blobs" / digest[:2] / digest
    assert not [p for p in (tmp_path / "blobs").rglob(".tmp-*")]
    store.delete(digest)
    assert store.get(digest) is None
    with pytest.raises(perdure.InvalidInput, match="SHA-256"):
        store.get("../../etc/passwd")


def test_offloading_writes_the_codecs_bytes_and_refers_to_them(tmp_path: Path) -> None:
    store = perdure.FilePayloadStore(tmp_path)
    layer = payloads.Payloads(payload_codec=Reverse(), store=store, offload_above=10)
    text = layer.seal("x" * 50, "x")
    envelope = json.loads(text)
    digest = payloads.blob_digest(envelope)
    assert digest is not None and envelope["codec"] == "reverse"
    assert store.get(digest) == json.dumps("x" * 50).encode()[::-1]
    assert layer.open_text(text) == "x" * 50
    assert layer.seal("short", "x").startswith('{"$codec"')  # under the threshold: inline
