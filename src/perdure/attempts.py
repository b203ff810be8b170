"""A step's failed attempts, and the journal bodies of a ``step`` entry that keep them.

These are the bodies of the ``step`` rows in the table of :mod:`perdure.journal`,
which names them too. ``Attempts``, ``StepError`` and ``AttemptFailed`` each
carry ``attempts``: the step's failed attempts so far, oldest first, each a
:class:`FailedAttempt` ``{attempt, code, type, message, traceback, duration}``;
journals written before it was kept have none, read as an empty list.
"""

from __future__ import annotations

import os
import traceback
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from perdure import bodyshape, codec
from perdure.store import port

# A failed attempt's record is bounded, so a step that fails with a huge
# message or a deep stack cannot bloat its journal entry.
MESSAGE_LIMIT = 1000
_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep
TRACEBACK_LIMIT = 2000
TRACEBACK_FRAMES = 6


def _bounded(text: str, limit: int, *, keep_tail: bool = False) -> str:
    if len(text) <= limit:
        return text
    return "..." + text[-(limit - 3) :] if keep_tail else text[: limit - 3] + "..."


def traceback_summary(exc: BaseException) -> str:
    """Return the innermost frames of ``exc``'s traceback and its last line, bounded."""
    every = traceback.extract_tb(exc.__traceback__)
    # The engine's own frames (the attempt loop, step wrappers) say nothing
    # about the failure; they are kept only when nothing else is left.
    theirs = [f for f in every if not f.filename.startswith(_PACKAGE)] or every
    frames = theirs[-TRACEBACK_FRAMES:]
    # Each line is bounded too, so a huge message cannot push the frames out.
    lines = [_bounded(f"{f.filename}:{f.lineno} in {f.name}", 200, keep_tail=True) for f in frames]
    lines.append(_bounded(traceback.format_exception_only(exc)[-1].strip(), 500))
    return _bounded("\n".join(lines), TRACEBACK_LIMIT, keep_tail=True)


@dataclass(frozen=True)
class FailedAttempt:
    """One attempt of a step that raised: what it raised, where, and how long it ran."""

    attempt: int
    code: str
    type: str
    message: str
    traceback: str | None = None
    duration: float | None = None

    @classmethod
    def of(cls, attempt: int, exc: BaseException, duration: float | None) -> FailedAttempt:
        code = getattr(exc, "code", None)
        return cls(
            attempt,
            code if isinstance(code, str) else "step_failed",
            type(exc).__name__,
            _bounded(str(exc), MESSAGE_LIMIT),
            traceback_summary(exc),
            None if duration is None else round(duration, 6),
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "attempt": self.attempt,
            "code": self.code,
            "type": self.type,
            "message": self.message,
            "traceback": self.traceback,
            "duration": self.duration,
        }

    @classmethod
    def read(cls, data: Any) -> FailedAttempt:
        if not isinstance(data, dict):
            raise bodyshape.Unreadable("a failed attempt is not an object")
        attempt = bodyshape.field(data, "attempt")
        if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 1:
            raise bodyshape.Unreadable("a failed attempt's 'attempt' is not a positive integer")
        duration = data.get("duration")
        if duration is not None and (
            isinstance(duration, bool) or not isinstance(duration, int | float) or duration < 0
        ):
            raise bodyshape.Unreadable("a failed attempt's 'duration' is not a non-negative number")
        return cls(
            attempt,
            bodyshape.text(bodyshape.field(data, "code"), "code"),
            bodyshape.text(bodyshape.field(data, "type"), "type"),
            bodyshape.text(bodyshape.field(data, "message"), "message"),
            bodyshape.optional_text(data.get("traceback"), "traceback"),
            None if duration is None else float(duration),
        )


def _attempts(data: dict[str, Any]) -> tuple[FailedAttempt, ...]:
    found = data.get("attempts", [])
    if not isinstance(found, list):
        raise bodyshape.Unreadable("'attempts' is not a list")
    return tuple(FailedAttempt.read(item) for item in found)


def _attempts_list(attempts: tuple[FailedAttempt, ...]) -> list[dict[str, Any]]:
    return [a.as_dict() for a in attempts]


