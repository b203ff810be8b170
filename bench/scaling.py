"""What one step and one run cost a PostgreSQL primary: statements, rows, WAL, syncs.

Runs W3's shape (runs of ten no-op steps, started first, then drained by one
worker with its default settings) against a PostgreSQL server and reads the
server's own counters around each phase: ``pg_stat_wal`` (WAL records, bytes,
full-page images, writes and syncs), ``pg_stat_database`` (commits),
``pg_stat_user_tables`` (rows inserted, updated, HOT-updated, deleted, per
table) and, when the server preloads it, ``pg_stat_statements`` (statements by
text). The statements perdure sends are also counted by query name in this
process. The counters are cluster-wide, so run it against a server nothing
else uses::

    initdb -D /tmp/pgscale -A trust -U postgres
    pg_ctl -D /tmp/pgscale -o "-p 5440 -c shared_preload_libraries=pg_stat_statements" start
    PYTHONPATH=src .venv/bin/python bench/scaling.py \
        --admin postgresql://postgres@127.0.0.1:5440/postgres --runs 2000

It prints a Markdown report; ``docs/scaling.md`` holds one and what follows
from it.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import time
from collections.abc import Iterator
from typing import Any

import psycopg

import perdure
from perdure.store.postgres import store as pg_store

DB = "perdure_scaling"


def _noop(i: int) -> int:
    return i


def build(url: str) -> perdure.App:
    app = perdure.App(url, name="scaling")
    noop = app.step(name="noop")(_noop)

    @app.workflow(name="ten_steps")
    def ten_steps(ctx: perdure.Context, n: int) -> int:
        for i in range(n):
            noop(i)
        return n

    return app


@contextlib.contextmanager
def counted() -> Iterator[collections.Counter[str]]:
    """Count the named queries perdure sends from this process."""
    seen: collections.Counter[str] = collections.Counter()
    original = pg_store.PostgresStore._exec

    def _exec(self: Any, cur: Any, query: str, **params: Any) -> Any:
        seen[query] += 1
        return original(self, cur, query, **params)

    pg_store.PostgresStore._exec = _exec  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        pg_store.PostgresStore._exec = original  # type: ignore[method-assign]


class Server:
    """Reads of the server's cumulative counters."""

    def __init__(self, url: str) -> None:
        self.conn = psycopg.connect(url, autocommit=True)
        self.statements = bool(
            self.conn.execute(
                "SELECT count(*) FROM pg_extension WHERE extname = 'pg_stat_statements'"
            ).fetchone()[0]  # type: ignore[index]
        )

    def reset(self) -> None:
        if self.statements:
            self.conn.execute("SELECT pg_stat_statements_reset()")

    def snapshot(self) -> dict[str, Any]:
        # Backends publish their counters when idle for a moment or on exit.
        time.sleep(1.2)
        self.conn.execute("SELECT pg_stat_clear_snapshot()")
        wal = self.conn.execute(
            "SELECT wal_records, wal_fpi, wal_bytes::bigint, wal_write, wal_sync FROM pg_stat_wal"
        ).fetchone()
        commits = self.conn.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
        tables = {
            name: (ins, upd, hot, dele)
            for name, ins, upd, hot, dele in self.conn.execute(
                "SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del "
                "FROM pg_stat_user_tables WHERE schemaname = 'perdure'"
            ).fetchall()
        }
        statements: list[tuple[str, int, int]] = []
        if self.statements:
            statements = [
                (" ".join(str(q).split())[:90], int(c), int(r))
                for q, c, r in self.conn.execute(
                    "SELECT query, calls, rows FROM pg_stat_statements "
                    "JOIN pg_database d ON d.oid = dbid WHERE d.datname = current_database() "
                    "ORDER BY calls DESC LIMIT 40"
                ).fetchall()
            ]
        lsn = self.conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
        assert wal is not None and commits is not None and lsn is not None
        return {
            "lsn": lsn[0],
            "wal": dict(
                zip(("records", "fpi", "bytes", "writes", "syncs"), map(int, wal), strict=True)
            ),
            "commits": int(commits[0]),
            "tables": tables,
            "statements": statements,
        }

    def unfinished(self) -> int:
        found = self.conn.execute(
            "SELECT count(*) FROM perdure.runs WHERE state <> 'succeeded'"
        ).fetchone()
        return int(found[0]) if found else 0

    def indexes(self) -> dict[str, int]:
        return {
            name: int(n)
            for name, n in self.conn.execute(
                "SELECT tablename, count(*) FROM pg_indexes WHERE schemaname = 'perdure' "
                "GROUP BY tablename"
            ).fetchall()
        }


