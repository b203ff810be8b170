"""Every invariant of perdure.validation, each broken on purpose and refused."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from perdure import errors, validation
from perdure.store import port

T0 = datetime(2030, 1, 1, tzinfo=UTC)


def make_run(**changes: Any) -> port.Run:
    run = port.Run(
        run_id="r1",
        app="a",
        workflow="wf",
        version="1",
        state="running",
        input='{"args":[]}',
        result=None,
        error=None,
        key=None,
        parent_id=None,
        generation=2,
        failures=0,
        worker="host-1-abc",
        lease_expires_at=T0 + timedelta(seconds=30),
        ready_at=None,
        cancel_requested=False,
        ledger_sequence=3,
        created_at=T0,
        updated_at=T0,
    )
    return dataclasses.replace(run, **changes)


def entry(position: int, **changes: Any) -> port.JournalEntry:
    base = port.JournalEntry(position, "step", f"s{position}", "ok", '"x"')
    return dataclasses.replace(base, **changes)


def receipt(
    sequence: int, kind: str = "claimed", generation: int = 1, **changes: Any
) -> port.LedgerEntry:
    base = port.LedgerEntry("r1", sequence, kind, T0, generation, "host-1-abc", None, None, None)
    return dataclasses.replace(base, **changes)


def outcome(name: str, **changes: Any) -> port.Outcome:
    base = port.Outcome("r1", name, "signaled", "sig", '{"ok":1}', "d", T0)
    return dataclasses.replace(base, **changes)


def refused(invariant: str) -> Any:
    return pytest.raises(errors.CorruptState, match=f"invariant {invariant}")


# -- runs ---------------------------------------------------------------------


def test_a_sound_run_passes() -> None:
    validation.run(make_run(), max_failures=8)
    validation.run(make_run(state="queued", worker=None, lease_expires_at=None), max_failures=8)


@pytest.mark.parametrize(
    ("changes", "invariant"),
    [
        ({"state": "paused"}, "run_state"),
        ({"generation": -1}, "run_generation"),
        ({"failures": -1}, "run_failures"),
        ({"failures": 9}, "run_failures"),
        ({"ledger_sequence": -2}, "run_ledger_sequence"),
        ({"worker": "has space"}, "run_worker_id"),
        ({"worker": "x" * 129}, "run_worker_id"),
        ({"worker": ""}, "run_worker_id"),
        ({"worker": None}, "run_claim"),
        ({"lease_expires_at": None}, "run_claim"),
        ({"generation": 0}, "run_claim"),
        ({"input": "{not json"}, "run_input_json"),
        ({"state": "succeeded", "result": "[1,", "worker": None}, "run_result_json"),
        ({"state": "failed", "error": "{", "worker": None}, "run_error_json"),
    ],
)
def test_a_broken_run_is_refused(changes: dict[str, Any], invariant: str) -> None:
    with refused(invariant) as caught:
        validation.run(make_run(**changes), max_failures=8)
    assert caught.value.run_id == "r1"
    assert caught.value.invariant == invariant


# -- journal ------------------------------------------------------------------


def test_a_sound_journal_passes() -> None:
    validation.journal("r1", [])
    validation.journal("r1", [entry(1), entry(2, kind="sleep"), entry(3, status="started")])
    validation.journal("r1", [entry(1, kind="wait", status="started", output='{"deadline":null}')])
    attempts = '{"attempts":[{"attempt":1,"code":"step_failed","type":"E","message":"m"}]}'
    old_error = '{"type":"E","message":"m","code":"step_failed"}'
    validation.journal("r1", [entry(1, error=attempts), entry(2, status="error", error=old_error)])
    validation.journal("r1", [entry(1, kind="wait", status="error", error='{"code":"x"}')])
    validation.journal("r1", [entry(1, kind="event", name="status", output='{"value":"open"}')])


@pytest.mark.parametrize(
    ("entries", "invariant"),
    [
        ([entry(2)], "journal_gap"),
        ([entry(1), entry(1)], "journal_duplicate_position"),
        ([entry(1), entry(3)], "journal_gap"),
        ([entry(1, kind="teleport")], "journal_kind"),
        ([entry(1, status="maybe")], "journal_status"),
        ([entry(1, kind="now", status="started")], "journal_status"),
        ([entry(1, name="")], "journal_name"),
        ([entry(1, attempt=0)], "journal_attempt"),
        ([entry(1, output="{oops")], "journal_output_json"),
        ([entry(1, status="error", output=None, error="nope")], "journal_error_json"),
        ([entry(1, status="started"), entry(2)], "journal_started_not_last"),
        ([entry(1, error='{"attempts":{}}')], "journal_attempts_shape"),
        ([entry(1, error='{"attempts":[{"attempt":0}]}')], "journal_attempts_shape"),
        ([entry(1, status="error", error='"text"')], "journal_attempts_shape"),
        ([entry(1, kind="event", name="status", output='{"no_value":1}')], "journal_body"),
    ],
)
def test_a_broken_journal_is_refused(entries: list[port.JournalEntry], invariant: str) -> None:
    with refused(invariant):
        validation.journal("r1", entries)


# -- outcomes -----------------------------------------------------------------


def test_sound_outcomes_pass() -> None:
    child = entry(1, kind="child", name="ship", output='{"run_id":"c9"}')
    validation.outcomes("r1", [outcome("approval"), outcome("child:c9")], [child])
    validation.outcomes("r1", [outcome("late", payload=None, outcome="timed_out")], [])
    # A child created by an attempt that died before journaling it, vouched for by the store.
    validation.outcomes("r1", [outcome("child:c9")], [], ["c9"])
    # Several children's outcomes: the journal is walked for them once.
    other = entry(2, kind="child", name="pack", output='{"run_id":"c10"}')
    validation.outcomes("r1", [outcome("child:c9"), outcome("child:c10")], [child, other])


def test_unjournaled_children_are_those_outcomes_name_and_the_journal_does_not() -> None:
    child = entry(1, kind="child", name="ship", output='{"run_id":"c9"}')
    found = [outcome("child:c9"), outcome("child:c10"), outcome("approval")]
    assert validation.unjournaled_children(found, [child]) == ["c10"]


@pytest.mark.parametrize(
    ("found", "journal", "invariant"),
    [
        ([outcome("a", run_id="other")], [], "outcome_run"),
        ([outcome("a", outcome="maybe")], [], "outcome_kind"),
        ([outcome("child:c9")], [], "outcome_unknown_wait"),
        ([outcome("child:c9")], [entry(1, kind="child", output="{bad")], "outcome_unknown_wait"),
        ([outcome("child:c9")], [entry(1, kind="child", output="[1]")], "outcome_unknown_wait"),
        ([outcome("a/b")], [], "outcome_unknown_wait"),
        ([outcome("")], [], "outcome_unknown_wait"),
        ([outcome("a", payload="{x")], [], "outcome_payload_json"),
    ],
)
def test_a_broken_outcome_is_refused(
    found: list[port.Outcome], journal: list[port.JournalEntry], invariant: str
) -> None:
    with refused(invariant):
        validation.outcomes("r1", found, journal)


# -- ledger -------------------------------------------------------------------


def whole_ledger() -> list[port.LedgerEntry]:
    return [
        receipt(1, "initialized", 0, worker=None),
        receipt(2, "claimed", 1),
        receipt(3, "step_completed", 2),
    ]


def test_sound_ledgers_pass() -> None:
    validation.ledger(make_run(), whole_ledger())
    # Only the newest two of three are kept by a run whose bound is 2.
    validation.ledger(make_run(ledger_limit=2), whole_ledger()[1:])
    # The documented legacy shape: no sequence, no receipts.
    validation.ledger(make_run(ledger_sequence=0), [])


@pytest.mark.parametrize(
    ("run_changes", "entries", "limit", "invariant"),
    [
        ({}, [], 256, "ledger_empty"),
        ({}, whole_ledger()[:2], 256, "ledger_count"),
        ({}, whole_ledger(), 2, "ledger_count"),
        ({}, whole_ledger(), 0, "ledger_limit"),
        ({"ledger_sequence": 0}, whole_ledger(), 256, "ledger_count"),
        ({}, [*whole_ledger()[:1], receipt(3), receipt(4)], 256, "ledger_sequence_gap"),
        ({}, [receipt(1, "claimed"), receipt(2), receipt(3)], 256, "ledger_first"),
        (
            {},
            [receipt(1, "initialized", 0), receipt(2, "initialized"), receipt(3)],
            256,
            "ledger_first",
        ),
        ({}, [*whole_ledger()[:2], receipt(3, "bogus")], 256, "ledger_kind"),
        ({}, [*whole_ledger()[:2], receipt(3, generation=0)], 256, "ledger_generation"),
        ({"generation": 1}, whole_ledger(), 256, "ledger_generation"),
        ({}, [*whole_ledger()[:2], receipt(3, worker="bad worker")], 256, "ledger_worker_id"),
        ({}, [*whole_ledger()[:2], receipt(3, run_id="r2")], 256, "ledger_run"),
    ],
)
def test_a_broken_ledger_is_refused(
    run_changes: dict[str, Any], entries: list[port.LedgerEntry], limit: int, invariant: str
) -> None:
    with refused(invariant):
        validation.ledger(make_run(**run_changes, ledger_limit=limit), entries)
