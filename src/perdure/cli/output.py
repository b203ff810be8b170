"""Exit codes, failures and what the commands print: JSON or lines for people.

A command ends early by raising an error of :mod:`perdure.errors`, or a
:class:`Fail` that carries one with what to print; the group class :class:`Group`
reports it (one line on stderr, maybe a document on stdout) and exits with its
status, and turns usage errors and unexpected exceptions into the same shape.
"""

from __future__ import annotations

import dataclasses
import json
import os
import traceback
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, NoReturn
from urllib.parse import urlsplit, urlunsplit

import click

from perdure import errors, records

# Errors that mean "understood, and refused"; every other PerdureError is bad input.
_REFUSED: tuple[type[errors.PerdureError], ...] = (
    errors.WaitSettled,
    errors.WaitExpired,
    errors.WaitStillOpen,
    errors.RunFinished,
    errors.RunNotFinished,
    errors.KeyConflict,
    errors.OwnershipConflict,
    errors.EffectUnsettled,
    errors.NotResolvable,
    errors.RunFailed,
    errors.ResultTimeout,
    errors.NotCanceled,
    errors.UpdateRejected,
    errors.UpdateAbandoned,
    errors.UpdateTimedOut,
    errors.RunEventMissing,
    errors.QueryFailed,
)

EXIT_OK = 0
EXIT_REFUSED = 1
EXIT_BAD_INPUT = 2
EXIT_INTERNAL = 3


class Fail(Exception):
    """End the command with a non-zero exit: one line on stderr, maybe a document on stdout.

    The code printed is the error's, so every code the command line prints
    is one of :mod:`perdure.errors`. Refusals exit 1, other errors 2, unless
    ``status`` says otherwise.
    """

    def __init__(
        self,
        error: errors.PerdureError,
        *,
        status: int | None = None,
        doc: dict[str, Any] | None = None,
        lines: Sequence[str] = (),
    ) -> None:
        super().__init__(str(error))
        self.error = error
        self.code = error.code
        self.message = str(error)
        refused = isinstance(error, _REFUSED)
        self.status = (
            status if status is not None else (EXIT_REFUSED if refused else EXIT_BAD_INPUT)
        )
        self.doc = doc
        self.lines = list(lines)
        self.label = "refused" if refused else "error"
        self.as_json = False


# -- output -------------------------------------------------------------------


def _default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, set | frozenset | tuple):
        return list(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _dumps(value: Any, *, indent: int | None = 2) -> str:
    return json.dumps(value, default=_default, indent=indent, ensure_ascii=False)


def emit_json(value: Any) -> None:
    click.echo(_dumps(value))


def compact(value: Any) -> str:
    return _dumps(value, indent=None)


def when(value: datetime | None) -> str:
    if value is None:
        return "-"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]
    lines = []
    for row in (headers, *rows):
        cells = [cell.ljust(w) for cell, w in zip(row, widths, strict=True)]
        lines.append("  ".join(cells).rstrip())
    return lines


def echo_lines(lines: Sequence[str]) -> None:
    for line in lines:
        click.echo(line)


def why(error: dict[str, Any] | None) -> str:
    """Return ``code at step X: message`` for a run's recorded error."""
    if not error:
        return "-"
    where = f" at step {error['step']}" if error.get("step") else ""
    return f"{error.get('code', '?')}{where}: {error.get('message', '')}"


def echo_attempts(attempts: Sequence[records.StepAttempt]) -> None:
    """Print each failed step attempt: what it raised, how long it ran, and where."""
    if not attempts:
        return
    click.echo("")
    click.echo("failed attempts")
    for a in attempts:
        took = ""
        if a.duration is not None:
            took = (
                f" after {a.duration * 1000:.3g} ms"
                if a.duration < 1
                else f" after {a.duration:.2f} s"
            )
        click.echo(
            f"  step {a.step} attempt {a.attempt}{took}: [{a.code}] {a.type}: "
            + _one_line(a.message)
        )
        for line in (a.traceback or "").splitlines():
            click.echo(f"      {line}")


def run_doc(info: records.RunInfo, app: str | None = None) -> dict[str, Any]:
    doc = dataclasses.asdict(info)
    if app is not None:
        doc = {"run_id": info.run_id, "app": app, **{k: v for k, v in doc.items() if k != "run_id"}}
    return doc


def redact(url: str) -> str:
    """Return ``url`` without its password, for messages."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def _one_line(message: str) -> str:
    text = " ".join(message.split())
    text = text[:-1] if text.endswith(".") and not text.endswith("..") else text
    return text[:1].lower() + text[1:] if text[:1].isupper() and text[1:2].islower() else text


def _report(fail: Fail) -> None:
    if fail.as_json:
        key = "refused" if fail.status == EXIT_REFUSED else "error"
        emit_json({key: {"code": fail.code, "message": fail.message}, **(fail.doc or {})})
    elif fail.lines:
        echo_lines(fail.lines)
    click.echo(f"perdure: {fail.label}: [{fail.code}] {_one_line(fail.message)}", err=True)


class Group(click.Group):
    """A group that reports every failure as one line and an exit code."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(self.commands)  # in the order they are defined, not sorted

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as exc:
            _usage_failure(ctx, exc)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.exceptions.Abort):
            raise
        except click.UsageError as exc:
            _usage_failure(ctx, exc)
        except Fail as fail:
            _report(fail)
            ctx.exit(fail.status)
        except (click.ClickException, BrokenPipeError):
            raise  # click reports these itself (a closed pipe exits 1 quietly)
        except Exception as exc:
            if os.environ.get("PERDURE_DEBUG"):
                traceback.print_exc()
            hint = (
                "" if os.environ.get("PERDURE_DEBUG") else " (PERDURE_DEBUG=1 shows the traceback)"
            )
            click.echo(f"perdure: internal error: {type(exc).__name__}: {exc}{hint}", err=True)
            ctx.exit(EXIT_INTERNAL)


def _usage_failure(ctx: click.Context, exc: click.UsageError) -> NoReturn:
    where = exc.ctx.command_path if exc.ctx is not None else ctx.command_path
    message = _one_line(exc.format_message()).rstrip(".")
    click.echo(f"perdure: error: [invalid_input] {message} (see '{where} --help')", err=True)
    ctx.exit(EXIT_BAD_INPUT)
