"""Both adapters define the named queries docs/store.md lists, and no others."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from perdure.store import rows, sqlfiles

DOCS = Path(__file__).resolve().parents[2] / "docs"
_ROW = re.compile(r"^\| `([a-z_]+)` \| [^|]+ \| [^|]+ \| (both|sqlite|postgres) \|$", re.MULTILINE)


def _documented() -> dict[str, str]:
    return dict(_ROW.findall((DOCS / "store.md").read_text(encoding="utf-8")))


@pytest.mark.parametrize("adapter", ["sqlite", "postgres"])
def test_adapter_defines_the_documented_queries(adapter: str) -> None:
    documented = _documented()
    expected = {name for name, where in documented.items() if where in ("both", adapter)}
    assert set(sqlfiles.queries(adapter)) == expected


def test_both_adapters_share_all_but_the_documented_few() -> None:
    documented = _documented()
    shared = set(sqlfiles.queries("sqlite")) & set(sqlfiles.queries("postgres"))
    assert shared == {name for name, where in documented.items() if where == "both"}
    assert len(shared) > 3 * (len(documented) - len(shared))


def test_adapters_list_their_queries_in_the_same_order() -> None:
    documented = _documented()
    both = [name for name, where in documented.items() if where == "both"]
    order = {
        adapter: [n for n in sqlfiles.queries(adapter) if n in both]
        for adapter in ("sqlite", "postgres")
    }
    assert order["sqlite"] == order["postgres"]


@pytest.mark.parametrize(
    "name",
    [
        # Clock steps: a sweep pulls leases back within their TTL.
        "sweep_clamp_leases",
        # A cancel reaching runs in needs_attention, and resolving them.
        "cancel_open_waits",
        "cancel_now",
        "cancel_request",
        "resolve_entry",
        "resolve_run",
    ],
)
def test_both_adapters_define_the_clock_and_cancel_queries(name: str) -> None:
    assert _documented().get(name) == "both"
    for adapter in ("sqlite", "postgres"):
        assert name in sqlfiles.queries(adapter), adapter


def test_every_invariant_is_documented() -> None:
    text = (DOCS / "store.md").read_text(encoding="utf-8")
    text += (DOCS / "provenance.md").read_text(encoding="utf-8")
    records = ("run", "journal", "ledger", "wait", "outcome", "message", "update")
    assert "`<record>_<column>`" in text
    for name in rows.INVARIANTS:
        record, _, column = name.partition("_")
        assert f"`{name}`" in text or (record in records and column), name
    for special in ("run_worker_id", "run_claim", "journal_position_taken", "outcome_missing"):
        assert special in rows.INVARIANTS and f"`{special}`" in text


def test_every_postgres_query_is_short_enough_for_psycopg_to_cache_its_parsing() -> None:
    # psycopg parses a query's placeholders once per text only up to these
    # bounds; past them, every call parses the text again.
    from psycopg import _queries

    assert sqlfiles.CACHED_LENGTH == _queries.MAX_CACHED_STATEMENT_LENGTH
    for name, text in sqlfiles.queries("postgres").items():
        params = set(re.findall(r"%\((\w+)\)s", text)) | {"now"}
        assert len(text.encode()) <= sqlfiles.CACHED_LENGTH, name
        assert len(params) <= _queries.MAX_CACHED_STATEMENT_PARAMS, name


def test_queries_are_sent_without_their_comments_under_their_name() -> None:
    for adapter in ("sqlite", "postgres"):
        for name, text in sqlfiles.queries(adapter).items():
            first, *rest = text.splitlines()
            assert first == f"-- perdure: {name}", (adapter, name)
            assert rest and not any(ln.startswith("--") or not ln.strip() for ln in rest), name
