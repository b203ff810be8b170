"""Run the store conformance suite on the PostgreSQL adapter (one database per test)."""

from __future__ import annotations

import pytest

from perdure.testing import conformance

pytestmark = pytest.mark.postgres


class TestPostgresStore(conformance.StoreConformance):
    shared = True

    @pytest.fixture
    def factory(self, postgres_url: str) -> conformance.StoreFactory:
        return conformance.url_factory(postgres_url)
