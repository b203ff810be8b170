"""The console's pages: runs, one run, schedules, the operator's actions, login.

Pages are rendered on the server with Jinja2 (autoescaping on, so a
workflow name or payload holding ``<script>`` shows as text); a little plain
JavaScript asks for confirmation before an action and refreshes a live run.
Every action is a POST carrying the anti-forgery field ``csrf``, and shows
the engine's answer: a receipt, or a refusal with its code.
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from perdure import errors, queues, records, schedules
from perdure.store import port
from perdure.web import api, auth, graph
from perdure.web import schedules as web_schedules

if TYPE_CHECKING:
    from perdure.web.app import Caller, Console

_env = Environment(
    loader=PackageLoader("perdure.web", "templates"),
    autoescape=select_autoescape(default=True, default_for_string=True),
)
_env.filters["pretty"] = lambda value: json.dumps(api.jsonable(value), indent=2, sort_keys=True)
_env.filters["compact"] = lambda value: json.dumps(
    api.jsonable(value), sort_keys=True, ensure_ascii=False
)
_env.filters["when"] = lambda value: value.strftime("%Y-%m-%d %H:%M:%S") if value else ""

LIVE = frozenset({"queued", "running", "waiting", "suspended"})
TASK_STATES = (
    "succeeded",
    "running",
    "pending",
    "failed",
    "needs_attention",
    "blocked",
    "canceled",
)
ACTIONS = ("signal", "send", "update", "cancel", "suspend", "resume", "resolve", "fork")
SCHEDULE_ACTIONS = ("pause", "resume", "trigger")

UPDATE_WAIT = 10.0
"""How long the update form waits for the run's answer before it shows the update id."""


def _render(
    request: Request, console: Console, name: str, status: int = 200, **values: Any
) -> HTMLResponse:
    page = _env.get_template(name).render(
        app=console.name,
        csrf=console.form_key(request),
        open_mode=console.is_open(),
        states=port.RUN_STATES,
        here=request.url.path,
        **values,
    )
    return HTMLResponse(page, status_code=status)


def _refused(request: Request, console: Console, exc: errors.PerdureError) -> Response:
    status = api.status_of(exc)
    if status == 401 and request.method == "GET":
        return RedirectResponse("/login?" + urlencode({"next": request.url.path}), 303)
    return _render(request, console, "error.html", status, error=exc)


def _durations(history: list[records.Provenance]) -> dict[str, float]:
    """Return each step's duration in seconds, from the ledger's first start to its end."""
    began: dict[str, datetime] = {}
    took: dict[str, float] = {}
    for receipt in history:
        if receipt.step is None:
            continue
        if receipt.kind in ("step_started", "effect_started"):
            began.setdefault(receipt.step, receipt.at)
        elif receipt.kind in ("step_completed", "step_failed") and receipt.step in began:
            seconds = (receipt.at - began[receipt.step]).total_seconds()
            # A step that is not a once effect has its start and end written
            # together, at one instant: its duration is not known, not zero.
            if seconds > 0:
                took[receipt.step] = seconds
    return took


def _duration(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:.1f} ms"
    if seconds < 120:
        return f"{seconds:.2f} s"
    return f"{seconds / 60:.1f} min"


_env.filters["duration"] = _duration


def _local(value: datetime | None, tz: str) -> str:
    """Return an instant's wall-clock time in the schedule's zone (``06:00 CET``)."""
    if value is None:
        return ""
    try:
        where = schedules.zone(tz)
    except errors.InvalidInput:
        return ""
    return value.astimezone(where).strftime("%a %H:%M %Z")


