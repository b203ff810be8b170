"""Every row of a store's database as text, read directly (not through the store)."""

from __future__ import annotations

import sqlite3


def dump(url: str) -> str:
    """Return every row of every table of the store at ``url``, one per line."""
    found: list[str] = []
    if url.startswith("sqlite:///"):
        with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
            tables = conn.execute("select name from sqlite_master where type = 'table'")
            for (table,) in tables.fetchall():
                found += [repr(row) for row in conn.execute(f'select * from "{table}"')]
        return "\n".join(found)
    import psycopg

    with psycopg.connect(url) as conn:
        tables = conn.execute(
            "select table_schema, table_name from information_schema.tables "
            "where table_schema not in ('pg_catalog', 'information_schema')"
        ).fetchall()
        for schema, table in tables:
            query = f'select t::text from "{schema}"."{table}" t'
            found += [row[0] for row in conn.execute(query)]  # type: ignore[arg-type]
    return "\n".join(found)
