"""Processes that start a run with the same key at the same moment get one run."""

from __future__ import annotations

import multiprocessing
import queue
from collections.abc import Callable
from typing import Any

import pytest

import perdure
from perdure.store import open_store

PROCESSES = 4
APP = "race"


def _start_after_barrier(url: str, key: str, open_first: bool, barrier: Any, results: Any) -> None:
    """Meet the others at the barrier, start the run, report its id.

    With ``open_first`` the store is opened before the barrier, so only the
    start races; without, opening (and migrating) the store races too.
    """
    try:
        if not open_first:
            barrier.wait(timeout=60)
        store = open_store(url)
        try:
            client = perdure.Client(store, APP)
            if open_first:
                barrier.wait(timeout=60)
            handle = client.start("order", "1", ["o-1"], key=key)
            results.put(("ok", handle.run_id))
        finally:
            store.close()
    except BaseException as exc:
        results.put(("error", f"{type(exc).__name__}: {exc}"))


@pytest.mark.slow
@pytest.mark.parametrize("key", ["order-1", "order-2"])
@pytest.mark.parametrize("open_first", [True, False], ids=["migrated", "fresh"])
def test_same_key_from_concurrent_processes_creates_one_run(
    store_url: str,
    make_app: Callable[..., perdure.App],
    key: str,
    open_first: bool,
) -> None:
    app = make_app(name=APP)
    if open_first:
        app.store  # noqa: B018 - create the schema first, so that only the start races
    spawn = multiprocessing.get_context("spawn")
    barrier = spawn.Barrier(PROCESSES)
    results = spawn.Queue()
    args = (store_url, key, open_first, barrier, results)
    procs = [spawn.Process(target=_start_after_barrier, args=args) for _ in range(PROCESSES)]
    for proc in procs:
        proc.start()
    try:
        reports = [results.get(timeout=60) for _ in procs]
    except queue.Empty:
        pytest.fail("a starter process reported nothing")
    finally:
        for proc in procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
    assert [p.exitcode for p in procs] == [0] * PROCESSES
    assert [status for status, _ in reports] == ["ok"] * PROCESSES, reports
    run_ids = {run_id for _, run_id in reports}
    assert len(run_ids) == 1

    runs = app.runs()
    assert [r.run_id for r in runs] == list(run_ids)
    assert (runs[0].key, runs[0].state, runs[0].workflow) == (key, "queued", "order")
    assert [r.kind for r in app.history(runs[0].run_id)] == ["initialized"]
