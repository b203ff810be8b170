"""The outcome of a durable call in an ``async`` workflow, to be awaited.

In an ``async def`` workflow, ``ctx.wait``, ``ctx.sleep`` and a child
handle's ``result`` are awaited: ``payload = await ctx.wait("approval")``.
The call does its work at once, as in a sync workflow (it journals, or parks
the run, or raises), and returns a :class:`Ready` that gives the outcome to
``await`` without suspending anything: a run that must wait does not hold an
event loop task, it parks and is replayed later. So a call that is not
awaited has still happened, and a durable call is never lost to a missing
``await``; but its value is only reached through ``await``. Using the
:class:`Ready` itself as the value (an attribute, an item, its truth) raises
:class:`perdure.InvalidInput` saying so, rather than computing with the
wrong object.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any, Generic, NoReturn, TypeVar

from perdure import errors

T = TypeVar("T")


class Ready(Generic[T]):
    """A durable call's outcome, already known: ``await`` it to get the value."""

    __slots__ = ("_value",)

    def __init__(self, value: T) -> None:
        self._value = value

    def __await__(self) -> Generator[Any, None, T]:
        return self._value
        yield  # a generator that never suspends: the value is there already

    def __repr__(self) -> str:
        return "<perdure.Ready: await it for the outcome>"

    def _misused(self, *_: object) -> NoReturn:
        raise errors.InvalidInput(
            "in an async workflow, await this call (for example "
            "`payload = await ctx.wait(name)`): its result is not the value itself"
        )

    def __getattr__(self, name: str) -> NoReturn:
        if name.startswith("__"):
            raise AttributeError(name)
        self._misused()

    __getitem__ = _misused
    __iter__ = _misused
    __len__ = _misused
    __contains__ = _misused
    __bool__ = _misused
