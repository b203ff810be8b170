"""A process that starts a run beside its own worker dies mid-run; another worker recovers it.

The run was created claimed by the dying process's worker (its ``claimed`` receipt written
with its creation), so no other worker was told of it: it is found when its lease lapses,
recovered once, and every step recorded before the death is replayed, never run again.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from test_crash import DEATH_LIMIT, EXIT_STATUS, STEPS, effects, recover

from perdure import codec
from perdure.store import port

HERE = Path(__file__).resolve().parent


@pytest.mark.parametrize("mode", ["exit", "kill"])
def test_a_run_started_beside_a_worker_that_dies_is_recovered_elsewhere(
    mode: str, store: port.Store, workers: Any, crash_env: dict[str, str]
) -> None:
    env = {**crash_env, "PERDURE_CRASH_AT": "s3:after", "PERDURE_CRASH_MODE": mode}
    dying = subprocess.run(
        [sys.executable, "-c", "import crash_app; crash_app.start_beside(7)"],
        cwd=HERE,
        env=env,
        capture_output=True,
        text=True,
        timeout=DEATH_LIMIT,
    )
    assert dying.returncode == EXIT_STATUS[mode], dying.stderr
    found = re.search(r"^eager-started run ([0-9a-f]{32})$", dying.stderr, re.MULTILINE)
    assert found is not None, dying.stderr
    run_id = found.group(1)

    crashed = store.get_run(run_id)
    assert crashed is not None
    assert (crashed.state, crashed.generation) == ("running", 1)
    first = store.history(run_id)
    assert [r.kind for r in first[:2]] == ["initialized", "claimed"]
    assert first[1].at == crashed.created_at  # claimed as it was created
    assert [e.name for e in store.journal(run_id)] == ["s1", "s2"]
    assert effects(crash_env) == ["s1", "s2", "s3"]

    run = recover(workers, store, run_id)
    assert run.state == "succeeded", (run.error, workers.log("recovering"))
    assert codec.decode(run.result or "null") == [f"{name}:7" for name in STEPS]
    assert run.generation == 2
    counts = Counter(effects(crash_env))
    # s1 and s2 were recorded before the death: once each. s3 ran, unrecorded: again.
    assert counts == {"s1": 1, "s2": 1, "s3": 2, "s4": 1, "s5": 1}
    kinds = [r.kind for r in store.history(run_id)]
    assert (kinds.count("claimed"), kinds.count("recovered"), kinds[-1]) == (1, 1, "finished")
