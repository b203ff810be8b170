"""The soaks on PostgreSQL (kill -9, broken connections) and the proxy they break links with.

The soaks' short forms run here; their long forms' tables are in
RELIABILITY.md. A soak fed a workload that does break an invariant must
report it, so that a clean report means something.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import psycopg
import pytest

from perdure.testing.chaos import __main__ as cli
from perdure.testing.chaos import soak
from perdure.testing.chaos.proxy import FrontendParser, Proxy, is_commit

pytestmark = pytest.mark.postgres


@pytest.mark.slow
def test_the_kill_soak_short_form_holds(postgres_server: str) -> None:
    report = soak.soak(postgres_server, "kill")
    assert report.ok, report.table()
    assert report.kills >= 1
    assert report.runs == sum(report.ends.values()) == soak.SHORT.runs
    assert set(report.ends) <= {"succeeded", "needs_attention"}


@pytest.mark.slow
def test_the_network_soak_short_form_holds(postgres_server: str) -> None:
    report = soak.soak(postgres_server, "network")
    assert report.ok, report.table()
    assert report.ambiguous_commits >= 1
    assert {"reset", "blackhole", "latency", "cut_after_commit"} <= set(report.faults)
    assert report.slowest < soak.BOUND
    assert set(report.ends) <= {"succeeded", "needs_attention"}


@pytest.mark.slow
def test_a_soak_reports_a_once_effect_that_ran_twice(postgres_server: str) -> None:
    # The broken workload does its once effect in a step that retries after it.
    report = soak.soak(postgres_server, "kill", workers=2, runs=3, seconds=4, broken=True)
    assert not report.ok
    twice = [v for v in report.violations if v.startswith("once effect")]
    assert len(twice) == 3, report.table()
    assert all(v.endswith("ran 2 times") for v in twice)


def test_recovery_times_come_from_the_side_records() -> None:
    timeline = [
        {"t": 1.0, "who": "w0.1", "kind": "claim", "run": "a"},
        {"t": 1.1, "who": "w0.1", "kind": "step", "run": "a"},
        {"t": 1.2, "who": "w0.1", "kind": "claim", "run": "b"},
        {"t": 1.3, "who": "w0.1", "kind": "let_go", "run": "b"},
        # w0.1 is killed at 2.0 holding a (b was parked)
        {"t": 3.0, "who": "w1.2", "kind": "claim", "run": "b"},
        {"t": 3.5, "who": "w1.2", "kind": "claim", "run": "a"},
        {"t": 3.75, "who": "w1.2", "kind": "step", "run": "a"},
    ]
    kills = [(2.0, "w0.1")]
    assert soak.recoveries(timeline, kills) == [1.5]
    assert soak.recoveries(timeline, kills, "step") == [1.75]


def test_the_soak_refuses_sqlite_and_unknown_kinds(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["soak", "--store", "sqlite:///x.db"]) == 2
    assert "invalid_store_url" in capsys.readouterr().err
    assert cli.main(["network", "--store", "postgresql://x@127.0.0.1/y", "--workers", "0"]) == 2
    assert "invalid_input" in capsys.readouterr().err


# -- the proxy --------------------------------------------------------------------


@pytest.fixture
def proxy(postgres_url: str) -> Iterator[Proxy]:
    with Proxy.to(postgres_url) as started:
        yield started


def test_the_parser_finds_commits_in_simple_and_extended_queries() -> None:
    parser = FrontendParser()
    startup = b"\x00\x00\x00\x08\x04\xd2\x16\x2f"  # SSLRequest: another startup follows
    body = b"\x00\x03\x00\x00user\x00u\x00\x00"
    startup += (len(body) + 4).to_bytes(4, "big") + body
    query = b"Q" + (len(b"COMMIT\0") + 4).to_bytes(4, "big") + b"COMMIT\0"
    parse = b"P" + (len(b"\0end\0\0\0") + 4).to_bytes(4, "big") + b"\0end\0\0\0"
    stream = startup + query + parse
    found = [m for i in range(0, len(stream), 3) for m in parser.feed(stream[i : i + 3])]
    assert [kind for kind, _ in found] == [b"", b"", b"Q", b"P"]
    assert [is_commit(kind, raw[5:]) for kind, raw in found[2:]] == [True, True]
    assert not is_commit(b"Q", b"SELECT 'COMMIT'\0")


def test_the_proxy_adds_latency(proxy: Proxy, postgres_url: str) -> None:
    with psycopg.connect(proxy.url(postgres_url), autocommit=True) as conn:
        conn.execute("SELECT 1")
        proxy.latency = 0.2
        began = time.monotonic()
        conn.execute("SELECT 1")
        # One chunk each way, each held 0.2 s.
        assert time.monotonic() - began >= 0.4


def test_a_reset_link_fails_the_next_query(proxy: Proxy, postgres_url: str) -> None:
    with psycopg.connect(proxy.url(postgres_url), autocommit=True) as conn:
        conn.execute("SELECT 1")
        (link,) = proxy.live()
        link.reset()
        with pytest.raises(psycopg.OperationalError):
            conn.execute("SELECT 1")


def test_a_blackholed_link_hangs_until_it_is_reset(proxy: Proxy, postgres_url: str) -> None:
    with psycopg.connect(proxy.url(postgres_url), autocommit=True) as conn:
        conn.execute("SELECT 1")
        (link,) = proxy.live()
        began = time.monotonic()
        link.blackhole(0.5)
        with pytest.raises(psycopg.OperationalError):
            conn.execute("SELECT 1")
        assert 0.5 <= time.monotonic() - began < 10


def test_a_cut_after_commit_leaves_the_client_in_doubt_but_the_commit_done(
    proxy: Proxy, postgres_url: str
) -> None:
    with psycopg.connect(postgres_url, autocommit=True) as direct:
        direct.execute("CREATE TABLE cut (n int)")
        with psycopg.connect(proxy.url(postgres_url), autocommit=True) as conn:
            conn.execute("INSERT INTO cut VALUES (1)")  # autocommit: no COMMIT message
            proxy.cut_after_commit()
            with pytest.raises(psycopg.OperationalError), conn.transaction():
                conn.execute("INSERT INTO cut VALUES (2)")
        assert proxy.cuts == 1
        # The server got the COMMIT: the client saw an error, yet the row is there.
        rows = direct.execute("SELECT n FROM cut ORDER BY n").fetchall()
        assert rows == [(1,), (2,)]


def test_the_cli_prints_a_soak_report_as_json(
    postgres_server: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: dict[str, object] = {}

    def fake(url: str, kind: str, **options: object) -> soak.SoakReport:
        seen.update(options, url=url, kind=kind)
        return soak.SoakReport(kind, "short", 0, 3, 1, 0.1, recoveries=[1.0, 2.0])

    monkeypatch.setattr(soak, "soak", fake)
    assert cli.main(["network", "--store", postgres_server, "--json", "--workers", "4"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["ok"] and printed["kind"] == "network" and printed["recovery_p50"] == 1.5
    assert seen["workers"] == 4 and seen["kind"] == "network"
