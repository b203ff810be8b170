"""Run the store conformance suite on the SQLite adapter."""

from __future__ import annotations

import pytest

from perdure.testing import conformance


class TestSqliteStore(conformance.StoreConformance):
    # Processes of one host wake each other through the store's wake-up sockets.
    shared = True

    @pytest.fixture
    def factory(self, sqlite_url: str) -> conformance.StoreFactory:
        return conformance.url_factory(sqlite_url)
