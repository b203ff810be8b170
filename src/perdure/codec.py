"""JSON encoding of payloads, and decoding driven by type hints.

Values cross the store as JSON text. Dataclasses and pydantic models are
accepted on the way in and rebuilt on the way out when a type hint asks for
them; anything else that is not a JSON value is refused with
:class:`errors.InvalidPayload` rather than silently stringified.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import hashlib
import json
import re
import types
import typing
import uuid
import weakref
from datetime import date, datetime
from typing import Any

from perdure import errors


def _default(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return dump(mode="json")
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, set | frozenset | tuple):
        return list(value)
    raise TypeError(f"{type(value).__name__} is not a JSON value")


MAX_DEPTH = 256
"""How deeply a payload may nest arrays and objects.

Python's JSON encoder and decoder recurse once per level, so without a bound
a value could encode in one process and fail to decode in another whose
stack is deeper (a worker's). Well below the interpreter's recursion limit,
this bound makes every value that encodes decode everywhere.
"""

ENVELOPE = 4
"""How many levels perdure's own records may add around a payload.

A payload at the bound is accepted; the records that carry it (a run's
inputs, a signal in the journal) encode with ``envelope`` levels more, and
every reader accepts ``MAX_DEPTH + ENVELOPE``.
"""

_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"')
_BRACKETS = re.compile(r"[\[\]{}]")


def _depth(text: str) -> int:
    """Return how deeply JSON ``text`` nests (0 for a scalar)."""
    depth = deepest = 0
    for bracket in _BRACKETS.finditer(_STRINGS.sub("", text)):
        if bracket.group() in "[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def check_depth(text: str, limit: int = MAX_DEPTH) -> None:
    """Refuse JSON ``text`` that nests deeper than ``limit``.

    Raises:
        errors.InvalidPayload: it nests too deeply.
    """
    # Counting is cheap; only a text with that many brackets can be too deep.
    if text.count("[") + text.count("{") > limit and _depth(text) > limit:
        raise errors.InvalidPayload(f"the value nests more than {MAX_DEPTH} arrays or objects deep")


DEFAULT_PAYLOAD_LIMIT = 2 * 1024 * 1024
"""The largest payload an app stores, in bytes of its JSON text (2 MiB)."""


def check_size(text: str, limit: int, what: str) -> str:
    """Return ``text`` if it fits ``limit`` bytes (UTF-8), else refuse it.

    Raises:
        errors.PayloadTooLarge: it does not fit.
    """
    # A character is at most 4 bytes: short texts need no encoding to measure.
    if len(text) * 4 <= limit:
        return text
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > limit:
        raise errors.PayloadTooLarge(what, size, limit)
    return text


def check_text(what: str, value: Any, *, limit: int = 512) -> str:
    """Return ``value`` if both stores can hold it as a name or key, else refuse it.

    Both stores must agree: PostgreSQL refuses NUL characters in text and
    neither store can hold a string that is not valid Unicode (a lone
    surrogate), so such names are refused here, before anything is stored.

    Raises:
        errors.InvalidInput: not a string, empty, longer than ``limit``, with a
            NUL character, or not encodable as UTF-8.
    """
    if not isinstance(value, str):
        raise errors.InvalidInput(f"{what} must be a string, got {type(value).__name__}")
    if not value or len(value) > limit:
        raise errors.InvalidInput(f"{what} must be 1 to {limit} characters, got {len(value)}")
    if "\x00" in value:
        raise errors.InvalidInput(f"{what} {value!r} contains a NUL character")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise errors.InvalidInput(f"{what} {value!r} is not valid Unicode") from None
    return value


# One encoder for every call: json.dumps with options builds a new one each time.
_ENCODER = json.JSONEncoder(default=_default, separators=(",", ":"), allow_nan=False)


def encode(value: Any, *, envelope: int = 0) -> str:
    """Return ``value`` as compact JSON text.

    ``envelope`` is how many levels the caller's own record adds around the
    payloads it carries (at most :data:`ENVELOPE`).

    Raises:
        errors.InvalidPayload: the value is not JSON-encodable, or nests deeper
            than :data:`MAX_DEPTH`.
    """
    try:
        text = _ENCODER.encode(value)
    except RecursionError:
        raise errors.InvalidPayload(
            f"the value nests more than {MAX_DEPTH} arrays or objects deep"
        ) from None
    except (TypeError, ValueError) as exc:
        raise errors.InvalidPayload(f"cannot encode {type(value).__name__} as JSON: {exc}") from exc
    check_depth(text, MAX_DEPTH + min(envelope, ENVELOPE))
    return text


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def decode(text: str) -> Any:
    """Parse JSON text.

    Raises:
        errors.InvalidPayload: the text is not JSON, or nests deeper than
            :data:`MAX_DEPTH`.
    """
    if isinstance(text, str):
        check_depth(text, MAX_DEPTH + ENVELOPE)
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except RecursionError:
        raise errors.InvalidPayload(
            f"the value nests more than {MAX_DEPTH} arrays or objects deep"
        ) from None
    except (TypeError, ValueError) as exc:
        raise errors.InvalidPayload(f"not valid JSON: {exc}") from exc


def digest(text: str | None) -> str | None:
    """Return a short, stable digest of a payload's JSON text."""
    if text is None:
        return None
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


def convert(value: Any, hint: Any) -> Any:
    """Rebuild ``value`` (a decoded JSON value) as the type ``hint`` declares.

    Unknown or absent hints return the value unchanged.

    Raises:
        errors.InvalidPayload: the value does not fit the hint.
    """
    try:
        return _convert(value, hint)
    except errors.InvalidPayload:
        raise
    except (TypeError, ValueError, KeyError) as exc:
        raise errors.InvalidPayload(f"cannot read {value!r} as {_name(hint)}: {exc}") from exc


def _name(hint: Any) -> str:
    return getattr(hint, "__name__", None) or repr(hint)


# Types whose exact instances convert to themselves, as _convert_class would find.
_EXACT = (int, str, float, bool, list, dict)


def _convert(value: Any, hint: Any) -> Any:
    if value.__class__ is hint and hint in _EXACT:
        return value  # the common case: no hint to inspect
    if hint is None or hint is Any or hint is typing.Any or isinstance(hint, typing.TypeVar):
        return value
    if hint is type(None):
        return None
    origin = typing.get_origin(hint)
    targs = typing.get_args(hint)
    if origin is typing.Annotated:
        return _convert(value, targs[0])
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in targs:
            return None
        for option in targs:
            if option is type(None):
                continue
            try:
                return _convert(value, option)
            except (errors.InvalidPayload, TypeError, ValueError, KeyError):
                continue
        raise errors.InvalidPayload(f"{value!r} matches none of {_name(hint)}")
    if origin is typing.Literal:
        if value not in targs:
            raise errors.InvalidPayload(f"{value!r} is not one of {targs}")
        return value
    if origin in (list, set, frozenset, tuple) or origin is not None:
        return _convert_generic(value, origin, targs)
    if isinstance(hint, type):
        return _convert_class(value, hint)
    return value


def _convert_generic(value: Any, origin: Any, targs: tuple[Any, ...]) -> Any:
    if origin in (list, set, frozenset):
        if not isinstance(value, list):
            raise errors.InvalidPayload(f"expected a list, got {type(value).__name__}")
        inner = targs[0] if targs else Any
        items = [_convert(v, inner) for v in value]
        return origin(items) if origin is not list else items
    if origin is tuple:
        if not isinstance(value, list):
            raise errors.InvalidPayload(f"expected a list, got {type(value).__name__}")
        if len(targs) == 2 and targs[1] is Ellipsis:
            return tuple(_convert(v, targs[0]) for v in value)
        if targs and len(targs) != len(value):
            raise errors.InvalidPayload(f"expected {len(targs)} items, got {len(value)}")
        return tuple(
            _convert(v, t) for v, t in zip(value, targs or [Any] * len(value), strict=True)
        )
    if origin is dict or (isinstance(origin, type) and issubclass(origin, dict)):
        if not isinstance(value, dict):
            raise errors.InvalidPayload(f"expected an object, got {type(value).__name__}")
        vt = targs[1] if len(targs) == 2 else Any
        return {k: _convert(v, vt) for k, v in value.items()}
    return value


def _convert_class(value: Any, cls: type) -> Any:
    if dataclasses.is_dataclass(cls):
        if isinstance(value, cls):
            return value
        if not isinstance(value, dict):
            raise errors.InvalidPayload(f"expected an object for {cls.__name__}")
        hints = typing.get_type_hints(cls)
        kwargs = {
            f.name: _convert(value[f.name], hints.get(f.name))
            for f in dataclasses.fields(cls)
            if f.name in value and f.init
        }
        return cls(**kwargs)
    validate = getattr(cls, "model_validate", None)
    if callable(validate):
        return validate(value)
    if issubclass(cls, enum.Enum):
        return cls(value)
    if cls is datetime:
        return datetime.fromisoformat(value) if isinstance(value, str) else value
    if cls is date:
        return date.fromisoformat(value) if isinstance(value, str) else value
    if cls is uuid.UUID:
        return uuid.UUID(value) if isinstance(value, str) else value
    if cls is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if cls in (int, float, str, bool, list, dict) and not isinstance(value, cls):
        raise errors.InvalidPayload(f"expected {cls.__name__}, got {type(value).__name__}")
    return value


# Resolving hints is costly (string annotations are evaluated each time), and
# a step's hints are read at every call: keep them per function.
_HINTS: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()


def _hints(fn: Any) -> dict[str, Any]:
    try:
        return _HINTS[fn]
    except (KeyError, TypeError):
        pass
    try:
        hints = typing.get_type_hints(fn)
    except Exception:
        hints = {}
    with contextlib.suppress(TypeError):
        _HINTS[fn] = hints
    return hints


def return_hint(fn: Any) -> Any:
    """Return the declared return type of ``fn``, or None when it has none."""
    return _hints(fn).get("return")


def param_hints(fn: Any) -> dict[str, Any]:
    """Return the declared parameter types of ``fn`` (empty when unreadable)."""
    return {k: v for k, v in _hints(fn).items() if k != "return"}
