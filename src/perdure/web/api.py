"""The HTTP API under ``/api/v1``: the client's calls, JSON in and out.

Each endpoint is one row of :data:`ENDPOINTS`: method, path, the scope it
needs, a summary and a handler that calls the client (never the store's SQL).
The routes and the OpenAPI document are both built from that table, so a new
call (schedules, tasks) is one more row.

Errors are ``{"error": {"code", "message"}}`` with the status that fits
(:func:`status_of`); a refused signal adds the stored receipt under
``"receipt"``. Writes take ``Content-Type: application/json`` only, so a
plain cross-site form cannot post to an open local console.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from perdure import client as client_api
from perdure import errors, queues
from perdure.web import auth

if TYPE_CHECKING:
    from perdure.web.app import Console

_STATUS: list[tuple[type[errors.PerdureError], int]] = [
    (errors.Unauthorized, 401),
    (errors.Forbidden, 403),
    (errors.RunNotFound, 404),
    (errors.WorkflowNotFound, 404),
    (errors.TokenNotFound, 404),
    (errors.RunEventMissing, 404),
    (errors.UnknownQuery, 404),
    (errors.InvalidInput, 400),
    # The validator refused the payload: the caller's input, not the run's state.
    (errors.UpdateRejected, 400),
    # The update stays delivered and may still be answered: a retry with the
    # same update_id picks the answer up.
    (errors.UpdateTimedOut, 504),
    # The app's own query code raised.
    (errors.QueryFailed, 500),
    (errors.CorruptState, 500),
    (errors.StoreError, 503),
]


def status_of(exc: errors.PerdureError) -> int:
    """Return the HTTP status of an engine error; a refusal is 409."""
    for cls, status in _STATUS:
        if isinstance(exc, cls):
            return status
    return 409


def jsonable(value: Any) -> Any:
    """Return ``value`` (records, datetimes, JSON values) as plain JSON values."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return value


def error_body(exc: errors.PerdureError) -> dict[str, Any]:
    """Return the JSON body of an error, with the stored receipt of a refused signal."""
    body: dict[str, Any] = {"error": {"code": exc.code, "message": exc.message}}
    found = getattr(exc, "receipt", None)
    if found is not None:
        body["receipt"] = jsonable(found)
    update_id = getattr(exc, "update_id", None)
    if isinstance(update_id, str):
        body["update_id"] = update_id
    return body


def _answer(exc: errors.PerdureError) -> JSONResponse:
    status = status_of(exc)
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse(error_body(exc), status_code=status, headers=headers)


@dataclass(frozen=True)
class Call:
    """What a handler gets: the console, the path parameters, the query and the body."""

    console: Console
    path: dict[str, str]
    query: dict[str, str]
    body: dict[str, Any]

    @property
    def client(self) -> client_api.Client:
        return self.console.client

    def text(self, name: str, default: str | None = None) -> str | None:
        value = self.body.get(name, default)
        if value is not None and not isinstance(value, str):
            raise errors.InvalidInput(f"{name!r} must be a string")
        return value


@dataclass(frozen=True)
class Endpoint:
    """One API call: ``need`` is the scope it requires (see :mod:`perdure.web.auth`)."""

    method: str
    path: str
    need: auth.Need
    summary: str
    handler: Callable[[Call], Any]
    status: int = 200
    body: tuple[str, ...] = ()
    query: tuple[tuple[str, str], ...] = ()


# -- handlers --------------------------------------------------------------------


def _start(call: Call) -> Any:
    workflow = call.text("workflow")
    if not workflow:
        raise errors.InvalidInput("'workflow' is required")
    args = call.body.get("args", [])
    kwargs = call.body.get("kwargs", {})
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        raise errors.InvalidInput("'args' must be a list and 'kwargs' an object")
    key, version = call.text("key"), call.text("version")
    app = call.console.app
    if app is not None and version is None:
        handle = app.start(workflow, *args, key=key, **kwargs)
    elif version is None:
        raise errors.InvalidInput(
            "'version' is required when the console serves no code (perdure console --store)"
        )
    else:
        handle = call.client.start(workflow, version, args, kwargs, key=key)
    return {"run_id": handle.run_id, "created": handle.created}


