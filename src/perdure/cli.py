"""The ``perdure`` command line.

Only ``worker`` and ``start`` import user code (``MODULE:APP``); every other
command works from the store alone, through a :class:`~perdure.client.Client`.
Commands that take a run id find the run's app in the store, so ``--app`` is
only needed to list runs or waits.

Exit codes: 0 done; 1 refused (the request was understood and the engine said
no: a settled or expired wait, a finished run, a cancel that took no effect, a
``start --wait`` whose run did not succeed); 2 bad input (malformed arguments
or JSON, an unknown run or workflow, an unusable store, a module that does not
import); 3 an unexpected internal error. Errors print one line on stderr;
``PERDURE_DEBUG=1`` adds the traceback of an internal error.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import json
import logging
import os
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from typing import Any, NoReturn, TypeVar
from urllib.parse import urlsplit, urlunsplit

import click

from perdure import app as app_api
from perdure import client as client_api
from perdure import errors, records
from perdure.store import default_url, open_store, port

F = TypeVar("F", bound=Callable[..., Any])

# Errors that mean "understood, and refused"; every other PerdureError is bad input.
_REFUSED: tuple[type[errors.PerdureError], ...] = (
    errors.WaitSettled,
    errors.WaitExpired,
    errors.WaitStillOpen,
    errors.RunFinished,
    errors.NotResolvable,
    errors.RunFailed,
    errors.ResultTimeout,
)

EXIT_OK = 0
EXIT_REFUSED = 1
EXIT_BAD_INPUT = 2
EXIT_INTERNAL = 3


class Fail(Exception):
    """End the command with a non-zero exit: one line on stderr, maybe a document on stdout."""

    def __init__(
        self,
        code: str,
        message: str,
        status: int,
        *,
        doc: dict[str, Any] | None = None,
        lines: Sequence[str] = (),
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status
        self.doc = doc
        self.lines = list(lines)
        self.label = "refused" if status == EXIT_REFUSED else "error"
        self.as_json = False

    @classmethod
    def of(cls, exc: errors.PerdureError, **extra: Any) -> Fail:
        status = EXIT_REFUSED if isinstance(exc, _REFUSED) else EXIT_BAD_INPUT
        return cls(exc.code, str(exc), status, **extra)


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


def _emit_json(value: Any) -> None:
    click.echo(_dumps(value))


def _compact(value: Any) -> str:
    return _dumps(value, indent=None)


def _when(value: datetime | None) -> str:
    if value is None:
        return "-"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]
    lines = []
    for row in (headers, *rows):
        cells = [cell.ljust(w) for cell, w in zip(row, widths, strict=True)]
        lines.append("  ".join(cells).rstrip())
    return lines


def _echo_lines(lines: Sequence[str]) -> None:
    for line in lines:
        click.echo(line)


def _why(error: dict[str, Any] | None) -> str:
    """Return ``code at step X: message`` for a run's recorded error."""
    if not error:
        return "-"
    where = f" at step {error['step']}" if error.get("step") else ""
    return f"{error.get('code', '?')}{where}: {error.get('message', '')}"


def _run_doc(info: records.RunInfo, app: str | None = None) -> dict[str, Any]:
    doc = dataclasses.asdict(info)
    if app is not None:
        doc = {"run_id": info.run_id, "app": app, **{k: v for k, v in doc.items() if k != "run_id"}}
    return doc


