"""perdure.check: replaying a journal against code without a store, a worker or any write."""

from __future__ import annotations

from datetime import UTC, datetime

import perdure
from perdure import check
from perdure.store import port

AT = datetime(2030, 1, 1, tzinfo=UTC)


def run(workflow: str = "flow", state: port.RunState = "waiting") -> port.Run:
    return port.Run(
        run_id="r-1",
        app="unit",
        workflow=workflow,
        version="1",
        state=state,
        input='{"args": [], "kwargs": {}}',
        result=None,
        error=None,
        key=None,
        parent_id=None,
        generation=1,
        failures=0,
        worker=None,
        lease_expires_at=None,
        ready_at=None,
        cancel_requested=False,
        ledger_sequence=3,
        created_at=AT,
        updated_at=AT,
    )


def entry(position: int, kind: str, name: str, output: str | None = '"v"', status: str = "ok"):
    return port.JournalEntry(position, kind, name, status, output)  # type: ignore[arg-type]


def build(body):  # type: ignore[no-untyped-def]
    app = perdure.App(name="unit")
    executed: list[str] = []

    @app.step()
    def fetch() -> str:
        executed.append("fetch")
        return "fresh"

    app.workflow("flow")(lambda ctx: body(ctx, fetch))
    return app, executed


def test_a_matching_journal_replays_to_the_open_wait_without_running_steps() -> None:
    seen: list[object] = []

    def body(ctx, fetch):  # type: ignore[no-untyped-def]
        seen.append(fetch())
        seen.append(ctx.now())
        return ctx.wait("go")

    app, executed = build(body)
    entries = [
        entry(1, "step", "fetch"),
        entry(2, "now", "now", '"2030-01-01T00:00:00+00:00"'),
        entry(3, "wait", "go", '{"deadline": null}', status="started"),
    ]
    assert check.check_run(app, run(), entries) is None
    assert executed == [] and seen == ["v", AT]


def test_the_replay_stops_where_the_journal_ends() -> None:
    def body(ctx, fetch):  # type: ignore[no-untyped-def]
        fetch()
        fetch()  # not recorded: would execute, so the replay stops before it
        return "done"

    app, executed = build(body)
    assert check.check_run(app, run(), [entry(1, "step", "fetch")]) is None
    assert executed == []


def test_a_call_of_another_kind_is_a_mismatch_at_its_position() -> None:
    def body(ctx, fetch):  # type: ignore[no-untyped-def]
        fetch()
        ctx.random()
        return ctx.wait("go")

    app, _ = build(body)
    entries = [entry(1, "step", "fetch"), entry(2, "uuid", "uuid", '"x"')]
    found = check.check_run(app, run(), entries)
    assert found is not None
    assert (found.position, found.recorded, found.attempted) == (
        2,
        "uuid 'uuid'",
        "random 'random'",
    )


def test_code_that_raises_before_the_journal_ends_is_a_mismatch() -> None:
    def body(ctx, fetch):  # type: ignore[no-untyped-def]
        raise ValueError("boom")

    app, _ = build(body)
    found = check.check_run(app, run(), [entry(1, "step", "fetch")])
    assert found is not None and found.position == 1
    assert found.attempted == "the end of the workflow (raises ValueError: boom)"


def test_an_unreadable_journal_is_reported_at_position_0() -> None:
    app, _ = build(lambda ctx, fetch: fetch())
    found = check.check_run(app, run(), [entry(2, "step", "fetch")])
    assert found is not None and found.position == 0
    assert "cannot be replayed" in found.describe() and "journal_gap" in found.describe()
