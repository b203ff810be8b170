"""Warm parking (perdure.warm): a waiting sync run is taken up again in place, without a
replay, only when the journal is exactly what it left; otherwise it is replayed (both stores)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

import perdure
from perdure import warm, warmrun
from perdure.store import port, warmport

WAIT = 30


def _until(predicate: Callable[[], bool], timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def _update_reads(app: perdure.App) -> list[str | None]:
    """Record what the store's next_update returns from now on: the update's id, or None."""
    reads: list[str | None] = []
    next_update = app.store.next_update  # type: ignore[attr-defined]

    def recorded(*args: Any, **kwargs: Any) -> object:
        found = next_update(*args, **kwargs)
        reads.append(None if found is None else found.update_id)
        return found

    app.store.next_update = recorded  # type: ignore[attr-defined]
    return reads


def _held_warm(worker: perdure.Worker, run_id: str, generation: int) -> bool:
    """Whether the run waits warm in ``worker`` with the journal its claim ``generation`` parked.

    Signaled only then, a run is woken while its worker holds it warm.
    """
    known = (worker._known_journals() or {}).get(run_id)
    return known is not None and known.generation == generation


def _answers_after_each_claim(
    app: perdure.App, monkeypatch: pytest.MonkeyPatch
) -> tuple[list[bool], threading.Event]:
    """Send each answer ahead of its claim only once that claim by key is back.

    It then finds the claim made, and writes under it. Returns what each
    answer sent ahead wrote, and an event set as each comes back.
    """
    claim_warm = app.store.claim_warm  # type: ignore[attr-defined]
    answer_ahead = app.store.answer_ahead  # type: ignore[attr-defined]
    made = threading.Semaphore(0)
    ahead: list[bool] = []
    came_back = threading.Event()

    def claimed_then_told(*args: Any, **kwargs: Any) -> object:
        try:
            return claim_warm(*args, **kwargs)
        finally:
            made.release()

    def after_the_claim(*args: Any, **kwargs: Any) -> bool:
        assert made.acquire(timeout=WAIT)
        ahead.append(answer_ahead(*args, **kwargs))
        came_back.set()
        return ahead[-1]

    _worker_claims(monkeypatch)
    monkeypatch.setattr(app.store, "claim_warm", claimed_then_told)
    monkeypatch.setattr(app.store, "answer_ahead", after_the_claim)
    return ahead, came_back


def _answers_with_each_claim(
    app: perdure.App, monkeypatch: pytest.MonkeyPatch
) -> tuple[list[bool], threading.Event]:
    """What each answer that carried its run's claim wrote; the event is set as each is back."""
    claim_answering = app.store.claim_answering  # type: ignore[attr-defined]
    wrote: list[bool] = []
    came_back = threading.Event()

    def recorded(*args: Any, **kwargs: Any) -> tuple[port.Claimed | None, bool]:
        found, answered = claim_answering(*args, **kwargs)
        wrote.append(found is not None and answered)
        came_back.set()
        return found, answered

    monkeypatch.setattr(app.store, "claim_answering", recorded)
    return wrote, came_back


def _early_app(make_app: Callable[..., perdure.App], **options: Any) -> perdure.App:
    """An app whose runs can be woken early: only PostgreSQL's wake-ups carry the update."""
    app = make_app(**options)
    if not app.store.url.startswith("postgresql"):
        pytest.skip("only PostgreSQL's wake-ups carry the update that wakes a run early")
    return app


def _start_answerer(app: perdure.App, count: int) -> tuple[Any, list[object]]:
    """Start a run that answers ``count`` updates "ask" with twice their payload.

    Returns its handle and a list that grows by one each time its code starts
    (the first pass, and each replay).
    """
    entered: list[object] = []

    @app.workflow()
    def answerer(ctx: perdure.Context, count: int) -> list[object]:
        entered.append(None)
        asked = []
        for _ in range(count):
            update = ctx.next_update("ask")
            asked.append(update.payload)
            ctx.respond(update, update.payload * 2)
        return asked

    return app.start(answerer, count), entered


