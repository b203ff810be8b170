"""Child runs, recursive cancellation, fork and resolve, end to end on a real store.

A real worker (threads) runs the workflows. Ordering is explicit: a test
waits for a stored state (bounded polling), for an event a step sets, or
holds a step on an event it releases; it never sleeps and hopes. Every test
runs on SQLite and PostgreSQL (``store_url``), except where noted.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import perdure
from perdure import codec
from perdure.store import port

WORKER: dict[str, Any] = {"concurrency": 8, "lease_ttl": 2, "heartbeat": 0.5, "poll_interval": 0.2}
LIMIT = 15.0  # seconds: an upper bound for anything to happen, never a pause
# The map test fans out FAN_OUT children on SQLite and PG_FAN_OUT on PostgreSQL,
# where each child run costs several round trips: 1000 children took 7 s alone,
# 13 s in the whole suite under -n 4 and over 30 s on a loaded host (2 CPUs).
# What the test checks is the single store call and the counts, not the speed:
# SQLite 1000 children took 3 s alone and 16 s on that loaded host, PostgreSQL
# 200 children 1.2 s and 7 s. The bound only stops a stuck run (pytest: 120 s).
FAN_OUT = 1000
PG_FAN_OUT = 200
FAN_OUT_LIMIT = 60.0


def wait_for(check: Callable[[], Any], what: str, timeout: float = LIMIT) -> Any:
    """Poll ``check`` until it returns something truthy; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


def wait_state(
    app: perdure.App, run_id: str, *states: str, timeout: float = LIMIT
) -> perdure.RunInfo:
    info: perdure.RunInfo = wait_for(
        lambda: (i := app.get(run_id)).state in states and i,
        f"run {run_id} to reach {'/'.join(states)}",
        timeout,
    )
    return info


def journal(app: perdure.App, run_id: str) -> list[tuple[int, str, str, str]]:
    return [(e.position, e.kind, e.name, e.status) for e in app.store.journal(run_id)]


def kinds(app: perdure.App, run_id: str) -> list[str]:
    return [r.kind for r in app.history(run_id)]


def canceled_cleanly(info: perdure.RunInfo) -> bool:
    """Whether the run ended canceled with no error (as when the store cancels it)."""
    return info.state == "canceled" and info.error is None


def runs_of(app: perdure.App, workflow: str) -> list[perdure.RunInfo]:
    return app.runs(workflow=workflow, limit=10_000)


def gate(event: threading.Event) -> None:
    """Block a step body until the test opens ``event`` (bounded)."""
    if not event.wait(LIMIT):
        raise TimeoutError("the test never opened the gate")


class CountingStore:
    """Delegate to a real store; count ``create_children`` calls and refused ``finish_step``s."""

    def __init__(self, inner: port.Store) -> None:
        self._inner = inner
        self.created: list[int] = []  # the number of children in each create_children call
        self.refused: list[tuple[str, str]] = []  # (run id, error type) of refused finish_steps
        self._lock = threading.Lock()

    def create_children(self, claim: port.Claim, children: Sequence[port.NewRun]) -> list[port.Run]:
        with self._lock:
            self.created.append(len(children))
        return self._inner.create_children(claim, children)

    def finish_step(
        self,
        claim: port.Claim,
        entries: Sequence[port.JournalEntry],
        marks: Sequence[port.Mark] = (),
    ) -> None:
        try:
            self._inner.finish_step(claim, entries, marks)
        except BaseException as exc:
            with self._lock:
                self.refused.append((claim.run_id, type(exc).__name__))
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class Hiding:
    """The app as a worker's registry, minus some workflows it will never claim.

    Workflow code can still start children of a hidden workflow; they stay
    ``queued`` because no worker serves them.
    """

    def __init__(self, app: perdure.App, *hidden: str) -> None:
        self._app = app
        self._hidden = set(hidden)
        self.name = app.name
        self.max_failures = app.max_failures
        self.payload_limit = app.payload_limit
        self.payloads = app.payloads
        self.retention = app.retention

    def workflow_def(self, name: str) -> Any:
        return self._app.workflow_def(name)

    def workflow_versions(self) -> list[tuple[str, str]]:
        return [(n, v) for n, v in self._app.workflow_versions() if n not in self._hidden]

    def workflow_ref(self, workflow: Any) -> tuple[str, str, Any]:
        return self._app.workflow_ref(workflow)


# -- child runs ---------------------------------------------------------------------


