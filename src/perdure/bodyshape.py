"""The shape checks every journal body's decoder shares, and the error they raise.

A decoder (in :mod:`perdure.journal`, :mod:`perdure.attempts`) reads a body's
JSON through these readers, so that a body of another shape is refused with
:class:`Unreadable` whichever kind it belongs to.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from perdure import codec


class Unreadable(ValueError):
    """A journal body that is not of the shape its kind is written in."""


def read_object(text: str | None) -> dict[str, Any]:
    """Return the JSON object ``text`` holds."""
    data = codec.decode(text or "null")
    if not isinstance(data, dict):
        raise Unreadable(f"expected an object, found {type(data).__name__}")
    return data


def field(data: dict[str, Any], name: str) -> Any:
    """Return the field ``name`` of a body that must have it."""
    try:
        return data[name]
    except KeyError:
        raise Unreadable(f"no {name!r}") from None


def text(value: Any, name: str) -> str:
    """Return ``value``, which must be text (``name`` says which field it is)."""
    if not isinstance(value, str):
        raise Unreadable(f"{name!r} is not text")
    return value


def optional_text(value: Any, name: str) -> str | None:
    """Return ``value``: text, or None."""
    return None if value is None else text(value, name)


def instant(value: Any) -> datetime:
    """Read a journaled instant: ISO 8601 text with a time zone."""
    try:
        when = datetime.fromisoformat(text(value, "instant"))
    except ValueError as exc:
        raise Unreadable(str(exc)) from exc
    if when.tzinfo is None:
        raise Unreadable(f"{value!r} has no time zone")
    return when


def optional_instant(value: Any) -> datetime | None:
    """Return ``value`` read as an instant, or None."""
    return None if value is None else instant(value)