def _worker_claims(monkeypatch: pytest.MonkeyPatch) -> None:
    """Have the worker make every claim of a run woken early, never the run's answer."""

    def left(self: warm.PendingClaim, *args: Any) -> None:
        self.leave_claim()

    monkeypatch.setattr(warm.PendingClaim, "answer_claiming", left)


def test_a_run_that_waits_goes_on_in_place_without_a_replay(
    make_app: Callable[..., perdure.App],
) -> None:
    app = make_app()
    entered: list[int] = []

    @app.workflow()
    def gatherer(ctx: perdure.Context, count: int) -> list[int]:
        entered.append(1)  # not durable: counts how often the code starts from the top
        return [ctx.wait("item") for _ in range(count)]

    handle = app.start(gatherer, 5)
    with app.worker(warm_for=10):
        for i in range(5):
            _until(lambda: app.get(handle.run_id).state == "waiting")
            app.signal(handle.run_id, "item", i)
        assert handle.result(timeout=WAIT) == [0, 1, 2, 3, 4]
    assert len(entered) == 1
    kinds = [h.kind for h in app.history(handle.run_id)]
    assert kinds.count("parked") == 5 and kinds.count("claimed") == 6


def _recording_claims(store: port.Store) -> list[dict[str, port.KnownJournal] | None]:
    """Record the journals each claim of ``store`` is offered (wraps the object's claim)."""
    offered: list[dict[str, port.KnownJournal] | None] = []
    claim = store.claim

    def recorded(*args: Any, **kwargs: Any) -> list[port.Claimed]:
        known = kwargs.get("known")
        found = claim(*args, **kwargs)
        if found:
            offered.append(None if known is None else dict(known))
        return found

    store.claim = recorded  # type: ignore[method-assign]
    claim_warm = getattr(store, "claim_warm", None)
    if claim_warm is not None:

        def recorded_warm(*args: Any, **kwargs: Any) -> port.Claimed | None:
            found = claim_warm(*args, **kwargs)
            if found is not None:
                offered.append({kwargs["run_id"]: kwargs["known"]})
            return found

        store.claim_warm = recorded_warm  # type: ignore[attr-defined]
    return offered


def test_a_warm_run_is_claimed_with_the_journal_its_worker_holds(
    make_app: Callable[..., perdure.App],
) -> None:
    app = make_app()
    entered: list[int] = []

    @app.workflow()
    def gatherer(ctx: perdure.Context, count: int) -> list[int]:
        entered.append(1)
        return [ctx.wait("item") for _ in range(count)]

    handle = app.start(gatherer, 3)
    offered = _recording_claims(app.store)
    with app.worker(warm_for=10):
        for i in range(3):
            _until(lambda: app.get(handle.run_id).state == "waiting")
            parked_with = app.store.journal(handle.run_id)
            app.signal(handle.run_id, "item", i)
            _until(lambda n=i + 2: len(offered) == n)
            held = (offered[-1] or {})[handle.run_id]
            # The claim that took the run up again was offered exactly what was stored.
            assert (held.generation, list(held.journal)) == (i + 1, parked_with)
        assert handle.result(timeout=WAIT) == [0, 1, 2]
    assert offered[0] is None
    assert len(entered) == 1


def test_a_wake_up_that_names_a_warm_run_claims_it_alone(
    make_app: Callable[..., perdure.App],
) -> None:
    app = make_app()

    @app.workflow()
    def gatherer(ctx: perdure.Context, count: int) -> list[int]:
        return [ctx.wait("item") for _ in range(count)]

    handle = app.start(gatherer, 3)
    by_key: list[str] = []
    claim_warm = app.store.claim_warm  # type: ignore[attr-defined]

    def recorded(*args: Any, **kwargs: Any) -> port.Claimed | None:
        found: port.Claimed | None = claim_warm(*args, **kwargs)
        if found is not None:
            by_key.append(found.claim.run_id)
        return found

    app.store.claim_warm = recorded  # type: ignore[attr-defined]
    worker = app.worker(warm_for=10)
    with worker:
        for i in range(3):
            _until(lambda n=i + 1: _held_warm(worker, handle.run_id, n))
            app.signal(handle.run_id, "item", i)
        assert handle.result(timeout=WAIT) == [0, 1, 2]
    # PostgreSQL's wake-ups name the run, SQLite's name none (the ordinary claim).
    named = app.store.url.startswith("postgresql")
    assert by_key == ([handle.run_id] * 3 if named else [])
    assert [h.kind for h in app.history(handle.run_id)].count("claimed") == 4