def test_child_results_pause_the_parent_and_a_key_creates_the_child_once(
    make_app: Callable[..., perdure.App],
) -> None:
    app = make_app()
    opened = threading.Event()
    squared: list[int] = []

    @app.step()
    def square(x: int) -> int:
        gate(opened)
        squared.append(x)
        return x * x

    @app.workflow()
    def kid(ctx: perdure.Context, x: int) -> int:
        return square(x)

    @app.workflow()
    def parent(ctx: perdure.Context, x: int) -> dict[str, Any]:
        a = ctx.start_child(kid, x)
        b = ctx.start_child(kid, x + 1, key="kid-b")
        # The same key and input: the same run, not a new one.
        again = ctx.start_child(kid, x + 1, key="kid-b")
        return {
            "ids": [a.run_id, b.run_id, again.run_id],
            "results": [a.result(), b.result(), again.result()],
        }

    with app.worker(**WORKER):
        handle = app.start(parent, 3)
        wait_state(app, handle.run_id, "waiting")
        kids = wait_for(lambda: len(r := runs_of(app, "kid")) == 2 and r, "two child runs")
        by_key = {k.key: k for k in kids}
        first = by_key[f"{handle.run_id}/1"]  # a child's default key: parent run / position
        second = by_key[f"{handle.run_id}/kid-b"]  # a caller's key is scoped to the parent
        assert {k.parent_id for k in kids} == {handle.run_id}
        # The parent pauses on the first result, on a wait of kind "child".
        assert [(w.name, w.kind) for w in app.waits(handle.run_id)] == [
            (f"child:{first.run_id}", "child")
        ]
        assert app.children(handle.run_id) == {"running": 2}
        opened.set()
        result = handle.result(timeout=LIMIT)

    assert result == {
        "ids": [first.run_id, second.run_id, second.run_id],
        "results": [9, 16, 16],
    }
    assert sorted(squared) == [3, 4]  # the keyed child ran once
    assert len(runs_of(app, "kid")) == 2
    assert app.children(handle.run_id) == {"succeeded": 2}
    assert journal(app, handle.run_id) == [
        (1, "child", "kid", "ok"),
        (2, "child", "kid", "ok"),
        (3, "child", "kid", "ok"),
        (4, "child_result", first.run_id, "ok"),
        (5, "child_result", second.run_id, "ok"),
        (6, "child_result", second.run_id, "ok"),
    ]
    history = kinds(app, handle.run_id)
    assert history.count("woken") >= 1  # a child's end woke the parked parent
    assert history.count("outcome_applied") == 3
    assert history[-1] == "finished"


def test_a_failed_child_raises_child_failed_in_the_parent(
    make_app: Callable[..., perdure.App],
) -> None:
    app = make_app()
    after: list[str] = []

    @app.workflow()
    def bad_kid(ctx: perdure.Context) -> int:
        raise ValueError("the kid broke")

    @app.step()
    def note(text: str) -> str:
        after.append(text)
        return text

    @app.workflow()
    def catching(ctx: perdure.Context) -> dict[str, Any]:
        child = ctx.start_child(bad_kid)
        try:
            child.result()
        except perdure.ChildFailed as failed:
            note("caught")
            return {
                "child": child.run_id,
                "run_id": failed.run_id,
                "state": failed.state,
                "code": failed.error.get("code"),
            }
        return {}

    @app.workflow()
    def uncaught(ctx: perdure.Context) -> int:
        return int(ctx.start_child(bad_kid).result())

    with app.worker(**WORKER):
        caught = app.start(catching)
        result = caught.result(timeout=LIMIT)
        loose = app.start(uncaught)
        info = wait_state(app, loose.run_id, "failed", "succeeded", "needs_attention")

    assert result == {
        "child": result["child"],
        "run_id": result["child"],
        "state": "failed",
        "code": "workflow_failed",
    }
    kid = app.get(result["child"])
    assert (kid.state, kid.parent_id) == ("failed", caught.run_id)
    assert kid.error is not None and "the kid broke" in kid.error["message"]
    assert after == ["caught"]
    assert app.children(caught.run_id) == {"failed": 1}

    assert info.state == "failed"
    assert info.error is not None
    assert info.error["code"] == "child_failed"
    (loose_kid,) = [r for r in runs_of(app, "bad_kid") if r.parent_id == loose.run_id]
    assert loose_kid.run_id in info.error["message"]
    assert [e[1:] for e in journal(app, loose.run_id)] == [
        ("child", "bad_kid", "ok"),
        ("child_result", loose_kid.run_id, "error"),
    ]


def test_a_canceled_child_raises_child_failed_in_the_parent(
    make_app: Callable[..., perdure.App],
) -> None:
    app = make_app()

    @app.workflow()
    def sleepy_kid(ctx: perdure.Context) -> str:
        return str(ctx.wait("never"))

    @app.workflow()
    def watcher(ctx: perdure.Context) -> dict[str, Any]:
        child = ctx.start_child(sleepy_kid)
        try:
            return {"result": child.result()}
        except perdure.ChildFailed as failed:
            return {"child": failed.run_id, "state": failed.state}

    with app.worker(**WORKER):
        handle = app.start(watcher)
        wait_state(app, handle.run_id, "waiting")
        (kid,) = wait_for(lambda: runs_of(app, "sleepy_kid"), "the child run")
        wait_state(app, kid.run_id, "waiting")
        assert app.cancel(kid.run_id) is True
        assert app.get(kid.run_id).state == "canceled"  # a waiting run is canceled at once
        result = handle.result(timeout=LIMIT)

    assert result == {"child": kid.run_id, "state": "canceled"}
    assert app.get(handle.run_id).cancel_requested is False  # canceling a child spares its parent
    assert app.children(handle.run_id) == {"canceled": 1}