@dataclass(frozen=True)
class Attempts:
    """The failed attempts before a step's recorded outcome, or before the one in flight."""

    attempts: tuple[FailedAttempt, ...]

    def encode(self) -> str | None:
        """Return the body, or None when no attempt failed (the column stays empty)."""
        if not self.attempts:
            return None
        return codec.encode({"attempts": _attempts_list(self.attempts)})

    @classmethod
    def decode(cls, text: str | None) -> Attempts:
        return cls(_attempts(bodyshape.read_object(text)) if text is not None else ())


@dataclass(frozen=True)
class StepError:
    """The error of a step that failed for good (or was canceled before its outcome).

    ``attempts`` holds every failed attempt, the last one included.
    """

    type: str
    message: str
    code: str = "step_failed"
    attempts: tuple[FailedAttempt, ...] = ()

    def encode(self) -> str:
        body: dict[str, Any] = {"type": self.type, "message": self.message, "code": self.code}
        if self.attempts:
            body["attempts"] = _attempts_list(self.attempts)
        return codec.encode(body)

    @classmethod
    def decode(cls, text: str | None) -> StepError:
        data = bodyshape.read_object(text)
        return cls(
            str(data.get("type")), str(data.get("message")), str(data.get("code")), _attempts(data)
        )


@dataclass(frozen=True)
class AttemptFailed:
    """The error of a ``started`` step whose last attempt certainly did not happen.

    The attempt raised (for a ``once`` step: ``EffectFailed``) and a retry is
    due: the position is not an unsettled effect. ``attempts`` holds every
    failed attempt so far, this one included.
    """

    type: str
    message: str
    attempts: tuple[FailedAttempt, ...] = ()
    # Set when the backoff parks the run: the next attempt is not due before it.
    retry_at: datetime | None = None

    def encode(self) -> str:
        body: dict[str, Any] = {"code": "effect_failed", "type": self.type, "message": self.message}
        if self.attempts:
            body["attempts"] = _attempts_list(self.attempts)
        if self.retry_at is not None:
            body["retry_at"] = self.retry_at.isoformat()
        return codec.encode(body)

    @classmethod
    def decode(cls, text: str | None) -> AttemptFailed | None:
        """Return the failed attempt, or None for an error of another kind.

        Raises:
            ValueError: ``retry_at`` is not an aware instant.
        """
        data = codec.decode(text or "null")
        if not isinstance(data, dict) or data.get("code") != "effect_failed":
            return None
        due = data.get("retry_at")
        return cls(
            str(data.get("type")),
            str(data.get("message")),
            _attempts(data),
            None if due is None else bodyshape.instant(due),
        )


def failed_attempts(entry: port.JournalEntry) -> tuple[FailedAttempt, ...]:
    """Return a ``step`` entry's failed attempts, oldest first (none for other kinds).

    An entry written before attempts were kept yields its one known failure
    (a retry-due attempt, or a step's final error), without traceback or
    duration.

    Raises:
        bodyshape.Unreadable: the body is not of the shape this code writes.
    """
    if entry.kind != "step" or entry.error is None:
        return ()
    data = bodyshape.read_object(entry.error)
    found = _attempts(data)
    if found:
        return found
    code, kind = data.get("code"), str(data.get("type"))
    older = (entry.status == "started" and code == "effect_failed") or (
        entry.status == "error" and code == "step_failed" and kind != "Resolved"
    )
    if older:
        return (FailedAttempt(entry.attempt, str(code), kind, str(data.get("message"))),)
    return ()


def retry_due(entry: port.JournalEntry) -> bool:
    """Whether a ``started`` entry records an attempt whose effect certainly failed."""
    if entry.status != "started" or entry.error is None:
        return False
    # Only the code decides; the attempts it keeps are read (and checked) apart.
    data = codec.decode(entry.error)
    return isinstance(data, dict) and data.get("code") == "effect_failed"


def unsettled(entry: port.JournalEntry) -> bool:
    """Whether the entry is a ``once`` effect that may have escaped without a record."""
    return entry.kind == "step" and entry.status == "started" and not retry_due(entry)