def _int(call: Call, name: str, default: int) -> int:
    raw = call.query.get(name)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        raise errors.InvalidInput(f"{name!r} must be an integer, got {raw[:20]!r}") from None


def _seconds(name: str, raw: Any, default: float, most: float) -> float:
    """Return a wait in seconds, 0 to ``most``; a request never holds a thread longer."""
    if raw is None or raw == "":
        return default
    try:
        found = float(raw) if not isinstance(raw, bool) else -1.0
    except (TypeError, ValueError):
        found = -1.0
    if not 0 <= found <= most:
        raise errors.InvalidInput(f"{name!r} must be a number of seconds from 0 to {most:g}")
    return found


def _runs(call: Call) -> Any:
    page = call.console.reads.page(
        state=call.query.get("state") or None,
        workflow=call.query.get("workflow") or None,
        cursor=call.query.get("cursor") or None,
        limit=_int(call, "limit", 50),
        created_after=call.query.get("created_after") or None,
        created_before=call.query.get("created_before") or None,
        queue=call.query.get("queue") or None,
    )
    return page


def _get(call: Call) -> Any:
    return call.client.get(call.path["run_id"])


def _signal(call: Call) -> Any:
    return call.client.signal(
        call.path["run_id"],
        call.path["name"],
        call.body.get("payload"),
        signal_id=call.text("signal_id"),
    )


def _send(call: Call) -> Any:
    key = call.text("key")
    if not key:
        raise errors.InvalidInput("'key' is required")
    stored = call.client.send(
        call.path["run_id"], call.path["channel"], key, call.body.get("payload")
    )
    return {"stored": stored}


def _cancel(call: Call) -> Any:
    run_id = call.path["run_id"]
    took = call.client.cancel(run_id)
    info = call.client.get(run_id)
    if not took:
        raise errors.NotCanceled(f"cancel of run {run_id} took no effect: it is {info.state}")
    return {"canceled": took, "run": info}


def _resume(call: Call) -> Any:
    run_id = call.path["run_id"]
    resumed = call.client.resume(run_id)
    return {"resumed": resumed, "run": call.client.get(run_id)}


def _resolve(call: Call) -> Any:
    step = call.text("step")
    if not step:
        raise errors.InvalidInput("'step' is required")
    has_output, error = "output" in call.body, call.text("error")
    if has_output == (error is not None):
        raise errors.InvalidInput("resolve takes exactly one of 'output' or 'error'")
    note = call.text("note")
    if has_output:
        return call.client.resolve(call.path["run_id"], step, output=call.body["output"], note=note)
    return call.client.resolve(call.path["run_id"], step, error=error, note=note)


def _fork(call: Call) -> Any:
    live = call.body.get("live", False)
    if not isinstance(live, bool):
        raise errors.InvalidInput("'live' must be true or false")
    handle = call.client.fork(call.path["run_id"], call.text("from_step"), live=live)
    return {"run_id": handle.run_id}


def _queues(call: Call) -> Any:
    return [
        {
            "name": q.name,
            "concurrency": q.concurrency,
            "per_key": q.per_key,
            "rate": None
            if q.rate is None
            else {"n": q.rate.n, "per_seconds": q.rate.per.total_seconds()},
            "running": q.running,
            "waiting": q.waiting,
        }
        for q in queues.listing(call.client.store, call.client.app)
    ]


def _history(call: Call) -> Any:
    return call.client.history(call.path["run_id"])


def _journal(call: Call) -> Any:
    return call.console.reads.journal(call.path["run_id"])


def _waits(call: Call) -> Any:
    return call.client.waits(call.path["run_id"])


def _children(call: Call) -> Any:
    return call.client.children(call.path["run_id"])


UPDATE_WAIT, UPDATE_WAIT_MOST = 30.0, 300.0
EVENT_WAIT_MOST = 60.0