def test_two_parents_using_the_same_child_key_each_get_their_own_child(
    make_app: Callable[..., perdure.App],
) -> None:
    app = make_app()

    @app.workflow()
    def kid(ctx: perdure.Context, x: int) -> int:
        return x

    @app.workflow()
    def parent(ctx: perdure.Context, x: int) -> int:
        return int(ctx.start_child(kid, x, key="the-kid").result())

    with app.worker(**WORKER):
        first = app.start(parent, 1)
        assert first.result(timeout=LIMIT) == 1
        second = app.start(parent, 2)
        wait_for(lambda: journal(app, second.run_id), "the second parent to record its child")
        (entry,) = [e for e in app.store.journal(second.run_id) if e.kind == "child"]
        handed = codec.decode(entry.output or "{}")["run_id"]
        assert app.get(handed).parent_id == second.run_id  # a child of this parent
        assert second.result(timeout=LIMIT) == 2
    kids = {k.parent_id: k.key for k in runs_of(app, "kid")}
    assert kids == {p.run_id: f"{p.run_id}/the-kid" for p in (first, second)}
    assert app.children(first.run_id) == {"succeeded": 1}
    assert app.children(second.run_id) == {"succeeded": 1}


def test_map_fans_out_a_thousand_children_in_one_store_call(
    make_app: Callable[..., perdure.App], store_url: str
) -> None:
    """One ``create_children`` call creates every child (PG_FAN_OUT of them on PostgreSQL)."""
    fan_out = FAN_OUT if store_url.startswith("sqlite:") else PG_FAN_OUT
    app = make_app()

    @app.workflow()
    def leaf(ctx: perdure.Context, i: int) -> int:
        return i * 2

    @app.workflow()
    def fan(ctx: perdure.Context, n: int) -> int:
        handles = ctx.map(leaf, range(n))
        return sum(int(h.result()) for h in handles)

    store = CountingStore(app.store)
    handle = app.start(fan, fan_out)
    started = time.monotonic()
    with perdure.Worker(app, store, **WORKER):
        result = handle.result(timeout=FAN_OUT_LIMIT)
    took = time.monotonic() - started

    assert result == sum(2 * i for i in range(fan_out))
    assert store.created == [fan_out]  # one create_children call carrying every child
    assert app.children(handle.run_id) == {"succeeded": fan_out}
    entries = app.store.journal(handle.run_id)
    assert [e.position for e in entries] == list(range(1, 2 * fan_out + 1))
    assert Counter((e.kind, e.status) for e in entries) == {
        ("child", "ok"): fan_out,
        ("child_result", "ok"): fan_out,
    }
    children = [codec.decode(e.output or "{}")["run_id"] for e in entries[:fan_out]]
    assert len(set(children)) == fan_out
    inputs = {r.run_id: r.result for r in runs_of(app, "leaf")}
    assert [inputs[c] for c in children] == [2 * i for i in range(fan_out)]
    assert took < FAN_OUT_LIMIT, f"the fan-out took {took:.1f}s on {store_url.split(':')[0]}"


# -- cancellation -------------------------------------------------------------------