def test_a_warm_claim_that_fails_leaves_the_run_to_the_ordinary_claim(
    make_app: Callable[..., perdure.App],
) -> None:
    app = make_app()
    entered: list[int] = []

    @app.workflow()
    def gatherer(ctx: perdure.Context, count: int) -> list[int]:
        entered.append(1)
        return [ctx.wait("item") for _ in range(count)]

    handle = app.start(gatherer, 2)
    store: Any = app.store
    # Every wake-up names the run (as PostgreSQL's do), and its claim by key fails.
    store.woken = lambda: warmport.Woken(frozenset({handle.run_id}), False)
    failed: list[str] = []

    def failing(*args: Any, **kwargs: Any) -> port.Claimed | None:
        failed.append(kwargs["run_id"])
        raise perdure.errors.StoreUnavailable("the store went away")

    store.claim_warm = failing
    worker = app.worker(warm_for=10)
    with worker:
        for i in range(2):
            _until(lambda n=i + 1: _held_warm(worker, handle.run_id, n))
            app.signal(handle.run_id, "item", i)
        assert handle.result(timeout=WAIT) == [0, 1]
    # Tried at each of the two wake-ups (and at any other that came meanwhile).
    assert len(failed) >= 2 and set(failed) == {handle.run_id}
    # The ordinary claim took the run each time, and handed it to its warm thread.
    assert len(entered) == 1


def test_a_claim_its_warm_thread_did_not_take_replays_the_stored_journal(
    make_app: Callable[..., perdure.App],
) -> None:
    app = make_app()
    entered: list[int] = []

    @app.workflow()
    def gatherer(ctx: perdure.Context, count: int) -> list[int]:
        entered.append(1)
        return [ctx.wait("item") for _ in range(count)]

    handle = app.start(gatherer, 2)
    read: list[str] = []
    journal = app.store.journal

    def counted(run_id: str) -> list[port.JournalEntry]:
        read.append(run_id)
        return journal(run_id)

    app.store.journal = counted  # type: ignore[method-assign]
    worker = app.worker(warm_for=0.5)
    # As if each warm thread had let go between the claim and its hand-over.
    worker._take_warm = lambda claimed: False  # type: ignore[method-assign]
    with worker:
        for i in range(2):
            _until(lambda: app.get(handle.run_id).state == "waiting")
            app.signal(handle.run_id, "item", i)
        assert handle.result(timeout=WAIT) == [0, 1]
    assert len(entered) == 3  # every wake replayed
    assert read.count(handle.run_id) >= 2


def test_without_warm_parking_every_wake_replays(make_app: Callable[..., perdure.App]) -> None:
    app = make_app()
    entered: list[int] = []

    @app.workflow()
    def gatherer(ctx: perdure.Context, count: int) -> list[int]:
        entered.append(1)
        return [ctx.wait("item") for _ in range(count)]

    handle = app.start(gatherer, 3)
    with app.worker(warm=0):
        for i in range(3):
            _until(lambda: app.get(handle.run_id).state == "waiting")
            app.signal(handle.run_id, "item", i)
        assert handle.result(timeout=WAIT) == [0, 1, 2]
    assert len(entered) == 4


def test_updates_and_messages_and_children_are_taken_up_warm(
    make_app: Callable[..., perdure.App],
) -> None:
    app = make_app()
    entered: list[int] = []

    @app.workflow()
    def child(ctx: perdure.Context, n: int) -> int:
        return n * 2

    @app.workflow()
    def mixed(ctx: perdure.Context) -> list[object]:
        entered.append(1)
        update = ctx.next_update("ask")
        ctx.respond(update, "ok")
        message = ctx.receive("inbox")
        doubled = ctx.start_child(child, 21).result()
        ctx.sleep(0.05)
        return [update.payload, message.payload, doubled]

    handle = app.start(mixed)
    with app.worker(warm_for=10):
        _until(lambda: app.get(handle.run_id).state == "waiting")
        assert app.update(handle.run_id, "ask", "q", timeout=WAIT) == "ok"
        _until(lambda: app.get(handle.run_id).state == "waiting")
        app.send(handle.run_id, "inbox", "k1", "hello")
        assert handle.result(timeout=WAIT) == ["q", "hello", 42]
    assert len(entered) == 1


