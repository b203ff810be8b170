"""Reads for the console and the HTTP API: pages of runs, lookups, decoded journals.

Kept apart from the client's core calls: paging needs a store with the
paged-read port section (:mod:`perdure.store.pages`), which every SQL adapter
has. Every read here is bounded (a page, a tree cut at a depth and a number
of runs, the latest items of a stream), so a run with ten thousand children
or stream items is shown as fast as a small one.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from perdure import client as client_api
from perdure import codec, errors, payloads, records
from perdure.store import liveport, pages, port

_RELATIVE = re.compile(r"^(\d{1,9})([smhdw])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def parse_instant(name: str, text: str, now: datetime) -> datetime:
    """Read an instant given as ISO-8601 or as a time ago (``90m``, ``12h``, ``7d``, ``2w``).

    A relative form counts back from ``now`` (the store's clock). An ISO-8601
    instant without an offset, or a bare date, is taken as UTC.

    Raises:
        errors.InvalidInput: neither form, naming ``name``.
    """
    text = text.strip()
    relative = _RELATIVE.match(text)
    if relative:
        try:
            return now - timedelta(**{_UNITS[relative.group(2)]: int(relative.group(1))})
        except OverflowError:
            raise errors.InvalidInput(f"{name} {text!r} reaches before year 1") from None
    try:
        when = datetime.fromisoformat(text) if 0 < len(text) <= 40 else None
    except ValueError:
        when = None
    if when is None:
        raise errors.InvalidInput(
            f"{name} must be an ISO-8601 instant (2026-11-30T09:00:00Z) or a time ago "
            f"(90m, 12h, 7d, 2w), got {text[:40]!r}"
        )
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when


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


def _decoded(run_id: str, text: str | None, invariant: str = "journal_output") -> Any:
    if text is None:
        return None
    try:
        return codec.decode(text)
    except errors.InvalidPayload as exc:
        raise errors.CorruptState(run_id, invariant, str(exc)) from exc


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
        created_after: str | None = None,
        created_before: str | None = None,
        queue: str | None = None,
    ) -> records.RunPage:
        """Return one page of the app's runs, newest first, after ``cursor``.

        ``created_after`` and ``created_before`` keep runs created strictly
        after and before an instant, each ISO-8601 or a time ago (see
        :func:`parse_instant`).
        """
        since = until = None
        if created_after or created_before:
            # The store's clock is read only for a window: on PostgreSQL it is a round trip.
            now = self.client.store.now()
            if created_after:
                since = parse_instant("created_after", created_after, now)
            if created_before:
                until = parse_instant("created_before", created_before, now)
        if state is not None and state not in port.RUN_STATES:
            raise errors.InvalidInput(
                f"unknown state {state!r}; one of {', '.join(port.RUN_STATES)}"
            )
        if not 1 <= limit <= 500:
            raise errors.InvalidInput(f"limit must be 1 to 500, got {limit}")
        after = decode_cursor(cursor) if cursor else None
        # One more than asked tells whether a next page exists.
        found = self._paged.page_runs(
            self.client.app,
            state=state,
            workflow=workflow,
            after=after,
            limit=limit + 1,
            created_after=since,
            created_before=until,
            queue=queue,
        )
        more = len(found) > limit
        shown = found[:limit]
        return records.RunPage(
            [client_api.run_info(r, self.client.payloads.reveal) for r in shown],
            encode_cursor(shown[-1]) if more else None,
        )

    def find(self, text: str) -> records.RunInfo | None:
        """Return the app's run whose id or key is ``text``, or None."""
        text = text.strip()
        if not text:
            return None
        run = self.client.store.get_run(text)
        if run is None or run.app != self.client.app:
            run = self._paged.run_by_key(self.client.app, text)
        return None if run is None else client_api.run_info(run, self.client.payloads.reveal)

    def inputs(self, run_id: str) -> dict[str, Any]:
        """Return the run's inputs: ``{"args": [...], "kwargs": {...}}``."""
        run = self.client.record(run_id)
        found = client_api.decode_column(run_id, "input", run.input)
        if not isinstance(found, dict):
            raise errors.CorruptState(run_id, "run_input", "input is not an object")
        # Sealed inputs are opened when the client has the codec, else shown as stored.
        opened = self.client.payloads.reveal(found)
        if isinstance(opened, dict) and not payloads.sealed(opened):
            found = opened
        else:
            return {k: v for k, v in found.items() if k != "trace"}
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
                self.client.payloads.reveal(_decoded(run_id, e.output)),
                _decoded(run_id, e.error),
                e.attempt,
            )
            for e in self.client.store.journal(run_id)
        ]

    # -- a run's descendants --------------------------------------------------

    def tree(
        self,
        run_id: str,
        cursor: str | None = None,
        *,
        page: int = 50,
        width: int = 10,
        depth: int = 3,
        budget: int = 200,
    ) -> ChildTree:
        """Return the run's descendants as a tree cut to a bounded size.

        The run's children come ``page`` at a time (oldest first, after
        ``cursor``); below them, each run shows its first ``width`` children,
        down to ``depth`` levels, and no more than ``budget`` runs in all
        (filled level by level). A run whose children are not all shown says
        how many it has (:attr:`ChildNode.more`).
        """
        self.client.record(run_id)
        counts = self.client.store.child_counts(run_id)
        after = decode_cursor(cursor) if cursor else None
        found = self._paged.page_children(run_id, after=after, limit=page + 1)
        shown = found[:page]
        nodes = [ChildNode(client_api.run_info(r, self.client.payloads.reveal)) for r in shown]
        left = budget - len(nodes)
        level, below = nodes, 1
        while level:
            deeper: list[ChildNode] = []
            for node in level:
                take = min(width, left) if below < depth else 0
                if take > 0:
                    kids = self._paged.page_children(node.run.run_id, limit=take + 1)
                    node.children = [
                        ChildNode(client_api.run_info(r, self.client.payloads.reveal))
                        for r in kids[:take]
                    ]
                    left -= len(node.children)
                    deeper += node.children
                    if len(kids) <= take:
                        node.total = len(node.children)
                        continue
                # Counted on runs_parent: an index-only count, however many children.
                node.total = sum(self.client.store.child_counts(node.run.run_id).values())
            level, below = deeper, below + 1
        return ChildTree(
            counts={s: n for s, n in sorted(counts.items()) if n},
            total=sum(counts.values()),
            nodes=nodes,
            next_cursor=encode_cursor(shown[-1]) if len(found) > page else None,
            paged=cursor is not None,
        )

    # -- what a live run shows outside -------------------------------------------

    def live(
        self, run_id: str, *, items: int = 20, streams: int = 20, keys: int = 100, updates: int = 50
    ) -> LiveParts:
        """Return the run's events, the latest ``items`` of its streams and its latest updates.

        Events and streams are read from the durable journal (as queries are);
        updates from the store, pending ones included. Each part is cut to
        its bound, and says how much it left out.
        """
        view = self.client.view(run_id)
        tails = [
            StreamTail(
                key,
                list(enumerate(values, 1))[-items:],
                len(values),
                key in view.closed_streams,
            )
            for key, values in list(view.streams.items())[:streams]
        ]
        # A store without the live section has no updates to show.
        lister = getattr(self.client.store, "list_updates", None)
        listed: list[liveport.UpdateRecord] = (
            [] if lister is None else lister(run_id, limit=updates + 1)
        )
        reveal = self.client.payloads.reveal
        shown = [
            UpdateItem(
                u.update_id,
                u.name,
                u.sequence,
                u.state,
                reveal(_decoded(run_id, u.payload, "update_payload")),
                reveal(_decoded(run_id, u.response, "update_response")),
                u.at,
                u.settled_at,
            )
            for u in listed[:updates]
        ]
        events = list(view.events.items())
        return LiveParts(
            events=dict(events[:keys]),
            more_events=max(0, len(events) - keys),
            streams=tails,
            more_streams=max(0, len(view.streams) - streams),
            updates=shown,
            more_updates=len(listed) > updates,
        )

    def stream(self, run_id: str, key: str, after: int = 0, limit: int = 100) -> StreamSlice:
        """Return up to ``limit`` items of the run's stream ``key`` after the first ``after``.

        Reads what is written now and returns; it does not wait for more
        (:meth:`perdure.client.Client.read_stream` follows a stream). A key
        the run has not written is an empty stream.
        """
        codec.check_text("a stream key", key)
        if after < 0:
            raise errors.InvalidInput(f"after must be at least 0, got {after}")
        if not 1 <= limit <= 1000:
            raise errors.InvalidInput(f"limit must be 1 to 1000, got {limit}")
        view = self.client.view(run_id)
        values = view.streams.get(key, [])
        picked = values[after : after + limit]
        return StreamSlice(
            key=key,
            items=picked,
            after=after,
            next_after=after + len(picked),
            total=len(values),
            closed=key in view.closed_streams,
            run_ended=view.done,
        )


