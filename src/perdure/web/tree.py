"""A run's descendants as the API's nested JSON, cut to a bounded size.

The tree is read by :meth:`perdure.reads.Reads.tree` (the same read as the
run page's "Child runs" section): the run's children a page at a time,
below each of them its first ``width`` children, ``depth`` levels deep in
all, and ``budget`` runs at most, filled level by level. Every node says how
many children it has (``total``); a node whose children are not all shown is
marked ``"truncated": true`` with ``more``, how many are left out, so a
client knows where to ask again (``GET /runs/{id}/tree`` on that node).
"""

from __future__ import annotations

from typing import Any

from perdure import errors, reads, records

DEPTH, DEPTH_MOST = 3, 10
WIDTH, WIDTH_MOST = 10, 100
LIMIT, LIMIT_MOST = 50, 200
BUDGET = 500
"""Runs in one answer at most, whatever the depth and width asked."""


def bounded(name: str, raw: str | None, default: int, most: int) -> int:
    """Return a query parameter as an integer from 1 to ``most``.

    Raises:
        errors.InvalidInput: not an integer, or out of range.
    """
    if raw is None or raw == "":
        return default
    try:
        found = int(raw)
    except ValueError:
        found = 0
    if not 1 <= found <= most:
        raise errors.InvalidInput(f"{name!r} must be an integer from 1 to {most}, got {raw[:20]!r}")
    return found


def _node(node: reads.ChildNode) -> dict[str, Any]:
    return {
        "run_id": node.run.run_id,
        "workflow": node.run.workflow,
        "state": node.run.state,
        "total": node.total,
        "truncated": node.more > 0,
        "more": node.more,
        "children": [_node(c) for c in node.children],
    }


def document(
    run: records.RunInfo, tree: reads.ChildTree, *, depth: int, width: int, limit: int
) -> dict[str, Any]:
    """Return the run and its descendants as one nested JSON object.

    The run's own children are one page (``limit``); ``next_cursor`` names
    the next one. On the first page ``more`` counts the children after it;
    on a later one it is None (unknown without counting from the start).
    """
    more: int | None = 0
    if tree.next_cursor is not None:
        more = None if tree.paged else tree.more
    return {
        "run_id": run.run_id,
        "workflow": run.workflow,
        "state": run.state,
        "total": tree.total,
        "counts": tree.counts,
        "truncated": tree.next_cursor is not None,
        "more": more,
        "next_cursor": tree.next_cursor,
        "children": [_node(n) for n in tree.nodes],
        "limits": {"depth": depth, "width": width, "limit": limit, "budget": BUDGET},
    }