@pytest.mark.parametrize("size", [0, 9_000])
def test_an_update_that_wakes_a_warm_run_comes_with_its_claim(
    make_app: Callable[..., perdure.App], size: int
) -> None:
    app = make_app()

    @app.workflow()
    def answerer(ctx: perdure.Context, count: int) -> list[object]:
        asked = []
        for _ in range(count):
            update = ctx.next_update("ask")
            ctx.respond(update, update.payload * 2)
            asked.append(update.payload)
        return asked

    handle = app.start(answerer, 3)
    got = _update_reads(app)
    worker = app.worker(warm_for=10)
    with worker:
        for i in range(3):
            _until(lambda n=i + 1: _held_warm(worker, handle.run_id, n))
            payload = i if not size else str(i) * size
            answer = app.update(handle.run_id, "ask", payload, update_id=f"u{i}", timeout=WAIT)
            assert answer == payload * 2
        assert handle.result(timeout=WAIT) == [i if not size else str(i) * size for i in range(3)]
    if app.store.url.startswith("postgresql") and size:
        # Too big to come with the wake-up, and the claim by key (claim_warm)
        # reads none ahead: the run reads each.
        assert got == [None, "u0", None, "u1", None, "u2"]
    else:
        # The run read the store only to find nothing and park; each update it
        # got came with what took it up again: read ahead by the ordinary claim
        # on SQLite, carried by the delivery's wake-up on PostgreSQL.
        assert got == [None, None, None]


def test_a_carried_update_is_used_only_where_it_is_the_next(
    make_app: Callable[..., perdure.App],
) -> None:
    app = make_app()

    @app.workflow()
    def two_names(ctx: perdure.Context) -> list[object]:
        got = []
        for name in ("a", "b", "b", "a"):
            update = ctx.next_update(name)
            ctx.respond(update, update.payload)
            got.append(update.payload)
        return got

    handle = app.start(two_names)
    got = _update_reads(app)
    worker = app.worker(warm_for=10)
    with worker:
        sent = [("a", "a1"), ("b", "b1"), ("b", "b2"), ("a", "a2")]
        for n, (name, payload) in enumerate(sent):
            _until(lambda n=n + 1: _held_warm(worker, handle.run_id, n))
            assert app.update(handle.run_id, name, payload, update_id=payload, timeout=WAIT) == (
                payload
            )
        assert handle.result(timeout=WAIT) == ["a1", "b1", "b2", "a2"]
    if app.store.url.startswith("postgresql"):
        # b1 (numbered 2) and a2 (4) follow another name's update: each may not
        # be the first after the wait, so the run reads it; a1 and b2 it need not.
        assert got == [None, None, "b1", None, None, "a2"]
    else:
        assert got == [None, None, None, None]


def test_a_run_another_worker_moved_on_is_replayed_not_resumed(
    make_app: Callable[..., perdure.App],
) -> None:
    """Two workers race for one run through 30 signals: whichever takes each wake, every
    signal is applied once and in order, and a warm thread never resumes a stale journal."""
    app = make_app()

    @app.workflow()
    def gatherer(ctx: perdure.Context, count: int) -> list[int]:
        return [ctx.wait("item") for _ in range(count)]

    handle = app.start(gatherer, 30)
    with app.worker(concurrency=2, warm_for=10), app.worker(concurrency=2, warm_for=10):
        for i in range(30):
            # Each wake is a claim both workers race for; the loser's warm thread
            # meets a journal that moved on at its own next claim.
            _until(lambda: app.get(handle.run_id).state == "waiting")
            app.signal(handle.run_id, "item", i)
        assert handle.result(timeout=WAIT) == list(range(30))
    waits = [e for e in app.store.journal(handle.run_id) if e.kind == "wait"]
    assert len(waits) == 30