def _redact(url: str) -> str:
    """Return ``url`` without its password, for messages."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


# -- plumbing -------------------------------------------------------------------


@contextlib.contextmanager
def _opened(url: str | None) -> Iterator[port.Store]:
    """Open (and migrate) the store, turning any failure into bad input."""
    url = url or default_url()
    try:
        store = open_store(url)
    except errors.PerdureError:
        raise
    except Exception as exc:  # an adapter or driver error we do not know by name
        raise errors.StoreUnavailable(
            f"cannot open the store {_redact(url)}: {type(exc).__name__}: {exc}"
        ) from exc
    try:
        yield store
    finally:
        store.close()


def _client_for_run(store: port.Store, run_id: str) -> client_api.Client:
    """Return a client scoped to the app the run belongs to."""
    run = store.get_run(run_id)
    if run is None:
        raise errors.RunNotFound(run_id)
    return client_api.Client(store, run.app)


def _load_app(target: str) -> app_api.App:
    """Import ``MODULE:APP`` (the current directory first on the path) and return the App."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise Fail(
            "invalid_input", f"expected MODULE:APP (like shop:app), got {target!r}", EXIT_BAD_INPUT
        )
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # SyntaxError, ImportError, whatever its top level raised
        raise Fail(
            "import_failed",
            f"cannot import module {module_name!r}: {type(exc).__name__}: {exc}",
            EXIT_BAD_INPUT,
        ) from exc
    found: Any = module
    for part in attr.split("."):
        try:
            found = getattr(found, part)
        except AttributeError:
            raise Fail(
                "app_not_found", f"module {module_name!r} has no attribute {attr!r}", EXIT_BAD_INPUT
            ) from None
    if not isinstance(found, app_api.App):
        raise Fail(
            "app_not_found",
            f"{target} is a {type(found).__name__}, not a perdure.App",
            EXIT_BAD_INPUT,
        )
    return found


def _handled(fn: F) -> F:
    """Turn the engine's errors into exit codes for one command."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Fail as known:
            known.as_json = bool(kwargs.get("as_json"))
            raise
        except errors.PerdureError as exc:
            failed = Fail.of(exc)
            failed.as_json = bool(kwargs.get("as_json"))
            raise failed from exc

    return wrapper  # type: ignore[return-value]


def _common(fn: F) -> F:
    """Add ``--store`` and ``--json`` to a command and handle its errors."""
    fn = click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout.")(
        fn
    )
    fn = click.option(
        "--store",
        "store_url",
        metavar="URL",
        default=None,
        help="Store URL (default: $PERDURE_STORE, else sqlite:///perdure.db).",
    )(fn)
    return _handled(fn)


class JsonValue(click.ParamType):  # type: ignore[type-arg]
    """A JSON document given on the command line, optionally of one shape."""

    name = "JSON"

    def __init__(self, shape: type | None = None) -> None:
        self.shape = shape

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not isinstance(value, str):
            return value
        try:
            parsed = json.loads(value)
        except ValueError as exc:
            self.fail(f"{value!r} is not valid JSON ({exc})", param, ctx)
        if self.shape is list and not isinstance(parsed, list):
            self.fail(f"expected a JSON array like '[1, \"a\"]', got {value!r}", param, ctx)
        if self.shape is dict and not isinstance(parsed, dict):
            self.fail(f"expected a JSON object like '{{\"k\": 1}}', got {value!r}", param, ctx)
        return parsed


def _one_line(message: str) -> str:
    text = " ".join(message.split())
    text = text[:-1] if text.endswith(".") and not text.endswith("..") else text
    return text[:1].lower() + text[1:] if text[:1].isupper() and text[1:2].islower() else text


def _report(fail: Fail) -> None:
    if fail.as_json:
        key = "refused" if fail.status == EXIT_REFUSED else "error"
        _emit_json({key: {"code": fail.code, "message": fail.message}, **(fail.doc or {})})
    elif fail.lines:
        _echo_lines(fail.lines)
    click.echo(f"perdure: {fail.label}: [{fail.code}] {_one_line(fail.message)}", err=True)


class _Group(click.Group):
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


# -- commands -------------------------------------------------------------------


@click.group(
    cls=_Group,
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog="Exit status: 0 done, 1 refused, 2 bad input, 3 internal error.",
)
@click.version_option(package_name="perdure", prog_name="perdure")
def cli() -> None:
    """perdure: durable workflows for plain Python, on SQLite or PostgreSQL."""


@cli.command()
@click.argument("target", metavar="MODULE:APP")
@click.option(
    "--concurrency",
    type=click.IntRange(min=1),
    default=8,
    show_default=True,
    help="Runs executed at once.",
)
@click.option(
    "--lease-ttl",
    type=click.FloatRange(min=0, min_open=True),
    default=30.0,
    show_default=True,
    help="Seconds a claim lasts unless renewed.",
)
@click.option(
    "--heartbeat",
    type=click.FloatRange(min=0, min_open=True),
    default=5.0,
    show_default=True,
    help="Seconds between lease renewals (at most lease-ttl / 3).",
)
@_common
def worker(
    target: str,
    concurrency: int,
    lease_ttl: float,
    heartbeat: float,
    store_url: str | None,
    as_json: bool,
) -> None:
    """Serve the app's runs until SIGINT or SIGTERM."""
    app = _load_app(target)
    if store_url:
        app.use_store(store_url)
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        served = app.worker(concurrency=concurrency, lease_ttl=lease_ttl, heartbeat=heartbeat)
        about = {
            "worker_id": served.worker_id,
            "app": app.name,
            "store": _redact(app.store.url),
            "pid": os.getpid(),
            "workflows": [{"name": n, "version": v} for n, v in app.workflow_versions()],
            "concurrency": concurrency,
            "lease_ttl": lease_ttl,
            "heartbeat": heartbeat,
        }
        if as_json:
            click.echo(_compact(about))  # one line, so a supervisor can read it as it starts
        else:
            names = ", ".join(f"{n} v{v}" for n, v in app.workflow_versions()) or "none"
            click.echo(
                f"worker {served.worker_id} serving app {app.name} on "
                f"{about['store']} (workflows: {names}); Ctrl-C to stop"
            )
        sys.stdout.flush()
        served.run()
    finally:
        app.close()