def _update(call: Call) -> Any:
    run_id, name = call.path["run_id"], call.path["name"]
    # Named here when the caller gives none, so that a caller who timed out
    # can retry with it and get the run's answer.
    update_id = call.text("update_id") or uuid.uuid4().hex
    timeout = _seconds("timeout", call.body.get("timeout"), UPDATE_WAIT, UPDATE_WAIT_MOST)
    payload = call.body.get("payload")
    app = call.console.app
    try:
        if app is not None:
            response = app.update(run_id, name, payload, update_id, timeout)
        else:
            response = call.client.update(run_id, name, payload, update_id, timeout)
    except errors.UpdateTimedOut as exc:
        exc.update_id = update_id  # type: ignore[attr-defined]
        raise
    return {"run_id": run_id, "name": name, "update_id": update_id, "response": response}


def _query(call: Call) -> Any:
    app = call.console.app
    if app is None:
        raise errors.InvalidInput(
            "queries are the workflows' code: serve the console with perdure console MODULE:APP"
        )
    run_id, name = call.path["run_id"], call.path["name"]
    return {"run_id": run_id, "query": name, "answer": app.query(run_id, name)}


def _events(call: Call) -> Any:
    return call.client.events(call.path["run_id"])


def _event(call: Call) -> Any:
    timeout = _seconds("timeout", call.query.get("timeout"), 0.0, EVENT_WAIT_MOST)
    key = call.path["key"]
    return {"key": key, "value": call.client.get_event(call.path["run_id"], key, timeout)}


def _stream(call: Call) -> Any:
    return call.console.reads.stream(
        call.path["run_id"],
        call.path["key"],
        after=_int(call, "after", 0),
        limit=_int(call, "limit", 100),
    )


RUN = "/runs/{run_id}"

ENDPOINTS: list[Endpoint] = [
    Endpoint("POST", "/runs", "operate", "Start a run (the same key returns the same run)",
             _start, 201, ("workflow", "args", "kwargs", "key", "version")),
    Endpoint("GET", "/runs", "read",
             "List runs, newest first: ?state=&workflow=&queue=&created_after=&created_before="
             "&cursor=&limit= (instants ISO-8601 or a time ago: 90m, 12h, 7d, 2w)",
             _runs, query=(("state", "string"), ("workflow", "string"), ("queue", "string"),
                           ("created_after", "string"), ("created_before", "string"),
                           ("cursor", "string"), ("limit", "integer"))),
    Endpoint("GET", RUN, "read", "One run (RunInfo)", _get),
    Endpoint("GET", "/queues", "read",
             "The app's queues: limits, running and waiting runs", _queues),
    Endpoint("POST", RUN + "/signals/{name}", "signal",
             "Signal a wait; idempotent by signal_id; a refusal is 409 with the receipt",
             _signal, 200, ("payload", "signal_id")),
    Endpoint("POST", RUN + "/channels/{channel}", "signal",
             "Send a channel message, deduplicated by key", _send, 200, ("key", "payload")),
    Endpoint("POST", RUN + "/cancel", "operate", "Cancel the run and its descendants", _cancel),
    Endpoint("POST", RUN + "/resume", "operate", "Re-queue a waiting run whose waits are settled",
             _resume),
    Endpoint("POST", RUN + "/resolve", "operate",
             "Settle the ambiguous step of a needs_attention run", _resolve, 200,
             ("step", "output", "error", "note")),
    Endpoint("POST", RUN + "/fork", "operate", "Start a new run reusing the journal", _fork, 201,
             ("from_step", "live")),
    Endpoint("GET", RUN + "/history", "read", "The provenance ledger, oldest first", _history),
    Endpoint("GET", RUN + "/journal", "read", "The journal, oldest first", _journal),
    Endpoint("GET", RUN + "/waits", "read", "The run's open waits", _waits),
    Endpoint("GET", RUN + "/children", "read", "Counts of child runs by state", _children),
    Endpoint("POST", RUN + "/updates/{name}", "operate",
             "Send an update and wait for the run's answer (timeout: seconds, default 30, "
             "at most 300); idempotent by update_id; 504 update_timeout carries the update_id "
             "to retry with", _update, 200, ("payload", "update_id", "timeout")),
    Endpoint("GET", RUN + "/queries/{name}", "read",
             "Answer a workflow's query from the run's journal (needs the app's code)", _query),
    Endpoint("GET", RUN + "/events", "read", "The run's events: the latest value of each key",
             _events),
    Endpoint("GET", RUN + "/events/{key}", "read",
             "One event's latest value; ?timeout= waits up to 60 s for it to be set "
             "(404 run_event_missing)", _event, query=(("timeout", "number"),)),
    Endpoint("GET", RUN + "/streams/{key}", "read",
             "A stream's items after the first ?after= (at most ?limit=, default 100); "
             "read on from next_after", _stream,
             query=(("after", "integer"), ("limit", "integer"))),
]  # fmt: skip


