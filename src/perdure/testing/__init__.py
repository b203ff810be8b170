"""Test doubles and the store conformance suite, for perdure's tests and yours.

``Environment`` (a throwaway store, an in-process worker and a fake clock),
``temporary_store`` and ``FakeClock`` are the names most tests need; see
docs/testing.md.
"""

from perdure.testing.clock import FakeClock
from perdure.testing.environment import Busy, Environment, temporary_store

__all__ = ["Busy", "Environment", "FakeClock", "temporary_store"]