def _until(value: datetime | None, now: datetime) -> str:
    """Return how far an instant is from ``now``: ``in 2 h 5 min``, ``3 min ago``."""
    if value is None:
        return ""
    seconds = (value - now).total_seconds()
    left = abs(seconds)
    if left < 60:
        text = f"{int(left)} s"
    elif left < 3600:
        text = f"{int(left // 60)} min"
    elif left < 48 * 3600:
        hours, minutes = divmod(int(left // 60), 60)
        text = f"{hours} h {minutes} min" if minutes else f"{hours} h"
    else:
        text = f"{left / 86400:.0f} days"
    return f"in {text}" if seconds >= 0 else f"{text} ago"


_env.filters["local"] = _local
_env.filters["until"] = _until


def _once_steps(history: list[records.Provenance], journal: list[records.JournalItem]) -> set[str]:
    """Return the steps known to be ``once`` effects: the ledger saw their effect start."""
    found = {r.step for r in history if r.kind == "effect_started" and r.step}
    return found | {e.name for e in journal if e.kind == "step" and e.status == "started"}


def _run_view(console: Console, run_id: str, children: str | None = None) -> dict[str, Any]:
    client = console.client
    info = client.get(run_id)
    history = client.history(run_id)
    waits = client.waits(run_id) if info.state == "waiting" else []
    entries = console.reads.journal(run_id)
    # A plan declares at least one task: an empty list is a workflow run.
    tasks = client.tasks(run_id)
    return {
        "run": info,
        "inputs": console.reads.inputs(run_id),
        "journal": entries,
        "once": _once_steps(history, entries),
        "history": history,
        "durations": _durations(history),
        "waits": waits,
        "tree": console.reads.tree(run_id, children),
        "outside": console.reads.live(run_id),
        "live": info.state in LIVE,
        "tasks": tasks,
        "graph": graph.layout(tasks) if tasks else None,
        "task_counts": {s: n for s in TASK_STATES if (n := sum(t.state == s for t in tasks))},
        "attention": next((t.name for t in tasks if t.state == "needs_attention"), ""),
    }


def _parse_json(text: str, what: str) -> Any:
    if not text.strip():
        return None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise errors.InvalidInput(f"the {what} is not valid JSON ({exc})") from None


def _act(console: Console, caller: Caller, run_id: str, action: str, form: Any) -> Any:
    """Run one action through the client; return the engine's answer."""
    client = console.client

    def field(name: str) -> str:
        return str(form.get(name) or "")

    need: auth.Need = "signal" if action in ("signal", "send") else "operate"
    auth.require(caller.scope, need)
    if action == "signal":
        name = field("name").strip()
        return client.signal(
            run_id,
            name,
            _parse_json(field("payload"), "payload"),
            signal_id=field("signal_id").strip() or None,
        )
    if action == "send":
        stored = client.send(
            run_id,
            field("channel").strip(),
            field("key").strip(),
            _parse_json(field("payload"), "payload"),
        )
        return {"stored": stored}
    if action == "update":
        name, update_id = field("name").strip(), field("update_id").strip() or uuid.uuid4().hex
        payload = _parse_json(field("payload"), "payload")
        send = console.app.update if console.app is not None else client.update
        try:
            response = send(run_id, name, payload, update_id, UPDATE_WAIT)
        except errors.UpdateTimedOut as exc:
            exc.update_id = update_id  # type: ignore[attr-defined]
            raise
        return {"update_id": update_id, "response": response}
    if action == "cancel":
        took = client.cancel(run_id)
        if not took:
            state = client.get(run_id).state
            raise errors.NotCanceled(f"cancel of run {run_id} took no effect: it is {state}")
        return {"canceled": True, "state": client.get(run_id).state}
    if action == "suspend":
        return {"suspended": client.suspend(run_id), "state": client.get(run_id).state}
    if action == "resume":
        return {"resumed": client.resume(run_id), "state": client.get(run_id).state}
    if action == "resolve":
        step, note = field("step").strip(), field("note").strip() or None
        if field("outcome") == "error":
            info = client.resolve(
                run_id, step, error=field("error") or "resolved as failed", note=note
            )
        else:
            output = _parse_json(field("output"), "output")
            info = client.resolve(run_id, step, output=output, note=note)
        return {"state": info.state}
    if action == "fork":
        handle = client.fork(run_id, field("from_step").strip() or None, live=field("live") == "on")
        return {"forked": handle.run_id}
    raise errors.InvalidInput(f"unknown action {action!r}")


def _schedules_view(console: Console) -> dict[str, Any]:
    found = web_schedules.listing(console)
    return {
        "schedules": found,
        "last_runs": web_schedules.last_runs(console, found),
        "now": web_schedules.now(console),
        "from_code": console.app is not None,
    }


def _act_on_schedule(console: Console, caller: Caller, name: str, action: str) -> Any:
    """Pause, resume or trigger the schedule ``name``; return the engine's answer."""
    auth.require(caller.scope, "operate")
    if action == "trigger":
        run = web_schedules.trigger(console, name)
        return {"schedule": name, "run_id": run.run_id, "state": run.state}
    info = web_schedules.pause(console, name, action == "pause")
    return {"schedule": name, "paused": info.paused, "next_tick": info.next_tick}


def routes(console: Console) -> list[Route]:
    """Return the console's page routes."""

    async def home(request: Request) -> Response:
        return RedirectResponse("/runs", 303)

    async def login_form(request: Request) -> Response:
        return _render(request, console, "login.html", next=request.query_params.get("next", ""))

    async def login(request: Request) -> Response:
        form = await request.form()
        presented = str(form.get("token") or "")
        target = str(form.get("next") or "/runs")
        if not target.startswith("/") or target.startswith("//"):
            target = "/runs"
        try:
            await run_in_threadpool(console.check_token, presented)
        except errors.PerdureError as exc:
            return _render(
                request, console, "login.html", api.status_of(exc), error=exc, next=target
            )
        response = RedirectResponse(target, 303)
        response.set_cookie(
            "perdure_session",
            presented.strip(),
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
            path="/",
        )
        return response

    async def logout(request: Request) -> Response:
        response = RedirectResponse("/login", 303)
        response.delete_cookie("perdure_session", path="/")
        return response

    async def runs(request: Request) -> Response:
        q = request.query_params
        filters = {
            k: (q.get(k) or "").strip()
            for k in ("state", "workflow", "queue", "created_after", "created_before")
        }
        kept = {k: v for k, v in filters.items() if v}
        refusal: errors.PerdureError | None = None
        page = records.RunPage([], None)
        try:
            caller = console.caller(request, cookie=True)
            auth.require(caller.scope, "read")
            search = (q.get("q") or "").strip()
            if search:
                found = await run_in_threadpool(console.reads.find, search)
                if found is not None:
                    return RedirectResponse(f"/runs/{found.run_id}", 303)
            try:
                page = await run_in_threadpool(
                    console.reads.page,
                    kept.get("state"),
                    kept.get("workflow"),
                    q.get("cursor") or None,
                    50,
                    kept.get("created_after"),
                    kept.get("created_before"),
                    kept.get("queue"),
                )
            except errors.InvalidInput as exc:
                # A bad filter is shown above the form, which keeps what was typed.
                refusal = exc
        except errors.PerdureError as exc:
            return _refused(request, console, exc)
        next_url = None
        if page.next_cursor:
            next_url = "/runs?" + urlencode({**kept, "cursor": page.next_cursor})
        return _render(
            request,
            console,
            "runs.html",
            200 if refusal is None else api.status_of(refusal),
            caller=caller,
            page=page,
            filters=filters,
            filtered=bool(kept),
            state=filters["state"],
            workflow=filters["workflow"],
            queue=filters["queue"],
            search=search,
            missing=bool(search),
            refusal=refusal,
            next_url=next_url,
            first_url="/runs?" + urlencode(kept),
            paged=bool(q.get("cursor")),
        )

    async def run_page(request: Request) -> Response:
        run_id = request.path_params["run_id"]
        try:
            caller = console.caller(request, cookie=True)
            auth.require(caller.scope, "read")
            children = request.query_params.get("children") or None
            view = await run_in_threadpool(_run_view, console, run_id, children)
        except errors.PerdureError as exc:
            return _refused(request, console, exc)
        return _render(
            request,
            console,
            "run.html",
            caller=caller,
            action=None,
            answer=None,
            refusal=None,
            **view,
        )

    async def queues_page(request: Request) -> Response:
        try:
            caller = console.caller(request, cookie=True)
            auth.require(caller.scope, "read")
            found = await run_in_threadpool(
                queues.listing, console.client.store, console.client.app
            )
        except errors.PerdureError as exc:
            return _refused(request, console, exc)
        return _render(request, console, "queues.html", caller=caller, queues=found)

    async def action(request: Request) -> Response:
        run_id, name = request.path_params["run_id"], request.path_params["action"]
        form = await request.form()
        answer: Any = None
        refusal: errors.PerdureError | None = None
        try:
            caller = console.caller(request, cookie=True)
            if caller.via != "bearer":
                console.check_form_key(request, str(form.get("csrf") or ""))
            if name not in ACTIONS:
                raise errors.InvalidInput(f"unknown action {name!r}")
            answer = await run_in_threadpool(_act, console, caller, run_id, name, form)
        except (errors.Unauthorized, errors.Forbidden) as exc:
            return _refused(request, console, exc)
        except errors.PerdureError as exc:
            refusal = exc
        try:
            view = await run_in_threadpool(_run_view, console, run_id)
        except errors.PerdureError as exc:
            return _refused(request, console, refusal or exc)
        status = 200 if refusal is None else api.status_of(refusal)
        return _render(
            request,
            console,
            "run.html",
            status,
            caller=caller,
            action=name,
            answer=None if answer is None else api.jsonable(answer),
            refusal=None if refusal is None else api.error_body(refusal),
            **view,
        )

    async def schedules_page(request: Request) -> Response:
        try:
            caller = console.caller(request, cookie=True)
            auth.require(caller.scope, "read")
            view = await run_in_threadpool(_schedules_view, console)
        except errors.PerdureError as exc:
            return _refused(request, console, exc)
        return _render(
            request,
            console,
            "schedules.html",
            caller=caller,
            can_operate=auth.allows(caller.scope, "operate"),
            action=None,
            target=None,
            answer=None,
            refusal=None,
            **view,
        )

    async def schedule_action(request: Request) -> Response:
        name, action = request.path_params["name"], request.path_params["action"]
        form = await request.form()
        answer: Any = None
        refusal: errors.PerdureError | None = None
        try:
            caller = console.caller(request, cookie=True)
            if caller.via != "bearer":
                console.check_form_key(request, str(form.get("csrf") or ""))
            if action not in SCHEDULE_ACTIONS:
                raise errors.InvalidInput(f"unknown action {action!r}")
            answer = await run_in_threadpool(_act_on_schedule, console, caller, name, action)
        except (errors.Unauthorized, errors.Forbidden) as exc:
            return _refused(request, console, exc)
        except errors.PerdureError as exc:
            refusal = exc
        try:
            view = await run_in_threadpool(_schedules_view, console)
        except errors.PerdureError as exc:
            return _refused(request, console, refusal or exc)
        return _render(
            request,
            console,
            "schedules.html",
            200 if refusal is None else api.status_of(refusal),
            caller=caller,
            can_operate=auth.allows(caller.scope, "operate"),
            action=action,
            target=name,
            answer=None if answer is None else api.jsonable(answer),
            refusal=None if refusal is None else api.error_body(refusal),
            **view,
        )

    return [
        Route("/", home, methods=["GET"]),
        Route("/login", login_form, methods=["GET"]),
        Route("/login", login, methods=["POST"]),
        Route("/logout", logout, methods=["POST"]),
        Route("/runs", runs, methods=["GET"]),
        Route("/queues", queues_page, methods=["GET"]),
        Route("/runs/{run_id}", run_page, methods=["GET"]),
        Route("/runs/{run_id}/actions/{action}", action, methods=["POST"]),
        Route("/schedules", schedules_page, methods=["GET"]),
        Route("/schedules/{name}/actions/{action}", schedule_action, methods=["POST"]),
    ]