def test_a_stopping_worker_lets_its_warm_runs_go_at_once(
    make_app: Callable[..., perdure.App],
) -> None:
    app = make_app()

    @app.workflow()
    def waiter(ctx: perdure.Context) -> str:
        return str(ctx.wait("go"))

    handle = app.start(waiter)
    worker = app.worker(warm_for=60).start()
    _until(lambda: app.get(handle.run_id).state == "waiting")
    started = time.monotonic()
    assert worker.stop(timeout=10)
    assert time.monotonic() - started < 5  # not the 60 s warm window
    app.signal(handle.run_id, "go", "later")
    with app.worker(warm=0):
        assert handle.result(timeout=WAIT) == "later"


def test_a_canceled_warm_run_is_canceled(make_app: Callable[..., perdure.App]) -> None:
    app = make_app()
    done = threading.Event()

    @app.workflow()
    def waiter(ctx: perdure.Context) -> str:
        try:
            return str(ctx.wait("go"))
        finally:
            done.set()

    handle = app.start(waiter)
    with app.worker(warm_for=0.5):
        _until(lambda: app.get(handle.run_id).state == "waiting")
        assert app.cancel(handle.run_id)
        assert app.get(handle.run_id).state == "canceled"
        assert done.wait(10)  # the warm thread let go of the run's code
    assert app.get(handle.run_id).state == "canceled"


def _entry(position: int, output: str) -> port.JournalEntry:
    return port.JournalEntry(position, "wait", f"go#{position}", "ok", output)


def test_only_the_same_journal_lets_a_warm_run_go_on() -> None:
    mine = [_entry(1, '"a"'), _entry(2, '"b"')]

    def claimed(entries: list[port.JournalEntry]) -> port.Claimed:
        return port.Claimed(None, None, entries, [], False)  # type: ignore[arg-type]

    assert warm.same_journal(mine, claimed(list(mine)))
    assert not warm.same_journal(mine, claimed(mine[:1]))
    assert not warm.same_journal(mine, claimed([*mine, _entry(3, '"c"')]))
    assert not warm.same_journal(mine, claimed([mine[0], _entry(2, '"other"')]))