@cli.command()
@click.argument("target", metavar="MODULE:APP")
@click.argument("workflow")
@click.option(
    "--args",
    "args_",
    type=JsonValue(list),
    default=None,
    metavar="JSON",
    help="Positional arguments as a JSON array.",
)
@click.option(
    "--kwargs",
    "kwargs_",
    type=JsonValue(dict),
    default=None,
    metavar="JSON",
    help="Keyword arguments as a JSON object.",
)
@click.option("--key", default=None, help="Idempotency key: the same key returns the same run.")
@click.option("--wait", is_flag=True, help="Wait for the run to end (a worker must be running).")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0),
    default=None,
    metavar="S",
    help="With --wait, give up after S seconds.",
)
@_common
def start(
    target: str,
    workflow: str,
    args_: list[Any] | None,
    kwargs_: dict[str, Any] | None,
    key: str | None,
    wait: bool,
    timeout: float | None,
    store_url: str | None,
    as_json: bool,
) -> None:
    """Start a run of a workflow.

    With --key, the run already started under that key is returned instead.
    With --wait, exits 1 unless the run succeeds.
    """
    if timeout is not None and not wait:
        raise Fail("invalid_input", "--timeout only makes sense with --wait", EXIT_BAD_INPUT)
    app = _load_app(target)
    if store_url:
        app.use_store(store_url)
    try:
        handle = app.start(workflow, *(args_ or []), key=key, **(kwargs_ or {}))
        info = app.get(handle.run_id)
        if not wait:
            if as_json:
                _emit_json(_run_doc(info, app.name))
            else:
                click.echo(
                    f"run {info.run_id} {info.state} "
                    f"(workflow {info.workflow} v{info.version}, app {app.name})"
                )
            return
        if not as_json:
            click.echo(f"run {info.run_id} {info.state}; waiting for it to end")
        try:
            handle.result(timeout=timeout)
        except (errors.RunFailed, errors.ResultTimeout) as exc:
            info = app.get(handle.run_id)
            raise Fail.of(
                exc,
                doc={"run": _run_doc(info, app.name)},
                lines=[f"run {info.run_id} is {info.state}: {_why(info.error)}"]
                if info.error
                else [],
            ) from exc
        info = app.get(handle.run_id)
        if as_json:
            _emit_json(_run_doc(info, app.name))
        else:
            click.echo(f"run {info.run_id} succeeded: {_compact(info.result)}")
    finally:
        app.close()


