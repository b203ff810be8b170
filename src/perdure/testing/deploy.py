"""Before a deploy: does the new code replay every live run's journal?"""

from __future__ import annotations

from perdure import app as app_api
from perdure import check


def replay_check(app: app_api.App) -> check.Report:
    """Replay the journal of every live run of ``app`` against its code, on its store.

    Runs that are queued, running or waiting, of a workflow and version the
    app registers, are replayed without executing any step or writing
    anything; ``report.mismatches`` lists each position where the journal
    records one call and the code now makes another (empty: safe to deploy).
    Use it in a test with the journals of runs started by the old code, or
    point the app at a copy of production's store. ``perdure check MODULE:APP``
    does the same from the command line.
    """
    return check.replay_check(app, app.store)