@pytest.mark.parametrize("claimer", ["worker", "answer"])
@pytest.mark.parametrize("refusal", ["not claimed", "moved on"])
def test_a_run_woken_before_its_claim_that_is_not_taken_up_replays_and_answers_once(
    make_app: Callable[..., perdure.App],
    refusal: str,
    claimer: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    app = _early_app(make_app)
    handle, entered = _start_answerer(app, 2)
    worker = app.worker(warm_for=10)
    early: list[str] = []
    hand_early = worker._hand_early

    def recorded(run_id: str, carried: Any) -> Any:
        found = hand_early(run_id, carried)
        early.append("woken" if found is not None else "not woken")
        return found

    monkeypatch.setattr(worker, "_hand_early", recorded)
    # The claim is made by the worker (the answer goes ahead of it) or with the answer.
    claim_name = "claim_warm" if claimer == "worker" else "claim_answering"
    if refusal == "not claimed":
        if claimer == "worker":
            _worker_claims(monkeypatch)
        make_claim = getattr(app.store, claim_name)
        refused: list[object] = []

        def once_refused(*args: Any, **kwargs: Any) -> object:
            if not refused:
                refused.append(None)
                # As if another claim had taken the run first: nothing written.
                return None if claimer == "worker" else (None, False)
            return make_claim(*args, **kwargs)

        monkeypatch.setattr(app.store, claim_name, once_refused)
    else:
        original = warmrun.WarmExecution.matches
        moved: list[object] = []
        if claimer == "worker":
            # The answer goes ahead of the claim and comes back before the check.
            ahead, came_back = _answers_after_each_claim(app, monkeypatch)
        else:
            ahead, came_back = _answers_with_each_claim(app, monkeypatch)

        def once_moved(self: Any, claimed: port.Claimed) -> bool:
            if not moved:
                moved.append(None)
                assert came_back.wait(WAIT)
                return False  # as if the run's rows had failed their checks
            return bool(original(self, claimed))

        monkeypatch.setattr(warmrun.WarmExecution, "matches", once_moved)
    with worker:
        _until(lambda: _held_warm(worker, handle.run_id, 1))
        assert app.update(handle.run_id, "ask", 1, update_id="u1", timeout=WAIT) == 2
        # Replayed from the journal by the ordinary claim, then parked warm again:
        # under the claim it was woken with, or (the answer written ahead under
        # that one) under the next, the first given back at once.
        _until(lambda: _held_warm(worker, handle.run_id, 2 if refusal == "not claimed" else 3))
        assert app.update(handle.run_id, "ask", 2, update_id="u2", timeout=WAIT) == 4
        assert handle.result(timeout=WAIT) == [1, 2]
    # The second wake-up may come with the release's announcement (it named no
    # run), and then the ordinary claim takes the run up warm: early or not.
    assert early[0] == "woken"
    assert len(entered) == 2  # the first pass, and the replay after the refusal
    journal = app.store.journal(handle.run_id)  # type: ignore[attr-defined]
    assert [e.kind for e in journal].count("respond") == 2
    if refusal == "moved on":
        assert ahead[0] is True  # the first answer was written, with or ahead of its claim
        kinds = [r.kind for r in app.store.history(handle.run_id)]  # type: ignore[attr-defined]
        assert "released" in kinds


def test_a_run_woken_before_its_claim_writes_nothing_until_the_claim_is_made(
    make_app: Callable[..., perdure.App], monkeypatch: pytest.MonkeyPatch
) -> None:
    app = _early_app(make_app)
    reached = threading.Event()

    @app.workflow()
    def answerer(ctx: perdure.Context) -> object:
        update = ctx.next_update("ask")
        reached.set()  # workflow code, run before the claim is made
        ctx.respond(update, update.payload * 2)
        return update.payload

    handle = app.start(answerer)
    worker = app.worker(warm_for=10)
    _worker_claims(monkeypatch)
    claim_warm = app.store.claim_warm  # type: ignore[attr-defined]
    release = threading.Event()
    seen_while_held: list[object] = []
    waiting = threading.Event()
    result = warm.PendingClaim.result

    def waited(self: warm.PendingClaim) -> port.Claimed | None:
        waiting.set()  # the run's thread, at its first call to the store
        return result(self)

    monkeypatch.setattr(warm.PendingClaim, "result", waited)

    def held(*args: Any, **kwargs: Any) -> object:
        # The run's thread goes on meanwhile, past the wait, and waits for the
        # claim at its first call to the store (the answer's write).
        assert reached.wait(WAIT) and waiting.wait(WAIT)
        run = app.get(handle.run_id)
        journal = app.store.journal(handle.run_id)  # type: ignore[attr-defined]
        seen_while_held.append((run.state, [(e.kind, e.status) for e in journal]))
        release.set()
        return claim_warm(*args, **kwargs)

    monkeypatch.setattr(app.store, "claim_warm", held)
    with worker:
        _until(lambda: _held_warm(worker, handle.run_id, 1))
        assert app.update(handle.run_id, "ask", 21, update_id="u1", timeout=WAIT) == 42
        assert handle.result(timeout=WAIT) == 21
    assert release.is_set()
    # Woken (queued), not yet claimed; the wait still open in its journal, unanswered.
    [(state, entries)] = seen_while_held
    assert state == "queued"
    assert entries == [("update", "started")]
    entries = [(e.kind, e.status) for e in app.store.journal(handle.run_id)]  # type: ignore[attr-defined]
    assert entries == [("update", "ok"), ("respond", "ok")]


@pytest.mark.parametrize("limit", [3, 256])
def test_an_answer_written_ahead_of_its_claim_is_answered_once_and_the_run_goes_on(
    make_app: Callable[..., perdure.App], monkeypatch: pytest.MonkeyPatch, limit: int
) -> None:
    app = _early_app(make_app, ledger_limit=limit)
    handle, _ = _start_answerer(app, 3)
    worker = app.worker(warm_for=10)
    ahead, _ = _answers_after_each_claim(app, monkeypatch)
    answer_update = app.store.answer_update  # type: ignore[attr-defined]
    ordinary: list[str] = []

    def answered(claim: port.Claim, *args: Any, **kwargs: Any) -> bool:
        ordinary.append(claim.run_id)
        return bool(answer_update(claim, *args, **kwargs))

    monkeypatch.setattr(app.store, "answer_update", answered)
    with worker:
        for i, generation in ((1, 1), (2, 2), (3, 3)):
            _until(lambda generation=generation: _held_warm(worker, handle.run_id, generation))
            assert app.update(handle.run_id, "ask", i, update_id=f"u{i}", timeout=WAIT) == 2 * i
        assert handle.result(timeout=WAIT) == [1, 2, 3]
    assert ahead == [True, True, True] and ordinary == []
    # Answered once each, in the journal once each, and the ledger as the run's bound keeps it.
    stored = [app.store.get_update(handle.run_id, f"u{i}") for i in (1, 2, 3)]  # type: ignore[attr-defined]
    assert [(u.state, u.response) for u in stored] == [("answered", str(2 * i)) for i in (1, 2, 3)]
    journal = app.store.journal(handle.run_id)  # type: ignore[attr-defined]
    assert [e.kind for e in journal].count("respond") == 3
    history = app.history(handle.run_id)
    assert len(history) == min(limit, history[-1].sequence)


@pytest.mark.parametrize("limit", [3, 256])
def test_an_answer_that_carries_its_claim_is_answered_once_and_the_run_goes_on(
    make_app: Callable[..., perdure.App], monkeypatch: pytest.MonkeyPatch, limit: int
) -> None:
    app = _early_app(make_app, ledger_limit=limit)
    handle, entered = _start_answerer(app, 3)
    worker = app.worker(warm_for=10)
    wrote, _ = _answers_with_each_claim(app, monkeypatch)
    other: list[str] = []
    for name in ("claim_warm", "answer_ahead", "answer_update"):
        original = getattr(app.store, name)

        def counted(*args: Any, name: str = name, original: Any = original, **kwargs: Any) -> Any:
            other.append(name)
            return original(*args, **kwargs)

        monkeypatch.setattr(app.store, name, counted)
    with worker:
        for i, generation in ((1, 1), (2, 2), (3, 3)):
            _until(lambda generation=generation: _held_warm(worker, handle.run_id, generation))
            assert app.update(handle.run_id, "ask", i, update_id=f"u{i}", timeout=WAIT) == 2 * i
        assert handle.result(timeout=WAIT) == [1, 2, 3]
    # Each claim made by the answer, in its commit; no other claim or answer, no replay.
    assert wrote == [True, True, True] and other == [] and len(entered) == 1
    stored = [app.store.get_update(handle.run_id, f"u{i}") for i in (1, 2, 3)]  # type: ignore[attr-defined]
    assert [(u.state, u.response) for u in stored] == [("answered", str(2 * i)) for i in (1, 2, 3)]
    journal = app.store.journal(handle.run_id)  # type: ignore[attr-defined]
    assert [e.kind for e in journal].count("respond") == 3
    history = app.history(handle.run_id)
    assert len(history) == min(limit, history[-1].sequence)
    if limit == 256:
        # The first claim, and one with each answer.
        assert [r.kind for r in history].count("claimed") == 4


def test_a_run_woken_early_that_writes_anything_else_first_leaves_its_claim_to_the_worker(
    make_app: Callable[..., perdure.App], monkeypatch: pytest.MonkeyPatch
) -> None:
    app = _early_app(make_app)
    entered: list[object] = []

    def double(n: int) -> int:
        return n * 2

    @app.workflow()
    def answerer(ctx: perdure.Context) -> list[object]:
        entered.append(None)
        asked = []
        for _ in range(2):
            update = ctx.next_update("ask")
            doubled = ctx.step(double, update.payload)
            asked.append(update.payload)
            ctx.respond(update, doubled)
        return asked

    handle = app.start(answerer)
    worker = app.worker(warm_for=10)
    wrote, _ = _answers_with_each_claim(app, monkeypatch)
    claim_warm = app.store.claim_warm  # type: ignore[attr-defined]
    by_worker: list[bool] = []

    def recorded(*args: Any, **kwargs: Any) -> object:
        found = claim_warm(*args, **kwargs)
        by_worker.append(found is not None)
        return found

    monkeypatch.setattr(app.store, "claim_warm", recorded)
    with worker:
        for i, generation in ((1, 1), (2, 2)):
            _until(lambda generation=generation: _held_warm(worker, handle.run_id, generation))
            assert app.update(handle.run_id, "ask", i, update_id=f"u{i}", timeout=WAIT) == 2 * i
        assert handle.result(timeout=WAIT) == [1, 2]
    # The step's write came first: the worker claimed, the run went on warm.
    assert by_worker == [True, True] and wrote == [] and len(entered) == 1


def test_a_run_woken_early_that_is_slow_to_answer_leaves_its_claim_to_the_worker(
    make_app: Callable[..., perdure.App], monkeypatch: pytest.MonkeyPatch
) -> None:
    app = _early_app(make_app)
    claimed_by_worker = threading.Event()

    @app.workflow()
    def answerer(ctx: perdure.Context) -> object:
        update = ctx.next_update("ask")
        # Workflow code that outlasts the worker's wait for the answer: it
        # goes on only once the worker has claimed the run itself.
        assert claimed_by_worker.wait(WAIT)
        ctx.respond(update, update.payload * 2)
        return update.payload

    handle = app.start(answerer)
    worker = app.worker(warm_for=10)
    wrote, _ = _answers_with_each_claim(app, monkeypatch)
    claim_warm = app.store.claim_warm  # type: ignore[attr-defined]
    answer_ahead = app.store.answer_ahead  # type: ignore[attr-defined]
    ahead: list[bool] = []

    def by_worker(*args: Any, **kwargs: Any) -> object:
        try:
            return claim_warm(*args, **kwargs)
        finally:
            claimed_by_worker.set()

    def recorded(*args: Any, **kwargs: Any) -> bool:
        ahead.append(bool(answer_ahead(*args, **kwargs)))
        return ahead[-1]

    monkeypatch.setattr(app.store, "claim_warm", by_worker)
    monkeypatch.setattr(app.store, "answer_ahead", recorded)
    with worker:
        _until(lambda: _held_warm(worker, handle.run_id, 1))
        assert app.update(handle.run_id, "ask", 21, update_id="u1", timeout=WAIT) == 42
        assert handle.result(timeout=WAIT) == 21
    # The worker made the claim; the answer, still early, could not carry it.
    assert claimed_by_worker.is_set() and wrote == [] and len(ahead) <= 1
    stored = app.store.get_update(handle.run_id, "u1")  # type: ignore[attr-defined]
    assert (stored.state, stored.response) == ("answered", "42")


def test_a_refused_renewal_of_the_parked_claim_does_not_stop_a_run_taken_up_early(
    make_app: Callable[..., perdure.App], monkeypatch: pytest.MonkeyPatch
) -> None:
    app = _early_app(make_app)
    handle, _ = _start_answerer(app, 2)
    worker = app.worker(warm_for=10)
    hand = warm.WarmSlot.hand
    reported: list[int] = []

    def refused_first(slot: warm.WarmSlot, claimed: warm.Handed) -> None:
        if isinstance(claimed, warm.PendingClaim):
            # The keeper renews the claim the run parked with until it hears of
            # the park; the store refuses, and the report comes as the run wakes.
            with worker._active_lock:
                execution = worker._active[slot.run_id]
            reported.append(execution.claim.generation)
            stale = perdure.errors.StaleClaim(slot.run_id, "renewal refused")
            worker._lost(slot.run_id, execution.claim.generation, stale)
        hand(slot, claimed)

    monkeypatch.setattr(warm.WarmSlot, "hand", refused_first)
    with worker:
        for i, generation in ((1, 1), (2, 2)):
            _until(lambda generation=generation: _held_warm(worker, handle.run_id, generation))
            assert app.update(handle.run_id, "ask", i, update_id=f"u{i}", timeout=WAIT) == 2 * i
        assert handle.result(timeout=WAIT) == [1, 2]
    assert reported == [1, 2]
