"""Plan runs beyond their first execution: forks, plans as children, timeouts, once tasks
that raise, run options a plan refuses, and the deploy check (both stores)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

import perdure
from perdure import check, errors

WAIT = 30


def _diamond(app: perdure.App, fail_transform: list[bool]) -> perdure.Plan:
    plan = app.plan("diamond", version="1")

    @plan.task()
    def extract(day: str) -> list[str]:
        return [day, "x"]

    @plan.task(after=[extract], retry=perdure.Retry(max_attempts=1))
    def transform(extract: list[str]) -> int:
        if fail_transform[0]:
            raise RuntimeError("the warehouse is unreachable")
        return len(extract)

    @plan.task(after=[extract], effect="pure")
    def audit(extract: list[str]) -> bool:
        return True

    @plan.task(after=[transform, audit])
    def publish(transform: int, audit: bool) -> str:
        return f"{transform}/{audit}"

    return plan


def test_a_fork_runs_failed_and_blocked_tasks_again_and_reuses_the_others(
    make_app: Callable[..., perdure.App],
) -> None:
    app = make_app()
    failing = [True]
    plan = _diamond(app, failing)
    handle = app.start(plan, "d1")
    with app.worker(concurrency=2):
        with pytest.raises(errors.RunFailed):
            handle.result(timeout=WAIT)
        before = {t.name: t for t in app.tasks(handle.run_id)}
        assert before["transform"].state == "failed"
        assert before["publish"].state == "blocked"
        failing[0] = False
        forked = app.fork(handle.run_id)
        assert forked.result(timeout=WAIT) == {
            "extract": ["d1", "x"],
            "transform": 2,
            "audit": True,
            "publish": "2/True",
        }
    after = {t.name: t for t in app.tasks(forked.run_id)}
    # Reused outputs were never claimed in the fork.
    assert after["extract"].generation == 0 and after["audit"].generation == 0
    assert after["transform"].generation == 1 and after["publish"].generation == 1


def test_a_fork_from_a_task_runs_it_and_its_descendants_again(
    make_app: Callable[..., perdure.App],
) -> None:
    app = make_app()
    plan = _diamond(app, [False])
    handle = app.start(plan, "d2")
    with app.worker(concurrency=2):
        handle.result(timeout=WAIT)
        forked = app.fork(handle.run_id, "transform")
        forked.result(timeout=WAIT)
    again = {t.name: t.generation for t in app.tasks(forked.run_id)}
    assert again == {"extract": 0, "transform": 1, "audit": 0, "publish": 1}
    with pytest.raises(errors.InvalidInput):
        app.fork(handle.run_id, "nope")


def test_a_live_plan_run_is_not_forked(make_app: Callable[..., perdure.App]) -> None:
    app = make_app()
    plan = _diamond(app, [False])
    handle = app.start(plan, "d3")  # no worker: it stays running
    with pytest.raises(errors.RunNotFinished):
        app.fork(handle.run_id)


def test_a_workflow_starts_a_plan_as_its_child(make_app: Callable[..., perdure.App]) -> None:
    app = make_app()
    plan = _diamond(app, [False])

    @app.workflow()
    def nightly(ctx: perdure.Context, day: str) -> dict[str, object]:
        outputs: dict[str, object] = ctx.start_child(plan, day).result()
        return outputs

    handle = app.start(nightly, "d4")
    with app.worker(concurrency=3):
        result = handle.result(timeout=WAIT)
    assert result["publish"] == "2/True"
    [child] = [r for r in app.runs() if r.parent_id == handle.run_id]
    assert child.workflow == "diamond" and child.state == "succeeded"
    assert [t.state for t in app.tasks(child.run_id)] == ["succeeded"] * 4


def test_a_task_past_its_timeout_fails_and_blocks_its_descendants(
    make_app: Callable[..., perdure.App],
) -> None:
    app = make_app()
    plan = app.plan("slow", version="1")

    @plan.task(timeout=0.2, retry=perdure.Retry(max_attempts=2, initial_delay=0))
    def crawl() -> int:
        time.sleep(2)
        return 1

    @plan.task(after=[crawl])
    def index(crawl: int) -> int:
        return crawl

    handle = app.start(plan)
    started = time.monotonic()
    with app.worker(), pytest.raises(errors.RunFailed) as failed:
        handle.result(timeout=WAIT)
    assert time.monotonic() - started < 1.8  # the attempts were given up on, not waited out
    tasks = {t.name: t for t in app.tasks(handle.run_id)}
    assert tasks["crawl"].state == "failed" and tasks["crawl"].attempt == 2
    assert tasks["crawl"].error is not None and tasks["crawl"].error["code"] == "step_timed_out"
    assert (tasks["index"].state, tasks["index"].blocked_by) == ("blocked", "crawl")
    assert failed.value.error is not None and failed.value.error["task"] == "crawl"


def test_a_once_task_that_raises_needs_attention_unless_it_says_the_effect_failed(
    make_app: Callable[..., perdure.App], tmp_path: Path
) -> None:
    app = make_app()
    plan = app.plan("payments", version="1")
    calls = tmp_path / "calls"
    calls.write_text("")

    @plan.task(effect="once", retry=perdure.Retry(max_attempts=3, initial_delay=0))
    def charge() -> str:
        with calls.open("a") as f:
            f.write("charge\n")
        raise ConnectionError("the gateway hung up")

    @plan.task(effect="once", retry=perdure.Retry(max_attempts=2, initial_delay=0))
    def refund() -> str:
        with calls.open("a") as f:
            f.write("refund\n")
        raise errors.EffectFailed("declined before anything was sent")

    handle = app.start(plan)
    with app.worker(concurrency=2), pytest.raises(errors.RunFailed) as ended:
        handle.result(timeout=WAIT)
    assert ended.value.state == "needs_attention"
    tasks = {t.name: t for t in app.tasks(handle.run_id)}
    assert tasks["charge"].state == "needs_attention"
    assert tasks["charge"].error is not None
    assert tasks["charge"].error["code"] == "effect_outcome_unknown"
    # The ambiguous charge ran once; the refund that said it failed was retried.
    assert sorted(calls.read_text().split()) == ["charge", "refund", "refund"]
    assert tasks["refund"].state == "failed"
    assert ended.value.error is not None and ended.value.error["task"] == "charge"


def test_run_options_a_plan_does_not_take_are_refused(
    make_app: Callable[..., perdure.App],
) -> None:
    app = make_app()
    plan = _diamond(app, [False])
    for option in ("deadline", "queue", "queue_key", "priority"):
        with pytest.raises(errors.InvalidInput, match=option):
            app.start(plan, "d5", **{option: 1})
    with pytest.raises(errors.InvalidInput, match="dry run"):
        app.start(plan, "d5", dry_run=True)
    with pytest.raises(errors.InvalidInput):
        app.start(plan)  # extract needs its day
    assert app.runs() == []


def test_a_plan_run_is_not_suspended(make_app: Callable[..., perdure.App]) -> None:
    app = make_app()
    plan = _diamond(app, [False])
    handle = app.start(plan, "d6")
    with pytest.raises(errors.InvalidInput, match="plan run"):
        app.suspend(handle.run_id)
    assert app.get(handle.run_id).state == "running"


def test_the_deploy_check_reports_a_plan_whose_shape_changed(
    make_app: Callable[..., perdure.App], store_url: str
) -> None:
    app = make_app()
    plan = _diamond(app, [False])
    handle = app.start(plan, "d7")
    assert check.replay_check(app, app.store).mismatches == []
    changed = perdure.App(store_url, name=app.name)
    try:
        other = changed.plan("diamond", version="1")

        @other.task()
        def extract(day: str) -> list[str]:
            return [day]

        report = check.replay_check(changed, changed.store)
        assert [m.run_id for m in report.mismatches] == [handle.run_id]
        assert "plan_mismatch" in report.mismatches[0].attempted
    finally:
        changed.close()
