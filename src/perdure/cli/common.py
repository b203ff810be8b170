"""What the commands share: the store, ``MODULE:APP``, the common options, JSON arguments."""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import click

from perdure import app as app_api
from perdure import client as client_api
from perdure import codec, errors, payloads
from perdure.cli import output
from perdure.store import default_url, open_store, port

F = TypeVar("F", bound=Callable[..., Any])


@contextlib.contextmanager
def opened(url: str | None, *, create: bool = True, migrate: bool = True) -> Iterator[port.Store]:
    """Open (and migrate) the store, turning any failure into bad input.

    With ``create=False`` (every command that reads or steers existing runs) a
    SQLite file that does not exist is refused instead of being created.
    """
    url = url or default_url()
    try:
        store = open_store(url, create=create, migrate=migrate)
    except errors.PerdureError:
        raise
    except Exception as exc:  # an adapter or driver error we do not know by name
        raise errors.StoreUnavailable(
            f"cannot open the store {output.redact(url)}: {type(exc).__name__}: {exc}"
        ) from exc
    if url.startswith("sqlite:///") and not url.startswith("sqlite:////"):
        # A relative SQLite URL names another file in another directory: say which.
        click.echo(f"store: {store.url} ({url} in {os.getcwd()})", err=True)
    try:
        yield store
    finally:
        store.close()


def client_for_run(store: port.Store, run_id: str) -> client_api.Client:
    """Return a client scoped to the app the run belongs to."""
    run = store.get_run(run_id)
    if run is None:
        raise errors.RunNotFound(run_id)
    return client(store, run.app)


def client(store: port.Store, app: str) -> client_api.Client:
    """Return a client of ``app`` that opens payloads with ``perdure --codec``'s codec.

    Without ``--codec``, sealed payloads are shown (and read) as they are stored.
    """
    return client_api.Client(store, app, payloads=payload_layer())


CODEC_HELP = (
    "Open sealed payloads with this codec: MODULE:OBJ naming a perdure.PayloadCodec, "
    "or a perdure.App (its codec and payload store). Without it, sealed payloads are "
    "shown as stored."
)


def payload_layer() -> payloads.Payloads:
    """Return the payload layer ``perdure --codec MODULE:OBJ`` names (plain without it)."""
    ctx = click.get_current_context(silent=True)
    target = ctx.find_root().meta.get("perdure.codec") if ctx is not None else None
    if not target:
        return payloads.PLAIN.lenient()
    found = load_object(target)
    if isinstance(found, app_api.App):
        return found.payloads.lenient()
    if isinstance(found, payloads.PayloadCodec):
        return payloads.Payloads(payload_codec=found, strict=False)
    raise errors.InvalidInput(
        f"--codec {target} is a {type(found).__name__}, not a perdure.PayloadCodec or perdure.App"
    )


def load_app(target: str) -> app_api.App:
    """Import ``MODULE:APP`` (the current directory first on the path) and return the App."""
    found = load_object(target)
    if not isinstance(found, app_api.App):
        raise errors.AppNotFound(f"{target} is a {type(found).__name__}, not a perdure.App")
    return found


def load_object(target: str) -> Any:
    """Import ``MODULE:OBJ`` (the current directory first on the path) and return OBJ."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise errors.InvalidInput(f"expected MODULE:APP (like shop:app), got {target!r}")
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # SyntaxError, ImportError, whatever its top level raised
        raise errors.ImportFailed(
            f"cannot import module {module_name!r}: {type(exc).__name__}: {exc}"
        ) from exc
    found: Any = module
    for part in attr.split("."):
        try:
            found = getattr(found, part)
        except AttributeError:
            raise errors.AppNotFound(f"module {module_name!r} has no attribute {attr!r}") from None
    return found


def handled(fn: F) -> F:
    """Turn the engine's errors into exit codes for one command."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except output.Fail as known:
            known.as_json = bool(kwargs.get("as_json"))
            raise
        except errors.PerdureError as exc:
            failed = output.Fail(exc)
            failed.as_json = bool(kwargs.get("as_json"))
            raise failed from exc

    return wrapper  # type: ignore[return-value]