def diff(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    tables = {}
    for name, now in after["tables"].items():
        was = before["tables"].get(name, (0, 0, 0, 0))
        tables[name] = tuple(a - b for a, b in zip(now, was, strict=True))
    return {
        "lsn": (before["lsn"], after["lsn"]),
        "wal": {k: after["wal"][k] - before["wal"][k] for k in after["wal"]},
        "commits": after["commits"] - before["commits"],
        "tables": tables,
        "statements": after["statements"],
    }


def report(
    phase: str,
    unit: str,
    count: int,
    delta: dict[str, Any],
    queries: collections.Counter[str],
    indexes: dict[str, int],
) -> list[str]:
    wal = delta["wal"]
    lines = [
        f"### {phase}: per {unit} ({count:,} {unit}s)",
        "",
        "| measure | per " + unit + " |",
        "|---|---|",
        f"| commits (`xact_commit`) | {delta['commits'] / count:.2f} |",
        f"| statements perdure sent | {sum(queries.values()) / count:.2f} |",
        f"| WAL records | {wal['records'] / count:.1f} |",
        f"| WAL bytes | {wal['bytes'] / count:,.0f} |",
        f"| WAL full-page images | {wal['fpi'] / count:.2f} |",
        f"| WAL syncs (`wal_sync`) | {wal['syncs'] / count:.3f} |",
    ]
    first, last = delta["lsn"]
    note = f"WAL from {first} to {last} (`pg_waldump --stats=record -s {first} -e {last}`)."
    ins = sum(t[0] for t in delta["tables"].values())
    upd = sum(t[1] for t in delta["tables"].values())
    hot = sum(t[2] for t in delta["tables"].values())
    dele = sum(t[3] for t in delta["tables"].values())
    entries = sum(
        (t[0] + t[1] - t[2]) * indexes.get(name, 0) for name, t in delta["tables"].items()
    )
    lines += [
        f"| rows inserted | {ins / count:.2f} |",
        f"| rows updated (of them HOT) | {upd / count:.2f} ({hot / count:.2f}) |",
        f"| rows deleted | {dele / count:.2f} |",
        f"| index entries written (inserts and non-HOT updates x indexes) | "
        f"{entries / count:.1f} |",
        "",
        "| table | inserted | updated | HOT | deleted | indexes |",
        "|---|---|---|---|---|---|",
    ]
    for name, (i, u, h, d) in sorted(delta["tables"].items()):
        if i or u or d:
            lines.append(
                f"| {name} | {i / count:.2f} | {u / count:.2f} | {h / count:.2f} | "
                f"{d / count:.2f} | {indexes.get(name, 0)} |"
            )
    lines += ["", "| query (by name) | per " + unit + " |", "|---|---|"]
    for name, n in queries.most_common():
        lines.append(f"| `{name}` | {n / count:.2f} |")
    if delta["statements"]:
        lines += [
            "",
            "| statement (server's view) | calls per " + unit + " | rows |",
            "|---|---|---|",
        ]
        for text, calls, rows in delta["statements"][:25]:
            lines.append(
                f"| `{text.replace('|', '/')}` | {calls / count:.2f} | {rows / count:.2f} |"
            )
    return [*lines, "", note, ""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--admin", default="postgresql://postgres@127.0.0.1:5440/postgres")
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--steps", type=int, default=10)
    ns = parser.parse_args()
    admin = psycopg.connect(ns.admin, autocommit=True)
    admin.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
    admin.execute(f"CREATE DATABASE {DB}")
    url = ns.admin.rsplit("/", 1)[0] + "/" + DB
    with psycopg.connect(url, autocommit=True) as conn, contextlib.suppress(psycopg.Error):
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    server = Server(url)
    app = build(url)
    _ = app.store  # migrate now, outside the measured phases
    out = [
        f"`bench/scaling.py --runs {ns.runs} --steps {ns.steps}`, "
        f"PostgreSQL {server.conn.info.server_version}",
        "",
    ]
    indexes = server.indexes()

    server.reset()
    before = server.snapshot()
    with counted() as queries:
        t0 = time.perf_counter()
        for _ in range(ns.runs):
            app.start("ten_steps", ns.steps)
        start_s = time.perf_counter() - t0
    app.close()
    started = diff(before, server.snapshot())
    out += report("Starting runs", "run", ns.runs, started, queries, indexes)
    out.append(f"Start phase: {ns.runs / start_s:,.0f} starts/s from one client.\n")

    app = build(url)
    server.reset()
    before = server.snapshot()
    with counted() as queries:
        t0 = time.perf_counter()
        with app.worker():
            # One count a fifth of a second, so that waiting adds next to nothing.
            while server.unfinished() and time.perf_counter() - t0 < 900:
                time.sleep(0.2)
        run_s = time.perf_counter() - t0
    app.close()
    ran = diff(before, server.snapshot())
    steps = ns.runs * ns.steps
    out += report("Executing runs", "step", steps, ran, queries, indexes)
    out.append(
        f"Execute phase: {steps / run_s:,.0f} steps/s with one worker "
        "(on the same cores as the server; timing is not the point here).\n"
    )
    print("\n".join(out))


if __name__ == "__main__":
    main()
