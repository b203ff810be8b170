"""Conformance: send and next_message: channel messages."""

from __future__ import annotations

import uuid

import pytest

from perdure import errors
from perdure.store import port
from perdure.testing import clock as clocks
from perdure.testing.conformance.harness import (
    Suite,
    claim_run,
    messages,
    start,
)


class ChannelTests(Suite):
    """The conformance tests of send and next_message: channel messages."""

    # == send and channels =================================================

    def test_send_deduplicates_by_run_channel_and_key(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        run = start(store)
        other = start(store)
        assert store.send(port.NewMessage(run.run_id, "inbox", "k", "1")) is True
        assert store.send(port.NewMessage(run.run_id, "inbox", "k", "2")) is False
        assert store.send(port.NewMessage(run.run_id, "outbox", "k", "3")) is True
        assert store.send(port.NewMessage(other.run_id, "inbox", "k", "4")) is True
        [stored] = messages(store, run.run_id, "inbox")
        assert (stored.run_id, stored.channel, stored.key, stored.payload, stored.at) == (
            run.run_id,
            "inbox",
            "k",
            "1",
            clock.now(),
        )
        assert [m.payload for m in messages(store, run.run_id, "outbox")] == ["3"]
        assert [m.payload for m in messages(store, other.run_id, "inbox")] == ["4"]

    def test_messages_keep_their_send_order(self, store: port.Store) -> None:
        run = start(store)
        for channel, key in [("a", "1"), ("b", "1"), ("a", "2"), ("a", "3")]:
            assert store.send(port.NewMessage(run.run_id, channel, key, f'"{channel}{key}"'))
        on_a = messages(store, run.run_id, "a")
        on_b = messages(store, run.run_id, "b")
        assert [m.key for m in on_a] == ["1", "2", "3"]
        assert on_a[0].sequence < on_b[0].sequence < on_a[1].sequence < on_a[2].sequence
        assert store.next_message(run.run_id, "a", on_a[0].sequence) == on_a[1]
        assert store.next_message(run.run_id, "a", on_a[0].sequence + 1) == on_a[1]
        assert store.next_message(run.run_id, "a", on_a[2].sequence) is None

    def test_channel_names_match_exactly(self, store: port.Store) -> None:
        run = start(store)
        for channel in ("ab", "a%", "A", "a_"):
            assert store.send(port.NewMessage(run.run_id, channel, "k", f'"{channel}"'))
        assert store.next_message(run.run_id, "a", 0) is None
        assert [m.payload for m in messages(store, run.run_id, "a%")] == ['"a%"']
        assert [m.payload for m in messages(store, run.run_id, "a_")] == ['"a_"']

    def test_send_refusals(self, store: port.Store) -> None:
        missing = str(uuid.uuid4())
        with pytest.raises(errors.RunNotFound):
            store.send(port.NewMessage(missing, "inbox", "k", "1"))
        run = start(store)
        claim = claim_run(store, run).claim
        store.finish(claim, [], state="failed", error='{"code": "x"}')
        with pytest.raises(errors.RunFinished) as finished:
            store.send(port.NewMessage(run.run_id, "inbox", "k", "1"))
        assert finished.value.state == "failed"
        assert store.next_message(run.run_id, "inbox", 0) is None
