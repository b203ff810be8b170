"""The crash-point explorer: the built-in scenarios hold, and a broken one is caught.

A tiny configuration (a few sites per mode) runs on both stores; the full
short form runs in CI as its own stage (.ci/run) and RELIABILITY.md holds its
table.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from perdure.store import port
from perdure.testing import chaos
from perdure.testing.chaos import __main__ as cli
from perdure.testing.chaos import checks, scenarios

BROKEN = "chaos_broken:scenario"  # tests/crash is on the path of the test run


def test_the_built_in_steps_and_signal_scenarios_hold_at_every_mode(
    store_url: str, tmp_path: Path
) -> None:
    report = chaos.explore(
        [scenarios.steps_once, scenarios.signal_wait], store_url, sites=3, keep=str(tmp_path)
    )
    assert report.ok, report.table()
    assert {(r.scenario, r.mode) for r in report.rows} == {
        (s, m) for s in ("steps_once", "signal_wait") for m in chaos.MODES
    }
    for row in report.rows:
        assert row.trials == len(row.sites) == 3
        assert row.writes > 3 and row.sampled
        assert row.unreached == 0


def test_the_children_scenario_holds_at_every_site_after_a_write(store_url: str) -> None:
    # Sites 3 to 5 used to leave the parent in needs_attention (corrupt_state): it died
    # between creating a child and journaling it, and the child ended first.
    report = chaos.explore([scenarios.children], store_url, long=True, modes=["exit-after"])
    assert report.ok, report.table()
    [row] = report.rows
    assert row.trials == row.writes and row.ends == {"succeeded": row.trials}


def test_an_effect_outside_any_step_is_reported_as_a_violation(
    store_url: str, tmp_path: Path
) -> None:
    [broken] = cli.load(BROKEN)
    report = chaos.explore([broken], store_url, long=True, modes=["exit-after"])
    assert not report.ok
    [row] = report.rows
    assert 0 < row.violations < row.trials  # the crash must come after the charge
    details = "\n".join(row.details)
    assert "once effect" in details and "/charge ran 2 times" in details, details


def test_the_command_line_reports_json_and_exits_1_on_violations(
    sqlite_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status = cli.main([BROKEN, "--store", sqlite_url, "--sites", "3", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert status == 1
    assert report["ok"] is False and report["violations"] > 0
    assert report["store"] == "SQLite" and report["form"] == "short"
    assert {r["mode"] for r in report["rows"]} == set(chaos.MODES)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("nosuchmodule:scenario", "cannot import"),
        ("chaos_broken:nothing", "names no perdure.testing.chaos.Scenario"),
        ("chaos_broken", "MODULE:NAME"),
    ],
)
def test_a_bad_scenario_name_exits_2_with_a_clear_error(
    spec: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main([spec]) == 2
    err = capsys.readouterr().err
    assert "import_failed" in err and message in err, err


def test_a_bad_store_url_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--store", "mysql://x"]) == 2
    assert "invalid_store_url" in capsys.readouterr().err


# -- the invariants, fed made-up trials: each must be able to fail ------------------------

AT = datetime(2030, 1, 1, tzinfo=UTC)


def _run(run_id: str, state: str, error: str | None = None) -> port.Run:
    return port.Run(
        run_id,
        "a",
        "wf",
        "1",
        state,
        "{}",
        None,
        error,
        None,
        None,  # type: ignore[arg-type]
        1,
        0,
        None,
        None,
        None,
        False,
        1,
        AT,
        AT,
    )


def _view(
    events: list[chaos.Event],
    runs: list[port.Run] | None = None,
    journals: dict[str, list[port.JournalEntry]] | None = None,
    at_crash: dict[str, list[port.JournalEntry]] | None = None,
) -> chaos.TrialView:
    return chaos.TrialView(
        "made-up", "exit-after@1", runs or [], journals or {}, at_crash or {}, events
    )


def test_a_once_effect_seen_twice_is_a_violation() -> None:
    events = [chaos.Event("crash", "effect", "r/charge", once=True)] * 2
    assert checks.invariants(_view(events)) == ["once effect r/charge ran 2 times"]


def test_a_step_that_runs_after_its_outcome_was_recorded_is_a_violation() -> None:
    events = [
        chaos.Event("crash", "effect", "r/s1"),
        chaos.Event("crash", "recorded", "r/s1"),
        chaos.Event("recover", "effect", "r/s1"),
    ]
    [found] = checks.invariants(_view(events))
    assert "step r/s1 ran again (recover)" in found


def test_a_rewritten_outcome_is_a_violation() -> None:
    before = port.JournalEntry(1, "step", "s1", "ok", '"a"')
    after = port.JournalEntry(1, "step", "s1", "ok", '"b"')
    view = _view([], [_run("r", "succeeded")], {"r": [after]}, {"r": [before]})
    assert checks.invariants(view) == ["run r: journal entry 1 (s1) was rewritten"]


def test_a_signal_applied_twice_or_lost_is_a_violation() -> None:
    twice = port.JournalEntry(1, "wait", "vote", "ok", '{"signal_id": "v1"}')
    again = port.JournalEntry(2, "wait", "vote#2", "ok", '{"signal_id": "v1"}')
    delivered = [
        chaos.Event("crash", "signal", "v1", label="r"),
        chaos.Event("crash", "signal", "v2", label="r"),
    ]
    view = _view(delivered, [_run("r", "succeeded")], {"r": [twice, again]})
    assert checks.invariants(view) == [
        "signal v1 was applied 2 times",
        "signal v2 was delivered (a receipt names it) but never applied; run r is succeeded",
    ]


def test_a_run_that_does_not_rest_or_needs_attention_for_no_effect_is_a_violation() -> None:
    poison = '{"code": "poison_run", "message": "8 attempts"}'
    unknown = '{"code": "effect_outcome_unknown", "message": "m", "step": "charge"}'
    runs = [
        _run("a", "running"),
        _run("b", "needs_attention", poison),
        _run("c", "needs_attention", unknown),
    ]
    found = checks.invariants(
        _view([], runs, {"c": [port.JournalEntry(1, "step", "charge", "ok")]})
    )
    assert found == [
        "run a (wf) is still running after the recovery",
        "run b (wf) needs attention: poison_run: 8 attempts",
        "run c needs attention for charge, with no effect start journaled",
    ]


def test_a_scenario_that_fails_without_any_crash_is_one_violation_and_not_explored(
    sqlite_url: str,
) -> None:
    def always_wrong(view: chaos.TrialView) -> list[str]:
        return [f"{len(view.roots())} run, and that is wrong"]

    wrong = chaos.Scenario("wrong", scenarios.orders, scenarios._drive_checkout, always_wrong)
    report = chaos.explore([wrong], sqlite_url)
    [row] = report.rows
    assert (row.mode, row.trials, row.violations) == ("no crash", 1, 1)
    assert row.details == ["without any crash: 1 run, and that is wrong"]
    assert row.ends == {"succeeded": 1}
