"""Reads for the console and the HTTP API: pages of runs, lookups, decoded journals.

Kept apart from the client's core calls: paging needs a store with the
paged-read port section (:mod:`perdure.store.pages`), which every SQL adapter
has.
"""

from __future__ import annotations

import base64
from datetime import datetime
from typing import Any

from perdure import client as client_api
from perdure import codec, errors, records
from perdure.store import pages, port


def encode_cursor(run: port.Run) -> str:
    """Return the opaque cursor of the page that starts after ``run``."""
    raw = f"{run.created_at.isoformat()}|{run.run_id}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> pages.After:
    """Read a cursor made by :func:`encode_cursor`.

    Raises:
        errors.InvalidInput: it is not such a cursor.
    """
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        at, _, run_id = raw.partition("|")
        when = datetime.fromisoformat(at)
    except ValueError:
        raise errors.InvalidInput(
            f"cursor {cursor[:40]!r} is not a cursor of this listing"
        ) from None
    if not run_id or when.tzinfo is None:
        raise errors.InvalidInput(f"cursor {cursor[:40]!r} is not a cursor of this listing")
    return pages.After(when, run_id)


def _decoded(run_id: str, text: str | None) -> Any:
    if text is None:
        return None
    try:
        return codec.decode(text)
    except errors.InvalidPayload as exc:
        raise errors.CorruptState(run_id, "journal_output", str(exc)) from exc


class Reads:
    """The paged and detailed reads of one app's runs, through a client."""

    def __init__(self, client: client_api.Client) -> None:
        self.client = client
        store = client.store
        if not isinstance(store, pages.PagedStore):
            raise errors.StoreError(f"the store {type(store).__name__} cannot list runs by page")
        self._paged = store

    def page(
        self,
        state: str | None = None,
        workflow: str | None = None,
        cursor: str | None = None,
        limit: int = 50,
    ) -> records.RunPage:
        """Return one page of the app's runs, newest first, after ``cursor``."""
        if state is not None and state not in port.RUN_STATES:
            raise errors.InvalidInput(
                f"unknown state {state!r}; one of {', '.join(port.RUN_STATES)}"
            )
        if not 1 <= limit <= 500:
            raise errors.InvalidInput(f"limit must be 1 to 500, got {limit}")
        after = decode_cursor(cursor) if cursor else None
        # One more than asked tells whether a next page exists.
        found = self._paged.page_runs(
            self.client.app, state=state, workflow=workflow, after=after, limit=limit + 1
        )
        more = len(found) > limit
        shown = found[:limit]
        return records.RunPage(
            [client_api.run_info(r) for r in shown], encode_cursor(shown[-1]) if more else None
        )

    def find(self, text: str) -> records.RunInfo | None:
        """Return the app's run whose id or key is ``text``, or None."""
        text = text.strip()
        if not text:
            return None
        run = self.client.store.get_run(text)
        if run is None or run.app != self.client.app:
            run = self._paged.run_by_key(self.client.app, text)
        return None if run is None else client_api.run_info(run)

    def inputs(self, run_id: str) -> dict[str, Any]:
        """Return the run's inputs: ``{"args": [...], "kwargs": {...}}``."""
        run = self.client.record(run_id)
        found = client_api.decode_column(run_id, "input", run.input)
        if not isinstance(found, dict):
            raise errors.CorruptState(run_id, "run_input", "input is not an object")
        # The record may also carry the caller's trace context: not an input.
        return {k: v for k, v in found.items() if k in ("args", "kwargs")}

    def journal(self, run_id: str) -> list[records.JournalItem]:
        """Return the run's journal, oldest first, its values decoded."""
        self.client.record(run_id)
        return [
            records.JournalItem(
                e.position,
                e.kind,
                e.name,
                e.status,
                _decoded(run_id, e.output),
                _decoded(run_id, e.error),
                e.attempt,
            )
            for e in self.client.store.journal(run_id)
        ]