@cli.command()
@click.option(
    "--state", type=click.Choice(port.RUN_STATES), default=None, help="Only runs in this state."
)
@click.option("--workflow", default=None, metavar="NAME", help="Only runs of this workflow.")
@click.option("--limit", type=click.IntRange(min=1), default=100, show_default=True)
@click.option(
    "--app",
    "app_name",
    default="default",
    show_default=True,
    metavar="NAME",
    help="The app whose runs to list.",
)
@_common
def runs(
    state: str | None,
    workflow: str | None,
    limit: int,
    app_name: str,
    store_url: str | None,
    as_json: bool,
) -> None:
    """List an app's runs, newest first.

    Failed and needs_attention runs say why they stopped.
    """
    with _opened(store_url) as store:
        found = client_api.Client(store, app_name).runs(state=state, workflow=workflow, limit=limit)
    if as_json:
        _emit_json([_run_doc(info, app_name) for info in found])
        return
    if not found:
        click.echo(f"no runs in app {app_name}" + (f" in state {state}" if state else ""))
        return
    lines = _table(
        ["RUN", "WORKFLOW", "VERSION", "STATE", "ATTEMPT", "UPDATED"],
        [
            [i.run_id, i.workflow, i.version, i.state, str(i.attempt), _when(i.updated_at)]
            for i in found
        ],
    )
    click.echo(lines[0])
    for info, line in zip(found, lines[1:], strict=True):
        click.echo(line)
        if info.error and info.state in ("failed", "needs_attention"):
            click.echo(f"    {_why(info.error)}")


@cli.command()
@click.argument("run_id")
@click.option("--history", is_flag=True, help="Also print the run's provenance ledger.")
@_common
def show(run_id: str, history: bool, store_url: str | None, as_json: bool) -> None:
    """Print a run (with --history, its provenance ledger)."""
    with _opened(store_url) as store:
        client = _client_for_run(store, run_id)
        info = client.get(run_id)
        children = client.children(run_id)
        ledger = client.history(run_id) if history else None
    if as_json:
        doc = _run_doc(info, client.app)
        doc["children"] = children
        if ledger is not None:
            doc["history"] = ledger
        _emit_json(doc)
        return
    rows = [
        ("run", info.run_id),
        ("app", client.app),
        ("workflow", f"{info.workflow} (version {info.version})"),
        (
            "state",
            info.state + (" (cancel requested)" if info.cancel_requested and not info.done else ""),
        ),
        ("attempt", f"{info.attempt} (consecutive failures: {info.failures})"),
        ("created", _when(info.created_at)),
        ("updated", _when(info.updated_at)),
        ("key", info.key or "-"),
        ("parent", info.parent_id or "-"),
    ]
    if children:
        rows.append(("children", ", ".join(f"{n} {s}" for s, n in sorted(children.items()))))
    if info.state == "succeeded":
        rows.append(("result", _compact(info.result)))
    if info.error:
        rows.append(("error", _why(info.error)))
    width = max(len(k) for k, _ in rows)
    for name, value in rows:
        click.echo(f"{name.ljust(width)}  {value}")
    if ledger is not None:
        click.echo("")
        _echo_lines(
            _table(
                ["SEQ", "AT", "KIND", "GEN", "WORKER", "STEP", "DIGEST", "NOTE"],
                [
                    [
                        str(p.sequence),
                        _when(p.at),
                        p.kind,
                        str(p.generation),
                        p.worker or "-",
                        p.step or "-",
                        (p.digest or "-")[:12],
                        p.note or "",
                    ]
                    for p in ledger
                ],
            )
        )


def _receipt_lines(receipt: records.Receipt) -> list[str]:
    return [
        f"wait     {receipt.wait_id}",
        f"outcome  {receipt.outcome}",
        f"at       {_when(receipt.at)}",
        f"signal   {receipt.signal_id or '-'}",
        f"digest   {receipt.payload_digest or '-'}",
    ]