def test_cancel_reaches_every_descendant_honestly(make_app: Callable[..., perdure.App]) -> None:
    """Cancel a tree holding queued, waiting and running runs and one inside a once step.

    root (waiting on its children)
    ├── waiter (waiting on a signal) ── later (queued: no worker serves it)
    ├── runner (running, held inside an idempotent step; cleans up in ``finally``)
    ├── oncer (running, held inside a ``once`` step)
    └── later (queued)
    """
    app = make_app()
    runner_in, runner_go = threading.Event(), threading.Event()
    oncer_in, oncer_go = threading.Event(), threading.Event()
    calls: Counter[str] = Counter()
    seen: list[str] = []

    @app.step()
    def hold(who: str) -> str:
        calls["hold"] += 1
        runner_in.set()
        gate(runner_go)
        return who

    @app.step()
    def after_hold() -> str:
        calls["after_hold"] += 1
        return "after"

    @app.step()
    def clean_up(who: str) -> str:
        calls["clean_up"] += 1
        return f"cleaned {who}"

    @app.step(effect="once", retry=perdure.Retry(max_attempts=1))
    def charge(cents: int) -> str:
        calls["charge"] += 1
        oncer_in.set()
        gate(oncer_go)
        return f"charged {cents}"

    @app.workflow()
    def later(ctx: perdure.Context) -> str:
        return "never runs"

    @app.workflow()
    def waiter(ctx: perdure.Context) -> str:
        ctx.start_child(later)
        return str(ctx.wait("never"))

    @app.workflow()
    def runner(ctx: perdure.Context) -> str:
        try:
            hold("runner")
            return after_hold()
        except perdure.Canceled:
            seen.append("runner saw Canceled")
            raise
        finally:
            clean_up("runner")

    @app.workflow()
    def oncer(ctx: perdure.Context) -> str:
        return charge(100)

    @app.workflow()
    def root(ctx: perdure.Context) -> list[Any]:
        kids = [ctx.start_child(w) for w in (waiter, runner, oncer, later)]
        return [k.result() for k in kids]

    store = CountingStore(app.store)
    worker = perdure.Worker(Hiding(app, "later"), store, **WORKER)
    try:
        with worker:
            top = app.start(root)
            wait_state(app, top.run_id, "waiting")
            assert runner_in.wait(LIMIT) and oncer_in.wait(LIMIT)
            children = wait_for(
                lambda: (
                    len(
                        r := [
                            *runs_of(app, "waiter"),
                            *runs_of(app, "runner"),
                            *runs_of(app, "oncer"),
                        ]
                    )
                    == 3
                    and r
                ),
                "the children",
            )
            tree = {r.workflow: r for r in children}
            wait_state(app, tree["waiter"].run_id, "waiting")
            laters = wait_for(lambda: len(r := runs_of(app, "later")) == 2 and r, "both laters")
            assert {r.state for r in laters} == {"queued"}
            assert {r.parent_id for r in laters} == {top.run_id, tree["waiter"].run_id}
            oncer_id, runner_id = tree["oncer"].run_id, tree["runner"].run_id
            assert journal(app, oncer_id) == [(1, "step", "charge", "started")]
            assert app.children(top.run_id) == {"waiting": 1, "running": 2, "queued": 1}

            assert app.cancel(top.run_id) is True

            # Queued and waiting runs are canceled at once, at every depth.
            for run_id in (top.run_id, tree["waiter"].run_id, *(r.run_id for r in laters)):
                assert app.get(run_id).state == "canceled", run_id
                assert kinds(app, run_id)[-1] == "canceled"
            assert app.waits(tree["waiter"].run_id) == []
            with pytest.raises(perdure.RunFinished):
                app.signal(tree["waiter"].run_id, "never", "too late")
            # Running ones are only asked to stop.
            for run_id in (runner_id, oncer_id):
                info = app.get(run_id)
                assert (info.state, info.cancel_requested) == ("running", True)
                assert "cancel_requested" in kinds(app, run_id)

            # The runner stops at its next journal write; its code sees Canceled
            # and its clean-up step in `finally` is journaled.
            runner_go.set()
            info = wait_state(app, runner_id, "canceled", "succeeded", "failed", "needs_attention")
            assert info.state == "canceled"
            assert canceled_cleanly(info)
            assert seen == ["runner saw Canceled"]
            assert journal(app, runner_id) == [
                (1, "step", "hold", "ok"),
                (2, "step", "clean_up", "ok"),
            ]
            assert (calls["hold"], calls["after_hold"], calls["clean_up"]) == (1, 0, 1)
            assert kinds(app, runner_id)[-1] == "canceled"

            # The oncer is stuck inside its once step: its lease is no longer
            # renewed, the run is taken over and, its effect being unsettled,
            # ends needs_attention rather than a clean canceled.
            info = wait_state(app, oncer_id, "needs_attention", "canceled", "succeeded", "failed")
            assert info.state == "needs_attention"
            assert info.error is not None
            assert (info.error["code"], info.error["step"]) == ("effect_outcome_unknown", "charge")
            stuck = (app.get(oncer_id), app.store.journal(oncer_id), app.history(oncer_id))
            assert [(e.name, e.status) for e in stuck[1]] == [("charge", "started")]
            assert "recovered" in [r.kind for r in stuck[2]]

            # The body finally returns; its late outcome is refused by the fence.
            # (The runner's first write was refused too: Canceled, then written as it unwound.)
            assert store.refused == [(runner_id, "Canceled")]
            oncer_go.set()
            wait_for(lambda: len(store.refused) == 2, "the stuck step's late write to be refused")
            assert store.refused == [(runner_id, "Canceled"), (oncer_id, "StaleClaim")]
            assert calls["charge"] == 1
            assert app.get(oncer_id) == stuck[0]
            assert app.store.journal(oncer_id) == stuck[1]
            assert app.history(oncer_id) == stuck[2]
    finally:
        runner_go.set()
        oncer_go.set()

    assert app.children(top.run_id) == {"canceled": 3, "needs_attention": 1}
    assert app.children(tree["waiter"].run_id) == {"canceled": 1}
    assert app.cancel(top.run_id) is False  # nothing left to change
    with pytest.raises(perdure.RunFailed) as ended:
        top.result(timeout=1)
    assert ended.value.state == "canceled"


