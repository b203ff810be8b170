"""The journal bodies of ``first`` entries: what they hold, and the shapes they refuse."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from perdure import codec, journal

AT = datetime(2030, 1, 1, tzinfo=UTC)


def test_opened_keeps_one_deadline_per_source_and_the_timeout() -> None:
    opened = journal.FirstOpened((None, AT, None), AT)
    assert journal.FirstOpened.decode(opened.encode()) == opened
    assert journal.FirstOpened.decode(journal.FirstOpened((), None).encode()).deadlines == ()


@pytest.mark.parametrize(
    "fired",
    [
        journal.FirstFired(
            0,
            "signal",
            "exit#2",
            {"payload": [1], "signal_id": "s", "at": AT.isoformat(), "digest": "d"},
        ),
        journal.FirstFired(1, "message", "inbox", {"key": "k", "payload": None, "sequence": 3}),
        journal.FirstFired(2, "update", "add", {"update_id": "u", "payload": {}, "sequence": 1}),
        journal.FirstFired(3, "child", "run-1", {"state": "succeeded", "result": 5, "error": None}),
        journal.FirstFired(4, "timer", None, None),
    ],
)
def test_fired_round_trips(fired: journal.FirstFired) -> None:
    assert journal.FirstFired.decode(fired.encode()) == fired


def test_fired_reads_the_winners_own_bodies() -> None:
    signal = journal.FirstFired(
        0,
        "signal",
        "exit",
        {"payload": "bye", "signal_id": None, "at": AT.isoformat(), "digest": None},
    )
    assert (signal.signaled().payload, signal.signaled().at) == ("bye", AT)
    message = journal.FirstFired(0, "message", "m", {"key": "k", "payload": 1, "sequence": 2})
    assert message.received() == journal.Received("k", 1, 2)
    child = journal.FirstFired(
        0, "child", "r", {"state": "failed", "result": None, "error": {"code": "x"}}
    )
    assert (child.child().state, child.child().error) == ("failed", {"code": "x"})


@pytest.mark.parametrize(
    "body",
    [
        {"index": 0, "kind": "sleep", "name": "x", "value": {}},
        {"index": -1, "kind": "timer", "name": None, "value": None},
        {"index": True, "kind": "timer", "name": None, "value": None},
        {"index": 0, "kind": "timer", "name": "x", "value": None},
        {"index": 0, "kind": "signal", "name": None, "value": {}},
        {"index": 0, "kind": "message", "name": "m", "value": [1]},
        {"kind": "timer", "name": None, "value": None},
        [0, "timer"],
    ],
)
def test_fired_refuses_other_shapes(body: object) -> None:
    with pytest.raises(ValueError):
        journal.FirstFired.decode(codec.encode(body))


def test_ended_round_trips_and_refuses_unknown_codes() -> None:
    ended = journal.FirstEnded("canceled", "wait 'exit' canceled", 0, "exit")
    assert journal.FirstEnded.decode(ended.encode()) == ended
    timeout = journal.FirstEnded("wait_timeout", "no source fired")
    assert journal.FirstEnded.decode(timeout.encode()) == timeout
    with pytest.raises(ValueError):
        journal.FirstEnded.decode(codec.encode({"code": "boom", "message": "m"}))
