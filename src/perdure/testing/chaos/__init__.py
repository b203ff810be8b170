"""Crash-point exploration: crash a process at every store write and check what survives.

A scenario (an app, a drive that starts runs and sends signals, checks) is run
once to count the store writes its process makes. Then, for each write k and
each mode (an error raised before or after the write, or the process exiting
before or after it), a trial runs the scenario in a child process on a fresh
store, fails it at its k-th write, recovers with a fresh process and checks
the invariants of DESIGN.md §2: no recorded step re-runs, no ``once`` effect
twice, no signal lost or applied twice, every run ends or parks. See
docs/testing.md, "Crash-point exploration"::

    python -m perdure.testing.chaos                       # built-in scenarios, short form
    python -m perdure.testing.chaos mymodule:scenario --long --store postgresql://...

Two soaks run real worker processes on PostgreSQL instead (docs/testing.md,
"Soaks on PostgreSQL"; :mod:`perdure.testing.chaos.soak`)::

    python -m perdure.testing.chaos soak --store postgresql://...      # SIGKILL workers
    python -m perdure.testing.chaos network --store postgresql://...   # break connections
"""

from perdure.testing.chaos.explorer import Report, Row, explore, pick_sites
from perdure.testing.chaos.scenario import Drive, Event, Scenario, TrialView, effect
from perdure.testing.chaos.trial import MODES, Site

__all__ = [
    "MODES",
    "Drive",
    "Event",
    "Report",
    "Row",
    "Scenario",
    "Site",
    "TrialView",
    "effect",
    "explore",
    "pick_sites",
]
