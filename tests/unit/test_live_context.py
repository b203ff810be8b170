"""Updates, events and streams in workflow code, over an in-memory Runtime; RunView; bodies."""

from __future__ import annotations

from datetime import timedelta

import pytest
from test_context_runtime import T0, FakeRuntime

from perdure import codec, context, errors, journal, live, records, replay, steps, validation


class LiveRuntime(FakeRuntime):
    """The fake runtime, with updates to hand out and the live writes recorded."""

    def __init__(self, cursor: replay.JournalCursor, updates: list[live.UpdateReceived]) -> None:
        super().__init__(cursor)
        self.updates = updates
        self.names: dict[str, str] = {}
        self.answers: list[tuple[str, str]] = []

    def next_update(self, name: str, after_sequence: int) -> live.UpdateReceived | None:
        return next(
            (
                u
                for u in self.updates
                if self.names.get(u.update_id) == name and u.sequence > after_sequence
            ),
            None,
        )

    def answer_update(self, entry: journal.Entry, update_id: str, response: str) -> None:
        self._write("answer_update", entry, [])
        self.answers.append((update_id, response))

    def record_live(self, entry: journal.Entry) -> None:
        self._write("record_live", entry, [])


def make(
    recorded: list[journal.Entry] | None = None, updates: tuple[tuple[str, str, int], ...] = ()
) -> tuple[context.Context, LiveRuntime]:
    cursor = replay.JournalCursor("r1", recorded or [])
    received = [live.UpdateReceived(uid, payload, seq) for uid, payload, seq in updates]
    runtime = LiveRuntime(cursor, received)
    runtime.names = {uid: "add" for uid, _, _ in updates}
    return context.Context(run_id="r1", workflow="wf", runtime=runtime, cursor=cursor), runtime


def conversation(ctx: context.Context) -> list[int]:
    counts = []
    for _ in range(2):
        upd = ctx.next_update("add")
        counts.append(upd.payload)
        ctx.respond(upd, {"n": upd.payload})
        ctx.write_stream("progress", upd.payload)
    ctx.set_event("status", "two")
    ctx.close_stream("progress")
    return counts


def test_no_update_parks_on_an_update_wait() -> None:
    ctx, runtime = make()
    with pytest.raises(context.Parked) as parked:
        ctx.next_update("add", timeout=timedelta(seconds=30))
    assert parked.value.waits == [journal.WaitSpec("add", "update", T0 + timedelta(seconds=30), 0)]
    [opened] = runtime.pending
    assert (opened.kind, opened.name, opened.status) == ("update", "add", "started")


def test_updates_are_consumed_in_order_answered_and_replayed_without_writing() -> None:
    ctx, runtime = make(updates=(("u1", 5, 1), ("u2", 7, 3)))
    assert conversation(ctx) == [5, 7]
    assert runtime.answers == [("u1", '{"n":5}'), ("u2", '{"n":7}')]
    kinds = [(e.kind, e.name, e.status) for e in runtime.stored]
    assert kinds == [
        ("update", "add", "ok"),
        ("respond", "add", "ok"),
        ("stream", "progress", "ok"),
        ("update", "add", "ok"),
        ("respond", "add", "ok"),
        ("stream", "progress", "ok"),
        ("event", "status", "ok"),
        ("stream_close", "progress", "ok"),
    ]
    validation.journal("r1", runtime.stored)
    # Replay: the same answers, nothing written, no store asked for updates.
    again, replaying = make(list(runtime.stored))
    assert conversation(again) == [5, 7]
    assert replaying.writes == [] and replaying.answers == []


def test_an_update_is_answered_once() -> None:
    ctx, _ = make(updates=(("u1", 1, 1),))
    upd = ctx.next_update("add")
    ctx.respond(upd, "first")
    with pytest.raises(errors.InvalidInput, match="already answered"):
        ctx.respond(upd, "second")


def test_replay_answering_another_update_needs_attention() -> None:
    ctx, runtime = make(updates=(("u1", 1, 1),))
    ctx.respond(ctx.next_update("add"), "yes")
    replayed, _ = make(list(runtime.stored))
    replayed.next_update("add")
    with pytest.raises(steps.Halt) as halted:
        replayed.respond(records.Update("other", "add", 1), "yes")
    assert halted.value.error["code"] == "non_determinism"


def test_an_update_that_does_not_come_in_time_times_out() -> None:
    ctx, runtime = make()
    with pytest.raises(context.Parked):
        ctx.next_update("add", timeout=5)
    runtime.park()  # the deadline is journaled
    runtime.clock = T0 + timedelta(seconds=6)
    ctx.restart()
    with pytest.raises(errors.WaitTimedOut):
        ctx.next_update("add", timeout=5)
    [ended] = runtime.pending
    assert (ended.status, codec.decode(ended.error or "{}")["code"]) == ("error", "wait_timeout")


def test_a_closed_stream_takes_no_more_items() -> None:
    ctx, _ = make()
    ctx.write_stream("s", 1)
    ctx.close_stream("s")
    ctx.close_stream("s")  # a no-op
    with pytest.raises(errors.InvalidInput, match="closed"):
        ctx.write_stream("s", 2)


def test_the_run_view_reads_the_journal() -> None:
    ctx, runtime = make(updates=(("u1", 5, 1), ("u2", 7, 3)))
    conversation(ctx)
    entries = [journal.Entry(len(runtime.stored) + 1, "step", "charge", "ok", "3")]
    view = live.view(
        "r1", "wf", "running", '{"args": ["o"], "kwargs": {}}', runtime.stored + entries
    )
    assert view.inputs == {"args": ["o"], "kwargs": {}}
    assert [(u.update_id, u.payload) for u in view.updates("add")] == [("u1", 5), ("u2", 7)]
    assert view.responses == {"u1": {"n": 5}, "u2": {"n": 7}}
    assert view.events == {"status": "two"}
    assert view.stream("progress") == [5, 7] and view.closed_streams == {"progress"}
    assert view.step("charge") == 3 and view.done is False


@pytest.mark.parametrize(
    ("kind", "status", "body"),
    [
        ("event", "ok", '{"nothing": 1}'),
        ("stream", "ok", "[1]"),
        ("update", "ok", '{"update_id": 3, "payload": 1, "sequence": 1}'),
        ("update", "ok", '{"update_id": "u", "payload": 1, "sequence": 0}'),
        ("respond", "ok", '{"value": 1}'),
        ("respond", "error", None),
    ],
)
def test_a_live_entry_of_another_shape_is_corrupt(kind: str, status: str, body: str | None) -> None:
    entry = journal.Entry(
        1, kind, "k", status, body, error='{"code": "x"}' if body is None else None
    )  # type: ignore[arg-type]
    with pytest.raises(errors.CorruptState) as corrupt:
        validation.journal("r1", [entry])
    assert corrupt.value.invariant == "journal_body"
