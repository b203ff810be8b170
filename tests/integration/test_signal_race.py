"""A signal that reads the run before it ends and settles after: the journal answers.

The client reads the run (``waiting``), then settles the wait. If the run ends
in between, the store refuses the settle with ``RunFinished``; the sender must
still get what a sender gets after the run ended: its original receipt on a
retry, ``WaitSettled`` with the stored receipt for any other signal. The
failpoint ends the run right before the client's settle.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

import perdure
from perdure.store import open_store, port
from perdure.testing import faults


@pytest.fixture
def inner(store_url: str) -> Iterator[port.Store]:
    store = open_store(store_url)
    yield store
    store.close()


def _app(store: port.Store) -> perdure.App:
    app = perdure.App(store, name="race")

    @app.workflow()
    def approval(ctx: perdure.Context) -> Any:
        return ctx.wait("approve")

    return app


@pytest.mark.parametrize("retry", [True, False])
def test_a_signal_racing_the_end_of_its_run_is_answered_from_the_journal(
    inner: port.Store, retry: bool
) -> None:
    runner = _app(inner)
    handle = runner.start("approval")
    first: list[perdure.Receipt] = []

    def end_the_run(*args: Any, **kwargs: Any) -> None:
        # Another sender's signal settles the wait and the run ends, all
        # after this client read the run as waiting.
        first.append(runner.signal(handle.run_id, "approve", {"ok": True}, signal_id="s1"))
        with runner.worker(lease_ttl=3, heartbeat=1, poll_interval=0.05):
            assert handle.result(timeout=30) == {"ok": True}

    _wait_state(runner, handle.run_id, "waiting")

    racing = faults.FaultyStore(inner)
    racing.before("settle_wait", end_the_run)
    sender = _app(racing)
    if retry:
        assert sender.signal(handle.run_id, "approve", {"ok": True}, signal_id="s1") == first[0]
    else:
        with pytest.raises(perdure.WaitSettled) as refused:
            sender.signal(handle.run_id, "approve", False, signal_id="s2")
        assert refused.value.receipt == first[0]


def _wait_state(app: perdure.App, run_id: str, state: str) -> None:
    with app.worker(lease_ttl=3, heartbeat=1, poll_interval=0.05):
        deadline = time.monotonic() + 30
        while app.get(run_id).state != state:
            assert time.monotonic() < deadline, f"the run never became {state}"
            time.sleep(0.02)