# -- serving ---------------------------------------------------------------------


async def _body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/json":
        raise errors.InvalidInput("send the body as Content-Type: application/json")
    if not raw.strip():
        return {}
    try:
        found = json.loads(raw)
    except ValueError as exc:
        raise errors.InvalidInput(f"the body is not valid JSON ({exc})") from None
    if not isinstance(found, dict):
        raise errors.InvalidInput("the body must be a JSON object")
    return found


def _serve(console: Console, endpoint: Endpoint) -> Callable[[Request], Any]:
    from starlette.concurrency import run_in_threadpool

    async def serve(request: Request) -> Response:
        try:
            caller = console.caller(request, cookie=False)
            auth.require(caller.scope, endpoint.need)
            body = await _body(request) if endpoint.method == "POST" else {}
            call = Call(console, dict(request.path_params), dict(request.query_params), body)
            result = await run_in_threadpool(endpoint.handler, call)
        except errors.PerdureError as exc:
            return _answer(exc)
        return JSONResponse(jsonable(result), status_code=endpoint.status)

    return serve


def openapi(console: Console) -> dict[str, Any]:
    """Return the OpenAPI document of the endpoints."""
    paths: dict[str, Any] = {}
    error = {"$ref": "#/components/schemas/Error"}
    for e in ENDPOINTS:
        params = [
            {"name": p, "in": "path", "required": True, "schema": {"type": "string"}}
            for p in ("run_id", "name", "channel", "key")
            if "{" + p + "}" in e.path
        ]
        params += [
            {"name": q, "in": "query", "required": False, "schema": {"type": t}} for q, t in e.query
        ]
        op: dict[str, Any] = {
            "summary": e.summary,
            "operationId": e.handler.__name__.strip("_"),
            "parameters": params,
            "security": [{"bearer": []}],
            "x-scope": e.need,
            "responses": {
                str(e.status): {"description": "done"},
                **{
                    str(s): {"description": d, "content": {"application/json": {"schema": error}}}
                    for s, d in ((400, "bad input"), (401, "no or bad token"),
                                 (403, "scope or app not allowed"), (404, "unknown"),
                                 (409, "refused"),
                                 *(((504, "no answer in time"),) if e.handler is _update
                                   else ()))
                },
            },
        }  # fmt: skip
        if e.method == "POST":
            op["requestBody"] = {
                "required": False,
                "content": {
                    "application/json": {
                        "schema": {
                            "type": "object",
                            "properties": {name: {} for name in e.body},
                        }
                    }
                },
            }
        paths.setdefault(e.path, {})[e.method.lower()] = op
    return {
        "openapi": "3.1.0",
        "info": {"title": f"perdure API ({console.name})", "version": "1"},
        "servers": [{"url": "/api/v1"}],
        "paths": paths,
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "Error": {
                    "type": "object",
                    "properties": {
                        "error": {
                            "type": "object",
                            "properties": {
                                "code": {"type": "string"},
                                "message": {"type": "string"},
                            },
                        },
                        "receipt": {"type": "object"},
                    },
                }
            },
        },
    }


def routes(console: Console) -> list[Route]:
    """Return the API's routes (to mount under ``/api/v1``)."""

    async def document(request: Request) -> Response:
        return JSONResponse(openapi(console))

    found = [Route("/openapi.json", document, methods=["GET"])]
    found += [Route(e.path, _serve(console, e), methods=[e.method]) for e in ENDPOINTS]
    return found
