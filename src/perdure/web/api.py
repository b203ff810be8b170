"""The HTTP API under ``/api/v1``: the client's calls, JSON in and out.

Each endpoint is one row of :data:`ENDPOINTS`: method, path, the scope it
needs, a summary and a handler that calls the client (never the store's SQL).
The routes and the OpenAPI document are both built from that table, so a new
call is one more row.

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
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from perdure import client as client_api
from perdure import errors, queues
from perdure.web import auth, openapi, tree
from perdure.web import schedules as web_schedules

if TYPE_CHECKING:
    from perdure.web.app import Console

_STATUS: list[tuple[type[errors.PerdureError], int]] = [
    (errors.Unauthorized, 401),
    (errors.Forbidden, 403),
    (errors.RunNotFound, 404),
    (errors.ScheduleNotFound, 404),
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
    (errors.ResultTimeout, 504),
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
    """Return the JSON body of an error.

    A refused signal adds the stored receipt under ``receipt``, an update
    without an answer its ``update_id``, a run that ended without a result
    its state and error under ``run``.
    """
    body: dict[str, Any] = {"error": {"code": exc.code, "message": exc.message}}
    found = getattr(exc, "receipt", None)
    if found is not None:
        body["receipt"] = jsonable(found)
    update_id = getattr(exc, "update_id", None)
    if isinstance(update_id, str):
        body["update_id"] = update_id
    if isinstance(exc, errors.RunFailed):
        body["run"] = {"run_id": exc.run_id, "state": exc.state, "error": jsonable(exc.error)}
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
    # Answers beyond the ones every call may give (400, 401, 403, 404, 409).
    responses: tuple[tuple[int, str], ...] = ()


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
    deadline = _deadline(call.body.get("deadline"))
    app = call.console.app
    if app is not None and app.plan_def(workflow) is not None and deadline is not None:
        raise errors.InvalidInput(f"plan {workflow!r}: a plan run takes no deadline")
    if app is not None and version is None:
        extra: dict[str, Any] = {}
        if deadline is not None:
            name = app.workflow_ref(workflow)[0]
            if "deadline" in app.workflows[name].params:
                raise errors.InvalidInput(
                    f"workflow {name} takes an argument named deadline; pass it in 'kwargs'"
                )
            extra["deadline"] = deadline
        handle = app.start(workflow, *args, key=key, **kwargs, **extra)
    elif version is None:
        raise errors.InvalidInput(
            "'version' is required when the console serves no code (perdure console --store)"
        )
    else:
        handle = call.client.start(workflow, version, args, kwargs, key=key, deadline=deadline)
    return {"run_id": handle.run_id, "created": handle.created}


def _deadline(raw: Any) -> timedelta | None:
    """Return a start's ``deadline`` (seconds from now), refusing anything else."""
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, int | float) or raw <= 0:
        raise errors.InvalidInput("'deadline' must be a positive number of seconds")
    return timedelta(seconds=raw)


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


def _suspend(call: Call) -> Any:
    run_id = call.path["run_id"]
    suspended = call.client.suspend(run_id)
    return {"suspended": suspended, "run": call.client.get(run_id)}


def _resume(call: Call) -> Any:
    run_id = call.path["run_id"]
    resumed = call.client.resume(run_id)
    return {"resumed": resumed, "run": call.client.get(run_id)}


def _resolve(call: Call) -> Any:
    # A plan run's task is named as "task"; the client tells the two kinds of run apart.
    step = call.text("step") or call.text("task")
    if not step:
        raise errors.InvalidInput("'step' (or a plan run's 'task') is required")
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


def _tasks(call: Call) -> Any:
    return call.client.tasks(call.path["run_id"])


def _children(call: Call) -> Any:
    return call.client.children(call.path["run_id"])


def _tree(call: Call) -> Any:
    run_id = call.path["run_id"]
    depth = tree.bounded("depth", call.query.get("depth"), tree.DEPTH, tree.DEPTH_MOST)
    width = tree.bounded("width", call.query.get("width"), tree.WIDTH, tree.WIDTH_MOST)
    limit = tree.bounded("limit", call.query.get("limit"), tree.LIMIT, tree.LIMIT_MOST)
    found = call.console.reads.tree(
        run_id,
        call.query.get("cursor") or None,
        page=limit,
        width=width,
        depth=depth,
        budget=tree.BUDGET,
    )
    info = call.client.get(run_id)
    return tree.document(info, found, depth=depth, width=width, limit=limit)


def _attempts(call: Call) -> Any:
    return call.client.attempts(call.path["run_id"])


def _timers(call: Call) -> Any:
    return call.client.timers(call.path["run_id"])


RESULT_WAIT_MOST = 60.0


def _result(call: Call) -> Any:
    run_id = call.path["run_id"]
    timeout = _seconds("timeout", call.query.get("timeout"), 0.0, RESULT_WAIT_MOST)
    value = call.client.result(run_id, timeout)
    return {"run_id": run_id, "state": "succeeded", "result": value}


def _limited(call: Call, found: list[Any]) -> Any:
    limit = _int(call, "limit", 100)
    if not 1 <= limit <= 1000:
        raise errors.InvalidInput(f"limit must be 1 to 1000, got {limit}")
    return {"items": found[:limit], "more": max(0, len(found) - limit)}