def test_a_once_step_that_returns_after_the_cancel_has_its_outcome_recorded(
    make_app: Callable[..., perdure.App],
) -> None:
    """The cancel arrives while the once step runs; the step returns before the run stops.

    Its outcome is known, so it is recorded (never lost) and the run ends
    canceled with nothing unsettled: no risk is hidden. (Contrast with the
    tree test, where the step never returned before the run was settled.)
    """
    app = make_app()
    inside, release = threading.Event(), threading.Event()
    calls: Counter[str] = Counter()

    @app.step(effect="once", retry=perdure.Retry(max_attempts=1))
    def charge() -> str:
        calls["charge"] += 1
        inside.set()
        gate(release)
        return "ch-9"

    @app.step()
    def after() -> str:
        calls["after"] += 1
        return "after"

    @app.workflow()
    def pay(ctx: perdure.Context) -> list[str]:
        return [charge(), after()]

    with app.worker(**WORKER):
        handle = app.start(pay)
        assert inside.wait(LIMIT)
        assert app.cancel(handle.run_id) is True
        assert app.get(handle.run_id).state == "running"
        release.set()
        info = wait_state(app, handle.run_id, "canceled", "needs_attention", "succeeded")

    assert info.state == "canceled"
    assert canceled_cleanly(info)
    entries = app.store.journal(handle.run_id)
    assert [(e.name, e.status) for e in entries] == [("charge", "ok")]
    assert codec.decode(entries[0].output or "null") == "ch-9"
    assert calls == Counter({"charge": 1})
    history = kinds(app, handle.run_id)
    assert history.index("effect_started") < history.index("cancel_requested")
    assert history[-2:] == ["step_completed", "canceled"]


def _pausing_app(
    make_app: Callable[..., perdure.App],
) -> tuple[perdure.App, Any, Counter[str], list[str]]:
    """``retrying``: a step that fails and waits 30 s before its retry; clean-up in ``finally``."""
    app = make_app()
    calls: Counter[str] = Counter()
    seen: list[str] = []

    @app.step(retry=perdure.Retry(max_attempts=3, initial_delay=30, jitter=False, park_after=60))
    def flaky() -> str:
        calls["flaky"] += 1
        raise ConnectionError("try again later")

    @app.step()
    def clean_up() -> str:
        calls["clean_up"] += 1
        return "cleaned"

    @app.workflow()
    def retrying(ctx: perdure.Context) -> str:
        try:
            return flaky()
        except perdure.Canceled:
            seen.append("Canceled")
            raise
        finally:
            clean_up()

    return app, retrying, calls, seen


def _cancel_in_the_pause(app: perdure.App, retrying: Any, calls: Counter[str]) -> str:
    with app.worker(**WORKER):
        handle = app.start(retrying)
        wait_for(lambda: calls["flaky"] == 1, "the first attempt to fail")
        assert app.cancel(handle.run_id) is True
        # Far sooner than the 30 s pause: the heartbeat learns of the cancel.
        wait_state(app, handle.run_id, "canceled", "failed", "needs_attention", timeout=5)
    return handle.run_id


def test_a_cancel_during_a_retry_pause_stops_the_run_at_its_heartbeat(
    make_app: Callable[..., perdure.App],
) -> None:
    app, retrying, calls, seen = _pausing_app(make_app)
    run_id = _cancel_in_the_pause(app, retrying, calls)
    info = app.get(run_id)
    assert info.state == "canceled"
    assert canceled_cleanly(info)
    assert seen == ["Canceled"]
    assert calls["flaky"] == 1  # never retried
    assert "cancel_requested" in kinds(app, run_id)


def test_a_clean_up_step_runs_after_a_cancel_during_a_retry_pause(
    make_app: Callable[..., perdure.App],
) -> None:
    """The paused step keeps its position, recorded as canceled; the clean-up comes next."""
    app, retrying, calls, seen = _pausing_app(make_app)
    run_id = _cancel_in_the_pause(app, retrying, calls)
    assert canceled_cleanly(app.get(run_id))
    assert seen == ["Canceled"]
    assert journal(app, run_id) == [(1, "step", "flaky", "error"), (2, "step", "clean_up", "ok")]
    stopped = app.store.journal(run_id)[0]
    assert stopped.attempt == 1
    assert codec.decode(stopped.error or "{}")["code"] == "canceled"
    assert calls == Counter({"flaky": 1, "clean_up": 1})
    assert kinds(app, run_id)[-1] == "canceled"


# -- fork ---------------------------------------------------------------------------


