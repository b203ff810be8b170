"""What the commands share: opening the store, the common options, JSON arguments."""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import click

from perdure import client as client_api
from perdure import errors
from perdure.cli import console
from perdure.store import default_url, open_store, port

# -- plumbing -------------------------------------------------------------------

F = TypeVar("F", bound=Callable[..., Any])


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
            f"cannot open the store {console._redact(url)}: {type(exc).__name__}: {exc}"
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


def _handled(fn: F) -> F:
    """Turn the engine's errors into exit codes for one command."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except console.Fail as known:
            known.as_json = bool(kwargs.get("as_json"))
            raise
        except errors.PerdureError as exc:
            failed = console.Fail.of(exc)
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
