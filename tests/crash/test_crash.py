"""Real worker processes die at every step boundary; a clean worker recovers the run.

The failpoint lives in ``crash_app``: ``PERDURE_CRASH_AT=<step>:<before|after>``
kills the worker right before a step's body runs, or right after it returned
(its effect is in the effects log, its outcome not recorded). The test learns
that the process died from its exit status, reads the journal to know which
outcomes were recorded, then lets a clean worker finish the run.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from perdure import Client, codec
from perdure.store import port

STEPS = ("s1", "s2", "s3", "s4", "s5")
EXIT_STATUS = {"exit": 137, "kill": -9}  # os._exit(137); SIGKILL seen by Popen as -9
DEATH_LIMIT = 20.0
RECOVERY_LIMIT = 20.0


def wait_for(check: Callable[[], Any], what: str, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


def effects(env: dict[str, str]) -> list[str]:
    path = Path(env["CRASH_EFFECTS_LOG"])
    return path.read_text().split() if path.exists() else []


def ended(store: port.Store, run_id: str) -> port.Run:
    run: port.Run = wait_for(
        lambda: (r := store.get_run(run_id)) is not None and r.state in port.TERMINAL_STATES and r,
        f"run {run_id} to end",
        RECOVERY_LIMIT,
    )
    return run


def crash(workers: Any, point: str, mode: str) -> None:
    """Run a worker with the failpoint armed and wait (bounded) for it to die there."""
    proc = workers.start("crashing", PERDURE_CRASH_AT=point, PERDURE_CRASH_MODE=mode)
    status = proc.wait(timeout=DEATH_LIMIT)
    assert status == EXIT_STATUS[mode], workers.log("crashing")


def recover(workers: Any, store: port.Store, run_id: str) -> port.Run:
    """Run a clean worker until the run ends; stop it gracefully."""
    proc = workers.start("recovering")
    try:
        run = ended(store, run_id)
    finally:
        status = workers.stop(proc)
    assert status == 0, workers.log("recovering")
    return run


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["exit", "kill"])
@pytest.mark.parametrize("when", ["before", "after"])
@pytest.mark.parametrize("step", STEPS)
def test_a_worker_killed_at_a_step_boundary_loses_no_progress(
    step: str,
    when: str,
    mode: str,
    store: port.Store,
    workers: Any,
    crash_env: dict[str, str],
) -> None:
    client = Client(store, "crash")
    run_id = client.start("five", "1", [7]).run_id
    crash(workers, f"{step}:{when}", mode)

    k = STEPS.index(step)
    crashed = store.get_run(run_id)
    assert crashed is not None
    assert (crashed.state, crashed.generation) == ("running", 1)
    at_crash = store.journal(run_id)
    assert [(e.position, e.kind, e.name, e.status) for e in at_crash] == [
        (i + 1, "step", name, "ok") for i, name in enumerate(STEPS[:k])
    ]
    in_flight = [step] if when == "after" else []
    assert effects(crash_env) == [*STEPS[:k], *in_flight]

    run = recover(workers, store, run_id)
    assert run.state == "succeeded", (run.error, workers.log("recovering"))
    assert codec.decode(run.result or "null") == [f"{name}:7" for name in STEPS]
    assert run.generation == 2
    assert run.failures == 0

    log = effects(crash_env)
    counts = Counter(log)
    for entry in at_crash:  # every outcome recorded before the crash: exactly once
        assert counts[entry.name] == 1, log
    # Only the idempotent step killed after its body ran may have run twice.
    assert counts[step] == (2 if when == "after" else 1), log
    assert log == [*STEPS[:k], *in_flight, *STEPS[k:]]

    final = store.journal(run_id)
    assert [(e.position, e.name, e.status) for e in final] == [
        (i + 1, name, "ok") for i, name in enumerate(STEPS)
    ]
    assert final[:k] == at_crash  # recorded outcomes were replayed, never rewritten
    history = [r.kind for r in store.history(run_id)]
    assert history.count("recovered") == 1
    assert history.count("claimed") == 1
    assert history[-1] == "finished"


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["exit", "kill"])
@pytest.mark.parametrize("when", ["after", "before"])
def test_a_once_step_killed_mid_effect_needs_attention(
    when: str,
    mode: str,
    store: port.Store,
    workers: Any,
    crash_env: dict[str, str],
) -> None:
    client = Client(store, "crash")
    run_id = client.start("once_flow", "1", [3]).run_id
    crash(workers, f"charge:{when}", mode)

    at_crash = store.journal(run_id)
    # The start of the effect is journaled before its body runs, either way.
    assert [(e.position, e.name, e.status) for e in at_crash] == [
        (1, "prepare", "ok"),
        (2, "charge", "started"),
    ]
    ran = ["prepare", "charge"] if when == "after" else ["prepare"]
    assert effects(crash_env) == ran

    run = recover(workers, store, run_id)
    assert run.state == "needs_attention", (run.error, workers.log("recovering"))
    error = codec.decode(run.error or "{}")
    assert error["code"] == "effect_outcome_unknown"
    assert error["step"] == "charge"
    assert "charge" in error["message"]
    assert effects(crash_env) == ran  # the effect ran at most once; nothing after it ran
    assert store.journal(run_id) == at_crash
    history = [r.kind for r in store.history(run_id)]
    assert history.count("effect_started") == 1
    assert history.count("recovered") == 1

    # The operator checks the outside world and settles it; the run goes on from there.
    assert client.resolve(run_id, "charge", output="charge:3").state == "queued"
    run = recover(workers, store, run_id)
    assert run.state == "succeeded", (run.error, workers.log("recovering"))
    assert codec.decode(run.result or "null") == ["prepare:3", "charge:3", "confirm:3"]
    assert effects(crash_env) == [*ran, "confirm"]


@pytest.mark.slow
def test_a_worker_killed_in_a_once_steps_retry_delay_retries_it(
    store: port.Store, workers: Any, crash_env: dict[str, str]
) -> None:
    client = Client(store, "crash")
    run_id = client.start("refused_once", "1", [4]).run_id
    proc = workers.start("crashing")

    def refusal_recorded() -> bool:
        entries = store.journal(run_id)
        return bool(entries) and entries[0].error is not None

    # The first attempt was refused and journaled as such; the worker now waits
    # out a 30 s retry delay. Kill it there.
    wait_for(refusal_recorded, "the refused attempt to be journaled", DEATH_LIMIT)
    proc.kill()
    assert proc.wait(timeout=DEATH_LIMIT) == -9
    [refusal] = store.journal(run_id)
    assert (refusal.name, refusal.status, refusal.attempt) == ("refusing_charge", "started", 1)
    assert codec.decode(refusal.error or "{}")["code"] == "effect_failed"
    assert effects(crash_env) == ["refusing_charge"]

    run = recover(workers, store, run_id)
    assert run.state == "succeeded", (run.error, workers.log("recovering"))
    assert codec.decode(run.result or "null") == ["refusing_charge:4", "confirm:4"]
    assert effects(crash_env) == ["refusing_charge", "refusing_charge", "confirm"]
    entries = store.journal(run_id)
    assert [(e.name, e.status, e.attempt) for e in entries] == [
        ("refusing_charge", "ok", 2),
        ("confirm", "ok", 1),
    ]


@pytest.mark.slow
def test_a_worker_killed_while_a_backoff_parks_the_run_retries_it_when_due(
    store: port.Store, workers: Any, crash_env: dict[str, str]
) -> None:
    client = Client(store, "crash")
    run_id = client.start("parked_retry", "1", [5]).run_id
    proc = workers.start("crashing")

    def parked() -> bool:
        run = store.get_run(run_id)
        return run is not None and run.state == "waiting"

    # The refused attempt is journaled with the instant of the next one, and
    # the run rests on a timer; kill the worker that parked it.
    wait_for(parked, "the run to park for its backoff", DEATH_LIMIT)
    proc.kill()
    assert proc.wait(timeout=DEATH_LIMIT) == -9
    [refusal] = store.journal(run_id)
    body = codec.decode(refusal.error or "{}")
    assert (refusal.status, body["code"]) == ("started", "effect_failed")
    due = datetime.fromisoformat(body["retry_at"])
    assert effects(crash_env) == ["parking_charge"]

    run = recover(workers, store, run_id)
    assert run.state == "succeeded", (run.error, workers.log("recovering"))
    assert effects(crash_env) == ["parking_charge", "parking_charge", "confirm"]
    # The second attempt was not made before its journaled instant.
    starts = [
        r.at
        for r in client.history(run_id)
        if r.kind == "effect_started" and r.step == "parking_charge"
    ]
    assert len(starts) == 2 and starts[0] < due <= starts[1]
