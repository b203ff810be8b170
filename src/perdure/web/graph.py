"""A plan run's tasks laid out as a graph, for the run page's inline SVG.

Tasks stand in columns by depth: a root is at depth 0, any other task one
column right of its deepest parent (the longest path from a root), so every
edge points right. Within a column, tasks are ordered by the mean height of
their parents (then by declaration order), which keeps most edges short and
uncrossed without a layout library. The layout is computed here, on the
server, from the tasks alone (their ``parents``): the console needs no code
of the plan and the page no script.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from perdure import records

BOX_WIDTH, BOX_HEIGHT = 168, 46
COLUMN_GAP, ROW_GAP = 56, 14
MARGIN = 8
LABEL_CHARS = 22
"""Task names longer than this are cut in the box (the full name is its tooltip)."""


@dataclass(frozen=True)
class Node:
    """A task's box: its top-left corner, and what it says."""

    name: str
    label: str
    note: str
    state: str
    attempt: int
    effect: str
    blocked_by: str | None
    depth: int
    x: int
    y: int


@dataclass(frozen=True)
class Edge:
    """A line from a parent's box to a child's, as an SVG path; ``state`` is the parent's."""

    parent: str
    child: str
    state: str
    path: str


@dataclass(frozen=True)
class Graph:
    """The laid-out tasks and edges, and the size of the drawing."""

    nodes: tuple[Node, ...]
    edges: tuple[Edge, ...]
    width: int
    height: int
    box_width: int = BOX_WIDTH
    box_height: int = BOX_HEIGHT


def depths(tasks: Sequence[records.TaskInfo]) -> dict[str, int]:
    """Return each task's depth: the length of the longest path to it from a root.

    Parents that are not among ``tasks`` are ignored; a cycle (which a plan
    cannot declare, so only damaged rows could hold one) is cut where it closes.
    """
    parents = {t.name: [p for p in t.parents if p != t.name] for t in tasks}
    found: dict[str, int] = {}
    for task in tasks:
        # Depth-first without recursion, so a long chain cannot exhaust the stack.
        stack: list[tuple[str, bool]] = [(task.name, False)]
        on_path: set[str] = set()
        while stack:
            name, ready = stack.pop()
            if name in found:
                continue
            known = [p for p in parents[name] if p in parents]
            if ready:
                on_path.discard(name)
                found[name] = 1 + max((found.get(p, -1) for p in known), default=-1)
                continue
            on_path.add(name)
            stack.append((name, True))
            stack.extend((p, False) for p in known if p not in found and p not in on_path)
    return found


def _cut(text: str, limit: int = LABEL_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _note(task: records.TaskInfo) -> str:
    """Return the box's second line: the state, and what explains it."""
    if task.state == "blocked" and task.blocked_by:
        return _cut(f"blocked by {task.blocked_by}", LABEL_CHARS + 4)
    if task.state in ("failed", "needs_attention", "running") and task.attempt > 1:
        return f"{task.state} · attempt {task.attempt}"
    return task.state


def layout(tasks: Sequence[records.TaskInfo]) -> Graph:
    """Lay the tasks out in columns by depth, edges from each parent to its children."""
    depth = depths(tasks)
    position = {t.name: i for i, t in enumerate(tasks)}
    columns: dict[int, list[records.TaskInfo]] = {}
    for task in tasks:
        columns.setdefault(depth[task.name], []).append(task)
    tallest = max((len(c) for c in columns.values()), default=0)
    height = 2 * MARGIN + tallest * BOX_HEIGHT + max(tallest - 1, 0) * ROW_GAP
    centre: dict[str, float] = {}
    nodes: dict[str, Node] = {}
    for level in sorted(columns):
        column = columns[level]
        if level > 0:

            def pull(task: records.TaskInfo) -> tuple[float, int]:
                seen = [centre[p] for p in task.parents if p in centre]
                return (sum(seen) / len(seen) if seen else 0.0), position[task.name]

            column = sorted(column, key=pull)
        used = len(column) * BOX_HEIGHT + (len(column) - 1) * ROW_GAP
        top = MARGIN + (height - 2 * MARGIN - used) // 2
        x = MARGIN + level * (BOX_WIDTH + COLUMN_GAP)
        for row, task in enumerate(column):
            y = top + row * (BOX_HEIGHT + ROW_GAP)
            centre[task.name] = y + BOX_HEIGHT / 2
            nodes[task.name] = Node(
                name=task.name,
                label=_cut(task.name),
                note=_note(task),
                state=task.state,
                attempt=task.attempt,
                effect=task.effect,
                blocked_by=task.blocked_by,
                depth=level,
                x=x,
                y=y,
            )
    edges: list[Edge] = []
    for task in tasks:
        child = nodes[task.name]
        for parent_name in task.parents:
            parent = nodes.get(parent_name)
            if parent is None or parent_name == task.name:
                continue
            x1, y1 = parent.x + BOX_WIDTH, parent.y + BOX_HEIGHT // 2
            x2, y2 = child.x, child.y + BOX_HEIGHT // 2
            bend = (x1 + x2) // 2
            path = f"M{x1},{y1} C{bend},{y1} {bend},{y2} {x2 - 4},{y2}"
            edges.append(Edge(parent_name, task.name, parent.state, path))
    width = 2 * MARGIN + (max(columns, default=-1) + 1) * (BOX_WIDTH + COLUMN_GAP) - COLUMN_GAP
    return Graph(
        nodes=tuple(nodes[t.name] for t in tasks),
        edges=tuple(edges),
        width=max(width, 0),
        height=height,
    )
