"""JournalCursor: matching a workflow's calls against its recorded journal (no I/O)."""

from __future__ import annotations

import pytest

from perdure import errors, replay
from perdure.store import port


def entry(
    position: int, name: str, kind: str = "step", status: str = "ok", output: str | None = "null"
) -> port.JournalEntry:
    return port.JournalEntry(position, kind, name, status, output)  # type: ignore[arg-type]


def step(name: str) -> replay.Call:
    return replay.Call("step", name)


def test_replays_matching_entries_in_order_then_executes() -> None:
    journal = [entry(1, "reserve", output='{"cents":5}'), entry(2, "now", kind="now", output='"t"')]
    cursor = replay.JournalCursor("r1", journal)
    assert cursor.position == 0
    assert cursor.replaying

    first = cursor.next(step("reserve"))
    assert first == journal[0]
    assert cursor.position == 1
    assert cursor.replaying

    second = cursor.next(replay.Call("now", "now"))
    assert second == journal[1]
    assert cursor.position == 2
    assert not cursor.replaying

    # Past the end: nothing recorded, so the call executes; the position still advances.
    assert cursor.next(step("charge")) is None
    assert cursor.position == 3
    assert cursor.next(step("ship")) is None
    assert cursor.position == 4


def test_empty_journal_executes_everything() -> None:
    cursor = replay.JournalCursor("r1", [])
    assert not cursor.replaying
    assert cursor.next(step("a")) is None
    assert cursor.position == 1


@pytest.mark.parametrize(
    ("recorded", "attempted", "recorded_text", "attempted_text"),
    [
        (entry(1, "reserve"), step("charge"), "step 'reserve'", "step 'charge'"),
        (entry(1, "sleep", kind="sleep"), step("sleep"), "sleep 'sleep'", "step 'sleep'"),
        (entry(1, "charge"), step("charge#2"), "step 'charge'", "step 'charge#2'"),
    ],
)
def test_mismatch_raises_non_determinism_naming_both_calls(
    recorded: port.JournalEntry, attempted: replay.Call, recorded_text: str, attempted_text: str
) -> None:
    cursor = replay.JournalCursor("run-7", [recorded])
    with pytest.raises(errors.NonDeterminism) as caught:
        cursor.next(attempted)
    message = str(caught.value)
    assert recorded_text in message
    assert attempted_text in message
    assert "run-7" in message
    assert "position 1" in message
    assert caught.value.code == "non_determinism"


def test_mismatch_at_a_later_position_names_that_position() -> None:
    cursor = replay.JournalCursor("r", [entry(1, "a"), entry(2, "b")])
    cursor.next(step("a"))
    with pytest.raises(errors.NonDeterminism, match="position 2"):
        cursor.next(step("c"))


def test_step_keys_number_repeated_calls() -> None:
    cursor = replay.JournalCursor("r", [])
    assert cursor.step_key("charge") == "charge"
    assert cursor.step_key("charge") == "charge#2"
    assert cursor.step_key("reserve") == "reserve"
    assert cursor.step_key("charge") == "charge#3"
    assert cursor.step_key("reserve") == "reserve#2"


@pytest.mark.parametrize(
    ("positions", "invariant"),
    [
        ([2], "journal_gap"),
        ([1, 3], "journal_gap"),
        ([1, 2, 4, 5], "journal_gap"),
        ([1, 1], "journal_duplicate_position"),
        ([1, 2, 2, 3], "journal_duplicate_position"),
        ([0], "journal_duplicate_position"),
    ],
)
def test_gaps_and_duplicates_are_corrupt_state(positions: list[int], invariant: str) -> None:
    journal = [entry(p, f"s{i}") for i, p in enumerate(positions)]
    with pytest.raises(errors.CorruptState) as caught:
        replay.JournalCursor("run-9", journal)
    assert caught.value.invariant == invariant
    assert caught.value.run_id == "run-9"
    assert caught.value.code == "corrupt_state"
    assert "run-9" in str(caught.value)


def test_continuous_journal_is_accepted() -> None:
    cursor = replay.JournalCursor("r", [entry(i, f"s{i}") for i in range(1, 6)])
    assert cursor.replaying


def test_rewind_replays_from_the_top_with_fresh_step_keys() -> None:
    journal = [entry(1, "a"), entry(2, "a#2")]
    cursor = replay.JournalCursor("r", journal)
    assert cursor.next(step(cursor.step_key("a"))) == journal[0]
    assert cursor.next(step(cursor.step_key("a"))) == journal[1]
    assert cursor.next(step(cursor.step_key("b"))) is None

    cursor.rewind()
    assert cursor.position == 0
    assert cursor.replaying
    assert cursor.step_key("a") == "a"
    assert cursor.next(step("a")) == journal[0]


def test_recorded_entries_are_replayed_after_rewind() -> None:
    cursor = replay.JournalCursor("r", [entry(1, "a")])
    cursor.next(step("a"))
    assert cursor.next(step("b")) is None
    written = entry(2, "b", output='"B"')
    cursor.record(written)
    assert cursor.entries() == [entry(1, "a"), written]

    cursor.rewind()
    cursor.next(step("a"))
    assert cursor.next(step("b")) == written


def test_record_replaces_a_started_entry_and_refuses_a_gap() -> None:
    started = entry(1, "charge", status="started", output=None)
    cursor = replay.JournalCursor("r", [started])
    done = entry(1, "charge", output='"ch_1"')
    cursor.record(done)
    assert cursor.entries() == [done]
    with pytest.raises(errors.CorruptState) as caught:
        cursor.record(entry(3, "late"))
    assert caught.value.invariant == "journal_gap"


def test_entries_returns_a_copy() -> None:
    cursor = replay.JournalCursor("r", [entry(1, "a")])
    cursor.entries().clear()
    assert len(cursor.entries()) == 1


def test_call_describe() -> None:
    assert replay.Call("step", "charge#2").describe() == "step 'charge#2'"
