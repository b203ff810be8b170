"""Load an adapter's named queries and migrations from its ``<adapter>/sql/`` folder.

A query file holds blocks that start with ``-- name: <query_name>``; the text
up to the next such line is the query. Migrations are ``migrations/NNNN_*.sql``
files applied in order; ``schema.sql`` is what they produce.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources

_NAME = re.compile(r"^--\s*name:\s*([a-z_][a-z0-9_]*)\s*$", re.MULTILINE)
_MIGRATION = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")


@dataclass(frozen=True)
class Migration:
    """One ordered schema change."""

    version: int
    name: str
    sql: str


def _folder(adapter: str) -> resources.abc.Traversable:
    return resources.files(f"perdure.store.{adapter}").joinpath("sql")


def queries(adapter: str) -> dict[str, str]:
    """Return the adapter's named queries from ``queries.sql``, as they are sent.

    Each is sent compact: its comment lines, blank lines and indentation left
    out, under one line that names it (``-- perdure: <name>``, for the
    server's logs and statistics). The comments document the queries in the
    file; sent along, they made the biggest ones longer than psycopg caches
    the parsing of (:data:`CACHED_LENGTH`), and every call parsed them again.
    """
    text = _folder(adapter).joinpath("queries.sql").read_text(encoding="utf-8")
    parts = _NAME.split(text)
    found: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in found:
            raise ValueError(f"query {name!r} is defined twice in {adapter}/sql/queries.sql")
        found[name] = f"-- perdure: {name}\n{_compact(body)}"
    return found


CACHED_LENGTH = 4096
"""The longest query text (bytes) whose placeholders psycopg parses once and caches."""


def _compact(body: str) -> str:
    """``body`` without its comment lines, blank lines, indentation and final semicolon.

    Only whole comment lines are left out: no query here has a comment after
    code on a line, or a string literal that spans lines.
    """
    lines = (line.strip() for line in body.splitlines())
    return "\n".join(ln for ln in lines if ln and not ln.startswith("--")).rstrip(";").strip()


def schema(adapter: str) -> str:
    """Return the adapter's reference schema (what the migrations produce)."""
    return _folder(adapter).joinpath("schema.sql").read_text(encoding="utf-8")


def migrations(adapter: str) -> list[Migration]:
    """Return the adapter's migrations ordered by version."""
    found: list[Migration] = []
    for entry in _folder(adapter).joinpath("migrations").iterdir():
        match = _MIGRATION.match(entry.name)
        if match:
            found.append(Migration(int(match.group(1)), entry.name, entry.read_text("utf-8")))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    # Numbers are reserved ahead for work in progress, so a gap is allowed;
    # a repeat is not.
    if len(set(versions)) != len(versions) or (versions and versions[0] < 1):
        raise ValueError(f"migrations of {adapter} are not numbered 1, 2, ...: {versions}")
    return found