def _pipeline_app(
    make_app: Callable[..., perdure.App],
) -> tuple[perdure.App, Any, Counter[str], dict[str, bool]]:
    app = make_app()
    calls: Counter[str] = Counter()
    broken = {"publish": True}

    @app.step()
    def fetch(x: int) -> str:
        calls["fetch"] += 1
        return f"fetched {x} {uuid.uuid4().hex[:8]}"

    @app.step()
    def transform(text: str) -> str:
        calls["transform"] += 1
        return f"{text.upper()} {uuid.uuid4().hex[:8]}"

    @app.step(retry=perdure.Retry(max_attempts=1))
    def publish(text: str) -> str:
        calls["publish"] += 1
        if broken["publish"]:
            raise RuntimeError("publish has a bug")
        return f"published {text}"

    @app.workflow()
    def pipeline(ctx: perdure.Context, x: int) -> list[str]:
        a = fetch(x)
        b = transform(a)
        c = fetch(x + 1)  # a second call of fetch: its key is fetch#2
        return [a, b, c, publish(b)]

    return app, pipeline, calls, broken


def test_fork_after_a_failure_reuses_the_recorded_steps(
    make_app: Callable[..., perdure.App],
) -> None:
    app, pipeline, calls, broken = _pipeline_app(make_app)
    with app.worker(**WORKER):
        failed = app.start(pipeline, 5)
        info = wait_state(app, failed.run_id, "failed", "succeeded", "needs_attention")
        assert info.state == "failed"
        assert info.error is not None
        assert (info.error["code"], info.error["step"]) == ("step_failed", "publish")
        old = app.store.journal(failed.run_id)
        assert [(e.name, e.status) for e in old] == [
            ("fetch", "ok"),
            ("transform", "ok"),
            ("fetch#2", "ok"),
            ("publish", "error"),
        ]
        assert calls == Counter({"fetch": 2, "transform": 1, "publish": 1})

        broken["publish"] = False  # the fix
        forked = app.fork(failed.run_id)
        assert forked.run_id != failed.run_id
        result = forked.result(timeout=LIMIT)

    recorded = [codec.decode(e.output or "null") for e in old[:3]]
    assert result == [*recorded, f"published {recorded[1]}"]
    assert calls == Counter({"fetch": 2, "transform": 1, "publish": 2})  # only publish re-ran
    new = app.store.journal(forked.run_id)
    assert new[:3] == old[:3]
    assert [(e.name, e.status) for e in new] == [
        ("fetch", "ok"),
        ("transform", "ok"),
        ("fetch#2", "ok"),
        ("publish", "ok"),
    ]
    info = app.get(forked.run_id)
    assert (info.workflow, info.version, info.state) == ("pipeline", "1", "succeeded")
    assert app.get(failed.run_id).state == "failed"  # the original is left as it was
    assert app.store.journal(failed.run_id) == old
    assert kinds(app, forked.run_id)[0] == "initialized"


def test_fork_from_a_step_runs_again_from_there(make_app: Callable[..., perdure.App]) -> None:
    app, pipeline, calls, broken = _pipeline_app(make_app)
    broken["publish"] = False
    with app.worker(**WORKER):
        first = app.start(pipeline, 1)
        original = first.result(timeout=LIMIT)
        assert calls == Counter({"fetch": 2, "transform": 1, "publish": 1})

        with pytest.raises(perdure.InvalidInput, match="no step"):
            app.fork(first.run_id, from_step="fetch#3")

        from_second = app.fork(first.run_id, from_step="fetch#2").result(timeout=LIMIT)
        assert calls == Counter({"fetch": 3, "transform": 1, "publish": 2})
        assert from_second[:2] == original[:2]  # fetch and transform reused
        assert from_second[2] != original[2]  # fetch#2 ran again (a fresh nonce)

        from_transform = app.fork(first.run_id, from_step="transform").result(timeout=LIMIT)
        assert calls == Counter({"fetch": 4, "transform": 2, "publish": 3})
        assert from_transform[0] == original[0]
        assert from_transform[1] != original[1]
        assert from_transform[3] == f"published {from_transform[1]}"


def test_fork_reuses_a_finished_child_and_creates_no_other(
    make_app: Callable[..., perdure.App],
) -> None:
    app = make_app()
    calls: Counter[str] = Counter()
    broken = {"on": True}

    @app.step()
    def compute(x: int) -> int:
        calls["compute"] += 1
        return x * 10

    @app.step(retry=perdure.Retry(max_attempts=1))
    def report(value: int) -> str:
        calls["report"] += 1
        if broken["on"]:
            raise RuntimeError("report has a bug")
        return f"reported {value}"

    @app.workflow()
    def kid(ctx: perdure.Context, x: int) -> int:
        return compute(x)

    @app.workflow()
    def parent(ctx: perdure.Context) -> str:
        return report(ctx.start_child(kid, 4).result())

    with app.worker(**WORKER):
        failed = app.start(parent)
        assert wait_state(app, failed.run_id, "failed", "succeeded").state == "failed"
        broken["on"] = False
        forked = app.fork(failed.run_id)
        assert forked.result(timeout=LIMIT) == "reported 40"

    assert calls == Counter({"compute": 1, "report": 2})
    assert len(runs_of(app, "kid")) == 1
    assert [e[1:] for e in journal(app, forked.run_id)][:2] == [
        e[1:] for e in journal(app, failed.run_id)
    ][:2]


