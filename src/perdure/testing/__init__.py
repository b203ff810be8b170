"""Test doubles and the store conformance suite, for perdure's tests and yours.

``Environment`` (a throwaway store, an in-process worker and a fake clock),
``temporary_store`` and ``FakeClock`` are the names most tests need (see
docs/testing.md); ``replay_check`` checks new code against live runs before
a deploy (docs/deploying.md).
"""

from perdure.testing.clock import FakeClock
from perdure.testing.deploy import replay_check
from perdure.testing.environment import Busy, Environment, temporary_store

__all__ = ["Busy", "Environment", "FakeClock", "replay_check", "temporary_store"]
