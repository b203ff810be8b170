"""A worker killed around a continue-as-new transaction: exactly one successor, nothing lost.

The failpoint (``chain_app``) kills a real worker process right before its
``k``-th continue-as-new transaction or right after it committed. A clean
worker then finishes the chain; the test checks the chain's links, the
effects log and that every message and signal was applied exactly once.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from perdure import Client, codec
from perdure.store import port

HERE = Path(__file__).resolve().parent
LAST = 4  # cursors 0..4: five runs, four continues
FEED = [10**i for i in range(1, LAST + 2)]
BONUS = 7


def _start(env: dict[str, str], tmp_path: Path, name: str, **extra: str) -> Any:
    log = open(tmp_path / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen(
        [sys.executable, "-c", "import chain_app; chain_app.serve()"],
        cwd=HERE,
        env={**env, **extra},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    log.close()
    return proc


def _chain(store: port.Store) -> list[port.Run]:
    return store.list_runs("chain", workflow="looper", limit=100)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["exit", "kill"])
@pytest.mark.parametrize("when", ["before", "after"])
def test_a_worker_killed_around_continue_as_new_leaves_one_successor(
    when: str, mode: str, store: port.Store, crash_env: dict[str, str], tmp_path: Path
) -> None:
    client = Client(store, "chain")
    first = client.start("looper", "1", [0, LAST]).run_id
    for i, amount in enumerate(FEED):
        client.send(first, "feed", f"m{i}", amount)
    client.signal(first, "bonus", BONUS, signal_id="bonus-1")

    crashing = _start(
        crash_env, tmp_path, "crashing", PERDURE_CHAIN_CRASH=f"{when}:2", PERDURE_CRASH_MODE=mode
    )
    status = crashing.wait(timeout=30)
    assert status == (137 if mode == "exit" else -9), (tmp_path / "crashing.log").read_text()

    runs = _chain(store)
    if when == "before":
        # The second continue did not commit: its run is still running, with no successor.
        assert len(runs) == 2
        [live] = [r for r in runs if r.state == "running"]
        assert live.continued_as is None
    else:
        # It committed: the old run ended and exactly one successor waits, queued.
        assert len(runs) == 3
        assert sorted(r.state for r in runs) == ["queued", "succeeded", "succeeded"]

    recovering = _start(crash_env, tmp_path, "recovering")
    try:
        deadline = time.monotonic() + 60
        while (info := client.get(first)).state != "succeeded":
            assert time.monotonic() < deadline, (tmp_path / "recovering.log").read_text()
            assert info.state not in ("failed", "canceled", "needs_attention"), info.error
            time.sleep(0.05)
    finally:
        recovering.terminate()
        assert recovering.wait(timeout=20) == 0, (tmp_path / "recovering.log").read_text()

    info = client.get(first)
    assert info.result == sum(range(LAST + 1)) + sum(FEED) + BONUS
    assert len(info.chain) == LAST + 1 and info.chain[0] == first
    runs = _chain(store)
    assert len(runs) == LAST + 1  # exactly one successor per link
    assert sorted(r.continued_as or "" for r in runs)[1:] == sorted(info.chain[1:])
    for run_id in info.chain:
        kinds = [e.kind for e in store.journal(run_id)]
        assert kinds[:2] == ["step", "receive"] and len(kinds) <= 3
    # Each step ran once: its outcome was recorded before the continue.
    log = Path(crash_env["CRASH_EFFECTS_LOG"]).read_text().split()
    assert log == [f"step{i}" for i in range(LAST + 1)]
    assert codec.decode(store.get_run(info.chain[-1]).result or "0") == info.result  # type: ignore[union-attr]