def test_fork_of_a_parent_whose_child_result_was_not_recorded_starts_its_own_child(
    make_app: Callable[..., perdure.App],
) -> None:
    app = make_app()
    calls: Counter[str] = Counter()
    broken = {"on": True}

    @app.step()
    def compute(x: int) -> int:
        calls["compute"] += 1
        return x * 10

    @app.step(retry=perdure.Retry(max_attempts=1))
    def check() -> str:
        calls["check"] += 1
        if broken["on"]:
            raise RuntimeError("check has a bug")
        return "checked"

    @app.workflow()
    def kid(ctx: perdure.Context, x: int) -> int:
        return compute(x)

    @app.workflow()
    def parent(ctx: perdure.Context) -> list[Any]:
        child = ctx.start_child(kid, 4)
        return [check(), child.result()]

    with app.worker(**WORKER):
        failed = app.start(parent)
        assert wait_state(app, failed.run_id, "failed", "succeeded").state == "failed"
        assert [e[1:] for e in journal(app, failed.run_id)] == [
            ("child", "kid", "ok"),
            ("step", "check", "error"),
        ]
        wait_for(lambda: app.children(failed.run_id) == {"succeeded": 1}, "the first child")
        broken["on"] = False
        forked = app.fork(failed.run_id)
        assert forked.result(timeout=LIMIT) == ["checked", 40]

    # The old child reports to the old parent only, so the fork started its own.
    kids = runs_of(app, "kid")
    assert sorted(k.parent_id or "" for k in kids) == sorted([failed.run_id, forked.run_id])
    assert app.children(forked.run_id) == {"succeeded": 1}
    assert calls == Counter({"compute": 2, "check": 2})


# -- resolve ------------------------------------------------------------------------


def _ambiguous_app(
    make_app: Callable[..., perdure.App],
) -> tuple[perdure.App, Any, Counter[str]]:
    """``checkout``: reserve, a once ``charge`` that raises a plain error (ambiguous), ship."""
    app = make_app()
    calls: Counter[str] = Counter()

    @app.step()
    def reserve(order: str) -> int:
        calls["reserve"] += 1
        return 250

    @app.step(effect="once", retry=perdure.Retry(max_attempts=3, initial_delay=0))
    def charge(order: str, cents: int) -> str:
        calls["charge"] += 1
        raise ConnectionError("the gateway hung up")

    @app.step()
    def ship(charge_id: str) -> str:
        calls["ship"] += 1
        return f"shipped after {charge_id}"

    @app.workflow()
    def checkout(ctx: perdure.Context, order: str) -> str:
        return ship(charge(order, reserve(order)))

    return app, checkout, calls


def _parked(app: perdure.App, checkout: Any) -> str:
    with app.worker(**WORKER):
        run_id = app.start(checkout, "o-1").run_id
        info = wait_state(app, run_id, "needs_attention", "failed", "succeeded")
    assert info.state == "needs_attention"
    assert info.error is not None
    assert (info.error["code"], info.error["step"], info.error["attempt"]) == (
        "effect_outcome_unknown",
        "charge",
        1,
    )
    return run_id


def test_resolve_with_an_output_requeues_the_run_and_leaves_a_receipt(
    make_app: Callable[..., perdure.App],
) -> None:
    app, checkout, calls = _ambiguous_app(make_app)
    run_id = _parked(app, checkout)
    assert calls == Counter({"reserve": 1, "charge": 1})  # a once step is never retried
    before = app.history(run_id)

    info = app.resolve(run_id, "charge", output="ch-42", note="seen in the gateway dashboard")
    assert info.state == "queued"
    assert info.error is None
    entries = app.store.journal(run_id)
    assert [(e.name, e.status) for e in entries] == [("reserve", "ok"), ("charge", "ok")]
    assert codec.decode(entries[1].output or "null") == "ch-42"
    history = app.history(run_id)
    assert history[: len(before)] == before
    (receipt,) = history[len(before) :]
    assert (receipt.kind, receipt.step, receipt.sequence) == ("resolved", "charge", len(before) + 1)
    assert receipt.note is not None
    assert receipt.note.startswith("resolved by ")  # who
    assert "seen in the gateway dashboard" in receipt.note  # why
    assert "succeeded" in receipt.note
    assert abs(receipt.at - datetime.now(UTC)) < timedelta(minutes=1)  # when

    with app.worker(**WORKER):
        assert app.handle(run_id).result(timeout=LIMIT) == "shipped after ch-42"
    assert calls == Counter({"reserve": 1, "charge": 1, "ship": 1})
    assert journal(app, run_id)[-1] == (3, "step", "ship", "ok")


