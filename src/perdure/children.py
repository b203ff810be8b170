"""Child runs as workflow code starts them: ``ctx.start_child``, ``ctx.map`` and their handles.

:class:`Children` is a part of :class:`perdure.Context` (a base class of
it). A child's creation takes one journal position (a ``child`` entry naming
its run id), and waiting for its result another (``child_result``), so a
replayed parent neither creates a child twice nor waits again for one whose
end it recorded.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from perdure import codec, errors, journal, replay, runtime


@dataclass
class ChildHandle:
    """A child run started by a workflow."""

    run_id: str
    _ctx: Children
    _hint: Any = None

    def result(self) -> Any:
        """Pause the parent until the child ends; return its result.

        In an async workflow, ``value = await handle.result()``.

        Raises:
            errors.ChildFailed: the child failed or was canceled.
        """
        return self._ctx._give(self._ctx._child_result(self.run_id, self._hint))


def _item_arguments(item: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Return the arguments one ``ctx.map`` item stands for (see :meth:`Children.map`)."""
    if isinstance(item, tuple):
        return item, {}
    if isinstance(item, dict):
        if not all(isinstance(name, str) for name in item):
            raise errors.InvalidInput("a ctx.map item that is a dict needs parameter names as keys")
        return (), dict(item)
    return (item,), {}


class Children(abc.ABC):
    """The child-run calls of a Context."""

    # What the Context supplies.
    run_id: str
    _runtime: runtime.Runtime
    _cursor: replay.JournalCursor

    @abc.abstractmethod
    def _next(self, call: replay.Call) -> journal.Entry | None:
        """Take the next journal position for ``call``; return what it recorded, if anything."""

    @abc.abstractmethod
    def _read(self, entry: journal.Entry, reader: Callable[[str | None], Any]) -> Any:
        """Read a recorded entry's body."""

    @abc.abstractmethod
    def _record(self, kind: str, name: str, text: str) -> None:
        """Buffer an ``ok`` entry at this position."""

    @abc.abstractmethod
    def _opened(self, value: Any) -> Any:
        """Return the payload a recorded value holds."""

    @abc.abstractmethod
    def _hold(self, waits: list[journal.WaitSpec], wake_at: datetime | None) -> None:
        """Park; return only if the run may look at its wait again, in place."""

    @abc.abstractmethod
    def _give(self, value: Any) -> Any:
        """Return ``value`` as this workflow takes it: itself, or a Ready to await."""

    def _child_id(self, entry: journal.Entry) -> str:
        started: journal.ChildStarted = self._read(entry, journal.ChildStarted.decode)
        return started.run_id

    def start_child(
        self, workflow: Any, *args: Any, key: str | None = None, **kwargs: Any
    ) -> ChildHandle:
        """Start a child run once (per journal position, or per ``key``) and return its handle.

        The arguments are checked against the child's signature here, as
        ``app.start`` checks them. Give the key as ``workflow.keyed(key)``
        when the child has a parameter named ``key``.
        """
        name, version, hint = self._runtime.workflow_ref(workflow)
        entry = self._next(replay.Call("child", name))
        if entry is not None:
            return ChildHandle(self._child_id(entry), self, hint)
        key, kwargs = self._runtime.child_call(workflow, key, args, kwargs)
        if key is not None:
            codec.check_text("a child key", key)
        # A caller's key is scoped to this parent, so two parents never share a child.
        child_key = f"{self.run_id}/{key or self._cursor.position}"
        text = self._runtime.payloads.seal(
            {"args": list(args), "kwargs": kwargs}, f"the input of child {name}", envelope=2
        )
        [run_id] = self._runtime.create_children([runtime.NewChild(name, version, text, child_key)])
        self._record("child", name, journal.ChildStarted(run_id).encode())
        return ChildHandle(run_id, self, hint)

    def map(self, workflow: Any, items: Any) -> list[ChildHandle]:
        """Start one child run per item in a single store call.

        An item that is a tuple is the child's positional arguments
        (``workflow(*item)``), a dict its keyword arguments
        (``workflow(**item)``), anything else its one argument
        (``workflow(item)``); to pass one tuple or dict as the only argument,
        wrap it: ``(value,)``. Every item is checked against the child's
        signature before any child is created. Each child takes one journal
        position, so a replayed fan-out creates nothing twice. Collect
        results with ``[h.result() for h in handles]``: the parent pauses on
        the first child still running.
        """
        name, version, hint = self._runtime.workflow_ref(workflow)
        run_ids: list[str] = []
        fresh: list[tuple[int, int, runtime.NewChild]] = []  # (index, position, child)
        for item in list(items):
            entry = self._next(replay.Call("child", name))
            if entry is not None:
                run_ids.append(self._child_id(entry))
                continue
            position = self._cursor.position
            args, kwargs = _item_arguments(item)
            _, kwargs = self._runtime.child_call(workflow, None, args, kwargs)
            text = self._runtime.payloads.seal(
                {"args": list(args), "kwargs": kwargs}, f"the input of child {name}", envelope=2
            )
            child = runtime.NewChild(name, version, text, f"{self.run_id}/{position}")
            fresh.append((len(run_ids), position, child))
            run_ids.append(child.key)
        if fresh:
            created = self._runtime.create_children([child for _, _, child in fresh])
            for (index, position, _), run_id in zip(fresh, created, strict=True):
                run_ids[index] = run_id
                body = journal.ChildStarted(run_id).encode()
                self._runtime.buffer(journal.Entry(position, "child", name, "ok", body))
        return [ChildHandle(run_id, self, hint) for run_id in run_ids]

    def _child_result(self, child_id: str, hint: Any) -> Any:
        entry = self._next(replay.Call("child_result", child_id))
        if entry is None:
            while (outcome := self._runtime.outcome(f"child:{child_id}")) is None:
                self._hold([journal.WaitSpec(f"child:{child_id}", "child")], None)
            entry, mark = journal.child_result(self._cursor.position, child_id, outcome)
            self._runtime.buffer(entry, mark)
        if entry.status == "ok":
            return codec.convert(self._opened(journal.Value.decode(entry.output).value), hint)
        ended = journal.ChildEnded.decode(entry.error or "{}")
        raise errors.ChildFailed(child_id, str(ended.state), ended.child_error)
