"""The Store conformance suite: one set of tests that every store adapter must pass.

The tests are written once against :mod:`perdure.store.port` (its docstrings are
the contract) and run through a *factory* per adapter. An adapter is done when
it passes. To run the suite against an adapter, subclass
:class:`StoreConformance` in a pytest module and give it a ``factory`` fixture
that returns a :class:`StoreFactory`::

    # tests/test_my_store.py
    import pytest

    from perdure.testing import conformance


    class TestMyStore(conformance.StoreConformance):
        @pytest.fixture
        def factory(self, tmp_path) -> conformance.StoreFactory:
            # An empty database per test; the factory opens and migrates it.
            return conformance.url_factory(f"mystore:///{tmp_path}/db", opener=my_opener)

``my_opener(url, clock, ledger_limit)`` is a module-level (picklable) function
that returns a :class:`~perdure.store.port.Store` on the database at ``url``;
the default, :func:`open_existing`, goes through
:func:`perdure.store.open_store` and so serves every adapter that function
names. Set ``processes = False`` on the subclass if the adapter cannot be opened
from another process (the multi-process tests are then skipped), and
``shared = True`` if other processes' writes must wake ``wait_ready`` (a
server database). Call ``pytest.register_assert_rewrite("perdure.testing.conformance")``
at the top of your ``conftest.py`` so that failures show the compared values.
See ``docs/conformance.md``.

What a factory must give: a *fresh, empty, migrated* store that reads time
from the ``clock`` it is given and keeps ``ledger_limit`` receipts per run,
wrapped in a :class:`StoreHandle` that can open more Store objects on the same
database (``reopen()``, used by the cross-connection tests) and in other
processes (``opener`` + ``url``). The suite calls the factory once per test.

The suite orders concurrent work with barriers, never with sleeps, and moves
time only through :class:`~perdure.testing.clock.FakeClock`. Every test
asserts exact states, counts and records, so a failing test names the broken
guarantee. Tests of :meth:`Store.transaction_step` write to a side table
through the connection the adapter hands to the body; override
:meth:`StoreConformance.side_write` and :meth:`StoreConformance.side_keys`
when that connection is not a DB-API connection with ``execute``.

Needs pytest (the ``dev`` extra).
"""

from __future__ import annotations

from perdure.testing.conformance.census import CensusTests
from perdure.testing.conformance.chains import ChainTests
from perdure.testing.conformance.channels import ChannelTests
from perdure.testing.conformance.claims import ClaimTests
from perdure.testing.conformance.control import ControlTests
from perdure.testing.conformance.dryruns import DryRunTests
from perdure.testing.conformance.eagerstarts import EagerStartTests
from perdure.testing.conformance.finish import FinishTests
from perdure.testing.conformance.harness import (
    Opener,
    StoreFactory,
    StoreHandle,
    open_existing,
    url_factory,
)
from perdure.testing.conformance.journal import JournalTests
from perdure.testing.conformance.ledger import LedgerTests
from perdure.testing.conformance.lifecycle import LifecycleTests
from perdure.testing.conformance.live import LiveTests
from perdure.testing.conformance.operators import OperatorTests
from perdure.testing.conformance.overview import OverviewTests
from perdure.testing.conformance.owners import OwnerTests
from perdure.testing.conformance.planends import PlanEndTests
from perdure.testing.conformance.plans import PlanTests
from perdure.testing.conformance.queues import QueueTests
from perdure.testing.conformance.retention import RetentionTests
from perdure.testing.conformance.runs import RunTests
from perdure.testing.conformance.schedules import ScheduleTests
from perdure.testing.conformance.surface import PageTests, TokenTests
from perdure.testing.conformance.sweep import SweepTests
from perdure.testing.conformance.waits import WaitTests
from perdure.testing.conformance.warmclaims import WarmClaimTests

__all__ = [
    "Opener",
    "StoreConformance",
    "StoreFactory",
    "StoreHandle",
    "open_existing",
    "url_factory",
]


class StoreConformance(
    LifecycleTests,
    RunTests,
    ClaimTests,
    WarmClaimTests,
    EagerStartTests,
    DryRunTests,
    JournalTests,
    WaitTests,
    ChannelTests,
    FinishTests,
    OperatorTests,
    LedgerTests,
    SweepTests,
    TokenTests,
    PageTests,
    RetentionTests,
    ScheduleTests,
    QueueTests,
    LiveTests,
    CensusTests,
    OverviewTests,
    ChainTests,
    ControlTests,
    OwnerTests,
    PlanTests,
    PlanEndTests,
):
    """The conformance tests; subclass it and provide a ``factory`` fixture.

    Fixtures a subclass may override: ``factory`` (required), ``clock`` (a
    :class:`~perdure.testing.clock.FakeClock`), ``ledger_limit`` (1000).
    Class attributes: ``processes``, ``shared`` and ``thread_count`` (see
    :class:`~perdure.testing.conformance.harness.Suite`).
    """