def test_resolve_with_an_error_fails_the_step_and_the_run(
    make_app: Callable[..., perdure.App],
) -> None:
    app, checkout, calls = _ambiguous_app(make_app)
    run_id = _parked(app, checkout)
    info = app.resolve(run_id, "charge", error="the card was declined", note="bank says no")
    assert info.state == "failed"
    assert info.error == {
        "code": "resolved_failed",
        "message": "the card was declined",
        "step": "charge",
    }
    entries = app.store.journal(run_id)
    assert [(e.name, e.status) for e in entries] == [("reserve", "ok"), ("charge", "error")]
    assert "the card was declined" in (entries[1].error or "")
    receipt = app.history(run_id)[-1]
    assert (receipt.kind, receipt.step) == ("resolved", "charge")
    assert receipt.note is not None and "bank says no" in receipt.note and "failed" in receipt.note
    with app.worker(**WORKER), pytest.raises(perdure.RunFailed) as caught:
        app.handle(run_id).result(timeout=1)
    assert caught.value.error["code"] == "resolved_failed"
    # The exception's own code is stable; the run's is kept apart.
    assert (caught.value.code, caught.value.error_code) == ("run_failed", "resolved_failed")
    assert calls == Counter({"reserve": 1, "charge": 1})


def test_resolve_refuses_unless_the_run_is_stopped_on_that_step(
    make_app: Callable[..., perdure.App],
) -> None:
    app, checkout, _ = _ambiguous_app(make_app)
    queued = app.start(checkout, "o-queued")
    with pytest.raises(perdure.NotResolvable, match="queued"):
        app.resolve(queued.run_id, "charge", output="x")

    run_id = _parked(app, checkout)
    before = (app.get(run_id), app.store.journal(run_id), app.history(run_id))
    with pytest.raises(perdure.NotResolvable, match="charge"):
        app.resolve(run_id, "reserve", output=1)
    with pytest.raises(perdure.NotResolvable):
        app.resolve(run_id, "charge#2", output="x")
    with pytest.raises(perdure.InvalidInput):
        app.resolve(run_id, "charge", output="x", error="both")
    with pytest.raises(perdure.InvalidInput):
        app.resolve(run_id, "charge")
    with pytest.raises(perdure.RunNotFound):
        app.resolve("no-such-run", "charge", output="x")
    assert (app.get(run_id), app.store.journal(run_id), app.history(run_id)) == before

    app.resolve(run_id, "charge", output="ch-1")
    with pytest.raises(perdure.NotResolvable):  # queued again: nothing to resolve
        app.resolve(run_id, "charge", output="ch-2")
    with app.worker(**WORKER):
        app.handle(run_id).result(timeout=LIMIT)
    with pytest.raises(perdure.NotResolvable):  # succeeded
        app.resolve(run_id, "charge", error="too late")
    assert [r.kind for r in app.history(run_id)].count("resolved") == 1


def test_resolving_children_wakes_their_parent(make_app: Callable[..., perdure.App]) -> None:
    app = make_app()
    calls: Counter[str] = Counter()

    @app.step(effect="once", retry=perdure.Retry(max_attempts=1))
    def charge(n: int) -> str:
        calls["charge"] += 1
        raise ConnectionError("the gateway hung up")

    @app.workflow()
    def pay(ctx: perdure.Context, n: int) -> str:
        return charge(n)

    @app.workflow()
    def payer(ctx: perdure.Context) -> list[str]:
        out = []
        for child in [ctx.start_child(pay, 1), ctx.start_child(pay, 2)]:
            try:
                out.append(f"ok {child.result()}")
            except perdure.ChildFailed as failed:
                out.append(f"{failed.state} {failed.error.get('code')}")
        return out

    with app.worker(**WORKER):
        top = app.start(payer)
        kids = wait_for(
            lambda: (
                len(r := [k for k in runs_of(app, "pay") if k.state == "needs_attention"]) == 2
                and r
            ),
            "both children to need attention",
        )
        wait_state(app, top.run_id, "waiting")  # a child needing attention has not ended
        assert app.children(top.run_id) == {"needs_attention": 2}
        first, second = sorted(kids, key=lambda k: k.key or "")
        assert codec.decode(app.store.get_run(first.run_id).input)["args"] == [1]  # type: ignore[union-attr]
        app.resolve(first.run_id, "charge", output="ch-1")
        app.resolve(second.run_id, "charge", error="declined")
        assert top.result(timeout=LIMIT) == ["ok ch-1", "failed resolved_failed"]

    assert calls == Counter({"charge": 2})
    assert app.children(top.run_id) == {"succeeded": 1, "failed": 1}
