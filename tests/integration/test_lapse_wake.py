"""An idle worker recovers a dead worker's run when its lease lapses, not at its next poll.

A lapse is announced by nobody. A worker whose poll found nothing asks the
store when the app's next lease lapses and ends its idle wait then, so a run
whose worker died is taken up within moments of its lease, however long the
poll interval. A worker recovers nothing until it trusts the store's clock
(its own lease TTL after it first read it); the dead lease here lapses
after that. The dead worker is a claim made under another worker id that
nobody renews.
"""

from __future__ import annotations

from collections.abc import Callable

import perdure

LEASE = 3.0  # seconds: the dead worker's lease, all the test waits for
OWN_LEASE = 1.5  # the live worker's: it trusts the store's clock this long after starting
POLL = 60.0  # seconds: far longer than the test may take


def test_a_lapsed_run_is_recovered_when_its_lease_lapses(
    make_app: Callable[..., perdure.App],
) -> None:
    app = make_app()

    @app.workflow()
    def hello(ctx: perdure.Context, n: int) -> int:
        return n + 1

    handle = app.start(hello, 41)
    (gone,) = app.store.claim(app.name, "gone-1", app.workflow_versions(), lease_ttl=LEASE)
    with app.worker(poll_interval=POLL, lease_ttl=OWN_LEASE, heartbeat=OWN_LEASE / 3):
        assert handle.result(timeout=POLL / 4) == 42
    lapsed_at = gone.claim.lease_expires_at
    recovered = [h for h in app.history(handle.run_id) if h.kind == "recovered"]
    assert len(recovered) == 1
    # Taken up right after the lapse, not a poll later.
    assert 0 <= (recovered[0].at - lapsed_at).total_seconds() < POLL / 10