@cli.command()
@click.argument("run_id")
@click.argument("name")
@click.option(
    "--payload",
    type=JsonValue(),
    default=None,
    metavar="JSON",
    help="The signal's payload (a JSON value).",
)
@click.option(
    "--signal-id",
    default=None,
    metavar="ID",
    help="Deduplication id: a repeat returns the original receipt.",
)
@_common
def signal(
    run_id: str,
    name: str,
    payload: Any,
    signal_id: str | None,
    store_url: str | None,
    as_json: bool,
) -> None:
    """Signal a run's wait and print the receipt.

    Exits 1, printing the stored receipt, when the wait was already settled
    by another signal, a timeout or a cancel.
    """
    with _opened(store_url) as store:
        client = _client_for_run(store, run_id)
        try:
            receipt = client.signal(run_id, name, payload, signal_id)
        except (errors.WaitSettled, errors.WaitExpired) as exc:
            stored: records.Receipt = exc.receipt
            raise Fail.of(exc, doc={"receipt": stored}, lines=_receipt_lines(stored)) from exc
    if as_json:
        _emit_json(receipt)
    else:
        _echo_lines(_receipt_lines(receipt))


@cli.command()
@click.argument("run_id")
@click.argument("channel")
@click.argument("key")
@click.option(
    "--payload",
    type=JsonValue(),
    default=None,
    metavar="JSON",
    help="The message's payload (a JSON value).",
)
@_common
def send(
    run_id: str, channel: str, key: str, payload: Any, store_url: str | None, as_json: bool
) -> None:
    """Send a message to a run's channel.

    A repeated KEY is not stored again: the first payload wins.
    """
    with _opened(store_url) as store:
        stored = _client_for_run(store, run_id).send(run_id, channel, key, payload)
    if as_json:
        _emit_json({"run_id": run_id, "channel": channel, "key": key, "stored": stored})
    elif stored:
        click.echo(f"message {key} stored on channel {channel} of run {run_id}")
    else:
        click.echo(
            f"message {key} was already sent on channel {channel} of run {run_id}; "
            "the first payload is kept"
        )


@cli.command()
@click.option("--run", "run_id", default=None, metavar="RUN_ID", help="Only this run's waits.")
@click.option(
    "--app",
    "app_name",
    default="default",
    show_default=True,
    metavar="NAME",
    help="The app whose waits to list (ignored with --run).",
)
@_common
def waits(run_id: str | None, app_name: str, store_url: str | None, as_json: bool) -> None:
    """List open waits.

    Waits whose deadline has passed are settled as timed out on the way.
    """
    with _opened(store_url) as store:
        if run_id is not None:
            client = _client_for_run(store, run_id)
        else:
            client = client_api.Client(store, app_name)
        found = client.waits(run_id)
    if as_json:
        _emit_json(found)
    elif not found:
        click.echo("no open waits")
    else:
        _echo_lines(
            _table(
                ["WAIT", "KIND", "DEADLINE"],
                [[w.wait_id, w.kind, _when(w.deadline)] for w in found],
            )
        )


@cli.command()
@click.argument("run_id")
@_common
def resume(run_id: str, store_url: str | None, as_json: bool) -> None:
    """Re-queue a waiting run whose waits all have outcomes."""
    with _opened(store_url) as store:
        client = _client_for_run(store, run_id)
        requeued = client.resume(run_id)
        info = client.get(run_id)
    if as_json:
        _emit_json({"run_id": run_id, "requeued": requeued, "state": info.state})
    elif requeued:
        click.echo(f"run {run_id} re-queued (now {info.state})")
    else:
        click.echo(f"run {run_id} is {info.state}; nothing to resume")


@cli.command()
@click.argument("run_id")
@_common
def cancel(run_id: str, store_url: str | None, as_json: bool) -> None:
    """Cancel a run and its descendants.

    Queued and waiting runs end at once; a running one stops at its next step.
    Exits 1 if the cancel took no effect (the run had already ended).
    """
    with _opened(store_url) as store:
        client = _client_for_run(store, run_id)
        took = client.cancel(run_id)
        info = client.get(run_id)
    doc = {
        "run_id": run_id,
        "canceled": took,
        "state": info.state,
        "cancel_requested": info.cancel_requested,
    }
    if not took:
        raise Fail(
            "not_canceled",
            f"cancel of run {run_id} took no effect: it is {info.state}",
            EXIT_REFUSED,
            doc=doc,
        )
    if as_json:
        _emit_json(doc)
    elif info.state == "canceled":
        click.echo(f"run {run_id} canceled")
    elif info.state == "needs_attention":
        click.echo(
            f"run {run_id} canceled with an unsettled effect; it needs attention: "
            f"{_why(info.error)}"
        )
    else:
        click.echo(f"cancel requested for run {run_id} ({info.state}); it stops at its next step")


