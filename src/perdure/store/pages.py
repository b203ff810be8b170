"""The paging section of the store port: an app's runs page by page, runs by key, children.

A page is read by keyset, not by offset: each page starts strictly after the
last run of the previous one in the listing order (newest first: ``created_at``
then ``run_id``, both descending), so a page costs the same at any depth and a
run created meanwhile never shifts the pages already handed out. A time
window (``created_after``, ``created_before``) bounds the same index walk, so
it costs no more than the page itself.

A run's children are paged the same way, oldest first (the order they were
started in), on an index of ``(parent_id, created_at, run_id)``: a run with
ten thousand children shows its first page as fast as one with ten.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Protocol, runtime_checkable

from perdure.store import port


@dataclass(frozen=True)
class After:
    """Where a page starts: strictly after this run in the listing order."""

    created_at: datetime
    run_id: str


@runtime_checkable
class PagedStore(Protocol):
    """The store's paged reads."""

    def page_runs(
        self,
        app: str,
        *,
        state: str | None = None,
        workflow: str | None = None,
        after: After | None = None,
        limit: int = 50,
        created_after: datetime | None = None,
        created_before: datetime | None = None,
        queue: str | None = None,
    ) -> list[port.Run]:
        """Return up to ``limit`` of the app's runs, newest first, strictly after ``after``.

        ``created_after`` and ``created_before`` (aware instants) keep only
        runs created strictly after, and strictly before, them; ``queue``
        only runs started in that queue.

        Raises:
            errors.InvalidInput: a naive instant.
        """
        ...

    def page_children(
        self, run_id: str, *, after: After | None = None, limit: int = 50
    ) -> list[port.Run]:
        """Return up to ``limit`` of the run's children, oldest first, strictly after ``after``.

        Children only, not grandchildren; an unknown run has none.
        """
        ...

    def run_by_key(self, app: str, key: str) -> port.Run | None:
        """Return the app's run started under ``key``, or None."""
        ...
