"""A run keeps the ledger bound it was written with; readers with another bound see it healthy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable

import perdure


def test_a_run_written_with_a_small_bound_reads_healthy_with_the_default(
    make_app: Callable[..., perdure.App], store_url: str
) -> None:
    writer = make_app("bounded", ledger_limit=3)

    @writer.step()
    def add(x: int) -> int:
        return x + 1

    @writer.workflow()
    def count(ctx: perdure.Context, n: int) -> int:
        total = 0
        for _ in range(n):
            total = add(total)
        return total

    with writer.worker(lease_ttl=3, heartbeat=1):
        handle = writer.start(count, 5)
        assert handle.result(timeout=60) == 5
    kept = writer.history(handle.run_id)
    assert len(kept) == 3
    assert kept[-1].sequence > 3  # older receipts were trimmed

    # Another process, with the default bound, reads the same run.
    reader = make_app("bounded")
    assert [p.sequence for p in reader.history(handle.run_id)] == [p.sequence for p in kept]
    assert reader.get(handle.run_id).state == "succeeded"

    done = subprocess.run(
        [sys.executable, "-m", "perdure", "show", handle.run_id, "--history", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PERDURE_STORE": store_url},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    assert shown["state"] == "succeeded"
    assert [p["sequence"] for p in shown["history"]] == [p.sequence for p in kept]


def test_a_worker_with_another_bound_trims_by_the_runs_own(
    make_app: Callable[..., perdure.App],
) -> None:
    creator = make_app("mixed", ledger_limit=2)
    server = make_app("mixed", ledger_limit=100)

    @creator.step()
    def add(x: int) -> int:
        return x + 1

    def count(ctx: perdure.Context, n: int) -> int:
        total = 0
        for _ in range(n):
            total = add(total)
        return total

    creator.workflow(name="count")(count)
    server.workflow(name="count")(count)
    handle = creator.start("count", 4)
    with server.worker(lease_ttl=3, heartbeat=1):
        assert handle.result(timeout=60) == 4
    kept = server.history(handle.run_id)
    assert len(kept) == 2
    assert kept[-1].sequence > 2