@cli.command()
@click.argument("run_id")
@click.argument("step")
@click.option(
    "--output",
    type=JsonValue(),
    default=None,
    metavar="JSON",
    help="The step succeeded with this output (a JSON value); the run resumes.",
)
@click.option(
    "--error",
    "error_",
    default=None,
    metavar="MSG",
    help="The step failed with this message; the run fails.",
)
@click.option("--note", default=None, metavar="TEXT", help="Why, for the provenance ledger.")
@_common
def resolve(
    run_id: str,
    step: str,
    output: Any,
    error_: str | None,
    note: str | None,
    store_url: str | None,
    as_json: bool,
) -> None:
    """Settle the ambiguous STEP of a needs_attention run."""
    ctx = click.get_current_context()
    given_output = ctx.get_parameter_source("output") == click.core.ParameterSource.COMMANDLINE
    if given_output == (error_ is not None):
        raise Fail(
            "invalid_input", "give exactly one of --output JSON or --error MSG", EXIT_BAD_INPUT
        )
    with _opened(store_url) as store:
        client = _client_for_run(store, run_id)
        if given_output:
            info = client.resolve(run_id, step, output=output, note=note)
        else:
            info = client.resolve(run_id, step, error=error_, note=note)
    if as_json:
        _emit_json(_run_doc(info, client.app))
    elif given_output:
        click.echo(f"step {step} of run {run_id} resolved as succeeded; the run is {info.state}")
    else:
        click.echo(f"step {step} of run {run_id} resolved as failed; the run is {info.state}")


@cli.command()
@click.argument("run_id")
@click.option(
    "--from-step",
    default=None,
    metavar="STEP",
    help="Re-execute from this step (its key, e.g. charge or charge#2); "
    "default: from the first entry that did not succeed.",
)
@_common
def fork(run_id: str, from_step: str | None, store_url: str | None, as_json: bool) -> None:
    """Start a new run of RUN_ID's workflow and inputs that reuses its journal.

    The new run replays the recorded steps before the cut and executes from
    there: the way to retry a failed run once its code is fixed.
    """
    with _opened(store_url) as store:
        client = _client_for_run(store, run_id)
        forked = client.fork(run_id, from_step)
        reused = len(store.journal(forked.run_id))
        info = client.get(forked.run_id)
    if as_json:
        _emit_json({"forked_from": run_id, "reused_entries": reused, **_run_doc(info, client.app)})
    else:
        click.echo(
            f"run {forked.run_id} forked from {run_id}: {reused} journal entries reused, "
            f"the run is {info.state}"
        )


@cli.command()
@_common
def migrate(store_url: str | None, as_json: bool) -> None:
    """Create or upgrade the store's schema."""
    with _opened(store_url) as store:
        url = _redact(store.url)
    if as_json:
        _emit_json({"store": url, "migrated": True})
    else:
        click.echo(f"store {url} is migrated to this version of perdure")


@cli.command()
@_common
def demo(store_url: str | None, as_json: bool) -> None:
    """Run the embedded example end to end.

    A worker process is killed with SIGKILL in the middle of a run; a second
    one finishes it, and no finished step runs again.
    """
    from perdure import demo as demo_api

    report: dict[str, Any] = {}
    out: Callable[[str], None] = (
        (lambda line: click.echo(line, err=True)) if as_json else click.echo
    )
    code = demo_api.run_demo(out, store=store_url, report=report)
    if as_json and not code:
        _emit_json(report)
    if code:
        fail = Fail("demo_failed", str(report.get("problem") or "the demo failed"), code)
        fail.label = "error"
        fail.doc = report
        raise fail


def main() -> None:
    """Entry point of the ``perdure`` console script and ``python -m perdure``."""
    cli.main(prog_name="perdure")