@dataclass
class ChildNode:
    """A descendant in a run's tree: ``total`` children, the first of them in ``children``."""

    run: records.RunInfo
    children: list[ChildNode] = field(default_factory=list)
    total: int = 0

    @property
    def more(self) -> int:
        """How many of its children are not shown."""
        return self.total - len(self.children)


@dataclass(frozen=True)
class ChildTree:
    """A run's descendants, bounded: one page of its children and a few levels below."""

    counts: dict[str, int]
    total: int
    nodes: list[ChildNode]
    next_cursor: str | None
    paged: bool

    @property
    def more(self) -> int:
        """How many of the run's children come after this page (exact on the first page)."""
        return self.total - len(self.nodes) if not self.paged else 0


@dataclass(frozen=True)
class StreamTail:
    """The latest items of one stream: ``items`` pairs each with its number (from 1)."""

    key: str
    items: list[tuple[int, Any]]
    total: int
    closed: bool


@dataclass(frozen=True)
class StreamSlice:
    """Items of a stream from an offset: read on from ``next_after``."""

    key: str
    items: list[Any]
    after: int
    next_after: int
    total: int
    closed: bool
    run_ended: bool


@dataclass(frozen=True)
class UpdateItem:
    """An update sent to a run: ``pending``, ``answered`` (with ``response``) or ``abandoned``."""

    update_id: str
    name: str
    sequence: int
    state: str
    payload: Any
    response: Any
    at: datetime
    settled_at: datetime | None


@dataclass(frozen=True)
class LiveParts:
    """What a run shows the outside: events, the tails of its streams, its updates."""

    events: dict[str, Any]
    more_events: int
    streams: list[StreamTail]
    more_streams: int
    updates: list[UpdateItem]
    more_updates: bool

    @property
    def any(self) -> bool:
        return bool(self.events or self.streams or self.updates)