STORE_HELP = "Store URL (default: $PERDURE_STORE, else sqlite:///perdure.db)."
APP_STORE_HELP = (
    "Store URL (default: the app's own store: the URL given to perdure.App(...), "
    "else $PERDURE_STORE, else sqlite:///perdure.db)."
)
READ_STORE_HELP = (
    "Store URL (default: MODULE:APP's store when given, else $PERDURE_STORE, "
    "else sqlite:///perdure.db). A missing SQLite file is an error, never created."
)


def _options(fn: F, *, store_help: str, with_json: bool) -> F:
    if with_json:
        fn = click.option(
            "--json", "as_json", is_flag=True, help="Print one JSON document on stdout."
        )(fn)
    fn = click.option("--store", "store_url", metavar="URL", default=None, help=store_help)(fn)
    return handled(fn)


def options(fn: F) -> F:
    """Add ``--store`` and ``--json`` to a command and handle its errors."""
    return _options(fn, store_help=STORE_HELP, with_json=True)


def read_options(fn: F) -> F:
    """Add ``--store`` (a MODULE:APP's store by default) and ``--json`` to a listing command."""
    return _options(fn, store_help=READ_STORE_HELP, with_json=True)


def app_options(fn: F) -> F:
    """Add ``--store`` (the app's own store by default) and ``--json`` to a MODULE:APP command."""
    return _options(fn, store_help=APP_STORE_HELP, with_json=True)


def serve_options(fn: F) -> F:
    """Add ``--store`` to a command that never ends: it prints no single JSON document."""
    return _options(fn, store_help=APP_STORE_HELP, with_json=False)


def app_option(fn: F) -> F:
    """Add the optional ``MODULE:APP`` argument and ``--app NAME`` of a listing command."""
    fn = click.option(
        "--app",
        "app_name",
        default=None,
        metavar="NAME",
        help="Only this app (default: the app of MODULE:APP when given, else $PERDURE_APP, "
        "else every app in the store).",
    )(fn)
    return click.argument("target", metavar="[MODULE:APP]", required=False)(fn)


def read_scope(
    target: str | None, app_name: str | None, store_url: str | None
) -> tuple[str | None, str | None]:
    """Return the store URL and the app a listing command reads (None: every app).

    ``--app`` wins, then the app of ``MODULE:APP``, then ``$PERDURE_APP``. The
    store is ``--store``, else MODULE:APP's own store, else the default.
    """
    name = app_name or None
    url = store_url
    if target:
        app = load_app(target)
        name = name or app.name
        url = url or app.url
    return url, name or os.environ.get("PERDURE_APP") or None


def apps_in(store: port.Store, name: str | None) -> list[str]:
    """Return the apps a listing reads: the one named, or every app in the store."""
    return [name] if name else store.apps()


class JsonValue(click.ParamType):  # type: ignore[type-arg]
    """A JSON document given on the command line, optionally of one shape."""

    name = "JSON"

    def __init__(self, shape: type | None = None) -> None:
        self.shape = shape

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not isinstance(value, str):
            return value
        try:
            parsed = codec.decode(value)
        except errors.InvalidPayload as exc:
            shown = value if len(value) <= 80 else f"{value[:77]}..."
            self.fail(f"{shown!r} is not a JSON value perdure takes ({exc})", param, ctx)
        if self.shape is list and not isinstance(parsed, list):
            self.fail(f"expected a JSON array like '[1, \"a\"]', got {value!r}", param, ctx)
        if self.shape is dict and not isinstance(parsed, dict):
            self.fail(f"expected a JSON object like '{{\"k\": 1}}', got {value!r}", param, ctx)
        return parsed