def _all_waits(call: Call) -> Any:
    return _limited(call, call.client.waits())


def _all_timers(call: Call) -> Any:
    return _limited(call, call.client.timers())


def _schedules(call: Call) -> Any:
    return web_schedules.listing(call.console)


def _schedule(call: Call) -> Any:
    return web_schedules.one(call.console, call.path["name"])


def _pause_schedule(call: Call) -> Any:
    return web_schedules.pause(call.console, call.path["name"], True)


def _resume_schedule(call: Call) -> Any:
    return web_schedules.pause(call.console, call.path["name"], False)


def _trigger_schedule(call: Call) -> Any:
    name = call.path["name"]
    run = web_schedules.trigger(call.console, name)
    return {"schedule": name, "run_id": run.run_id, "run": run}


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
             _start, 201, ("workflow", "args", "kwargs", "key", "version", "deadline")),
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
    Endpoint("POST", RUN + "/suspend", "operate",
             "Suspend the run (a running one at its next journal write); idempotent", _suspend),
    Endpoint("POST", RUN + "/resume", "operate",
             "Resume a suspended run, or re-queue a waiting run whose waits are settled", _resume),
    Endpoint("POST", RUN + "/resolve", "operate",
             "Settle the ambiguous step of a needs_attention run, or a plan run's task that "
             "needs attention (task and output)", _resolve, 200,
             ("step", "task", "output", "error", "note")),
    Endpoint("POST", RUN + "/fork", "operate", "Start a new run reusing the journal", _fork, 201,
             ("from_step", "live")),
    Endpoint("GET", RUN + "/history", "read", "The provenance ledger, oldest first", _history),
    Endpoint("GET", RUN + "/journal", "read", "The journal, oldest first", _journal),
    Endpoint("GET", RUN + "/waits", "read", "The run's open waits", _waits),
    Endpoint("GET", RUN + "/children", "read", "Counts of child runs by state", _children),
    Endpoint("GET", RUN + "/tasks", "read",
             "A plan run's tasks in declaration order (TaskInfo: name, state, attempt, output, "
             "error, blocked_by, worker, effect, parents, generation, recoveries, started_at, "
             "ended_at); empty for a workflow run", _tasks),
    Endpoint("POST", RUN + "/updates/{name}", "operate",
             "Send an update and wait for the run's answer (timeout: seconds, default 30, "
             "at most 300); idempotent by update_id; 504 update_timeout carries the update_id "
             "to retry with", _update, 200, ("payload", "update_id", "timeout"),
             responses=((504, "no answer in time"),)),
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
    Endpoint("GET", RUN + "/tree", "read",
             "The run's descendants as a nested tree (run_id, workflow, state, total, children), "
             "cut to ?depth= levels (default 3, at most 10), ?width= children below the first "
             "level (default 10, at most 100), ?limit= children of the run a page (default 50, "
             "at most 200, next page at ?cursor=) and 500 runs; a node with children left out "
             "has truncated: true and more: how many", _tree,
             query=(("depth", "integer"), ("width", "integer"), ("limit", "integer"),
                    ("cursor", "string"))),
    Endpoint("GET", RUN + "/attempts", "read",
             "The failed attempts of the run's steps, in journal order", _attempts),
    Endpoint("GET", RUN + "/timers", "read",
             "What only time will wake: the run's sleep, or its retry's backoff", _timers),
    Endpoint("GET", RUN + "/result", "read",
             "The run's result once it succeeded; ?timeout= waits up to 60 s for it to end "
             "(504 result_timeout); a run that ended otherwise is 409 run_failed with its state "
             "and error under run", _result, query=(("timeout", "number"),),
             responses=((504, "the run did not end in time"),)),
    Endpoint("GET", "/waits", "read",
             "The app's open waits, oldest first (?limit=, default 100, at most 1000; more: "
             "how many were left out)", _all_waits, query=(("limit", "integer"),)),
    Endpoint("GET", "/timers", "read",
             "The app's sleeps and retry backoffs, earliest first (?limit= as for /waits)",
             _all_timers, query=(("limit", "integer"),)),
    Endpoint("GET", "/schedules", "read",
             "The app's schedules by name: cron, tz, catch_up, paused, next_tick, last_tick, "
             "last_run_id", _schedules),
    Endpoint("GET", "/schedules/{name}", "read",
             "One schedule (404 schedule_not_found)", _schedule),
    Endpoint("POST", "/schedules/{name}/pause", "operate",
             "Stop starting the schedule's ticks, on every worker, until it is resumed",
             _pause_schedule),
    Endpoint("POST", "/schedules/{name}/resume", "operate",
             "Start the schedule's ticks again; ticks passed while paused are skipped",
             _resume_schedule),
    Endpoint("POST", "/schedules/{name}/trigger", "operate",
             "Start one run of the schedule now, with this instant as its tick (each call, "
             "a run): {schedule, run_id, run}", _trigger_schedule, 201),
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


def routes(console: Console) -> list[Route]:
    """Return the API's routes (to mount under ``/api/v1``)."""

    async def document(request: Request) -> Response:
        return JSONResponse(openapi.document(console.name, ENDPOINTS))

    found = [Route("/openapi.json", document, methods=["GET"])]
    found += [Route(e.path, _serve(console, e), methods=[e.method]) for e in ENDPOINTS]
    return found
