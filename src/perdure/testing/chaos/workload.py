"""The soak's app and its worker process: steps, a ``once`` effect, a sleep, a signal, a child.

A worker process (``python -m perdure.testing.chaos.workload``) is a real
:class:`~perdure.worker.Worker` with its lease keeper, on a store wrapped so
that it writes *side records* outside perdure, each one ``O_APPEND`` line:

* ``events.jsonl`` (:class:`~perdure.testing.chaos.scenario.Event`): a step's
  effect, and a step's outcome the moment its write committed, read by
  :mod:`~perdure.testing.chaos.checks`;
* ``timeline.jsonl``: ``{"t", "who", "kind", "run"}`` for each claim (kind
  ``claim``), each step body starting (``step``), each run let go (``let_go``:
  parked, finished or released) and each store call slower than the bound
  (``slow``, with ``seconds``). The soak reads recovery times from it.

Configuration comes from the environment: ``PERDURE_STORE`` (the URL the
worker uses), ``PERDURE_CHAOS_EVENTS``, ``PERDURE_CHAOS_TIMELINE``,
``PERDURE_CHAOS_PHASE`` (the worker's name in the records) and
``PERDURE_SOAK_LEASE`` / ``PERDURE_SOAK_HEARTBEAT`` / ``PERDURE_SOAK_SLOW``.
A run started with ``broken=True`` does its ``charge`` effect in a step that
retries after it, so the effect happens twice: a soak that must report it.
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from perdure import app as app_api
from perdure import context, effects, steps
from perdure.store import open_store, port
from perdure.testing import faults
from perdure.testing.chaos.scenario import EVENTS_ENV, PHASE_ENV, Event, append, effect

TIMELINE_ENV = "PERDURE_CHAOS_TIMELINE"
WAIT_NAME = "go"

app = app_api.App(name="chaos_soak")


def note(kind: str, run: str, **extra: Any) -> None:
    """Append one timeline line (a no-op outside a soak)."""
    path = os.environ.get(TIMELINE_ENV)
    if not path:
        return
    line = json.dumps(
        {"t": time.time(), "who": os.environ.get(PHASE_ENV, ""), "kind": kind, "run": run, **extra}
    )
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def _body(label: str, n: int, *, once: bool = False) -> str:
    key = steps.idempotency_key()
    note("step", key.split("/", 1)[0])
    # Long enough that a kill often lands inside a step, short enough for many runs.
    time.sleep(0.02 + (n * 7919 % 13) / 100)
    effect(label, once=once)
    return f"{label}:{n}"


@app.step()
def prepare(n: int) -> str:
    return _body("prepare", n)


@app.step(effect="once", retry=effects.Retry(max_attempts=1))
def charge(n: int) -> str:
    return _body("charge", n, once=True)


@app.step(retry=effects.Retry(max_attempts=3, initial_delay=0.05, jitter=False))
def charge_twice(n: int) -> str:
    """The broken form: a ``once`` effect inside a step that retries after doing it."""
    label = _body("charge", n, once=True)
    path = os.environ.get(EVENTS_ENV, "")
    key = steps.idempotency_key()
    with open(path, encoding="utf-8") as handle:
        done = sum(1 for line in handle if key in line and '"effect"' in line)
    if done < 2:
        raise RuntimeError("the gateway timed out after charging")
    return label


@app.step()
def apply_signal(n: int, payload: str) -> str:
    return _body(f"apply:{payload}", n)


@app.step()
def leaf_work(n: int) -> str:
    return _body("leaf", n)


@app.step()
def settle(n: int) -> str:
    return _body("settle", n)


@app.workflow(version="1")
def leaf(ctx: context.Context, n: int) -> str:
    return leaf_work(n)


@app.workflow(version="1")
def job(ctx: context.Context, n: int, broken: bool = False) -> list[str]:
    """Run ``n``: steps and a once effect; even runs wait for a signal, every third a child."""
    done = [prepare(n), charge_twice(n) if broken else charge(n)]
    if n % 2 == 0:
        done.append(apply_signal(n, str(ctx.wait(WAIT_NAME))))
    ctx.sleep(0.2 + (n % 5) / 10)
    if n % 3 == 0:
        done.append(ctx.start_child(leaf, n).result())
    done.append(settle(n))
    return done


# -- the worker process -------------------------------------------------------------------


class Timed:
    """A store wrapper that notes every call slower than ``bound`` seconds in the timeline."""

    def __init__(self, inner: Any, bound: float) -> None:
        self._inner = inner
        self._bound = bound

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._inner, name)
        if not callable(found) or name.startswith("_") or inspect.iscoroutinefunction(found):
            return found

        def call(*args: Any, **kwargs: Any) -> Any:
            began = time.monotonic()
            try:
                return found(*args, **kwargs)
            finally:
                took = time.monotonic() - began
                # wait_ready blocks by design; it is bounded by its own timeout.
                if took > self._bound and name != "wait_ready":
                    note("slow", "", call=name, seconds=round(took, 3))

        return call


def recording(store: port.Store, events: str, who: str) -> faults.FaultyStore:
    """Wrap ``store`` so that claims, outcomes and let-gos are side records as they commit."""
    wrapped = faults.FaultyStore(store)

    def recorded(run_id: str, name: str) -> None:
        append(events, Event(who, "recorded", f"{run_id}/{name}"))

    def written(_result: Any, claim: port.Claim, entries: Any, *args: Any, **kw: Any) -> None:
        for entry in entries:
            if entry.kind == "step" and entry.status in ("ok", "error"):
                recorded(claim.run_id, entry.name)

    def transacted(result: port.JournalEntry, claim: port.Claim, *args: Any, **kw: Any) -> None:
        recorded(claim.run_id, result.name)

    def claimed(result: list[port.Claimed], *args: Any, **kw: Any) -> None:
        for fresh in result:
            note("claim", fresh.claim.run_id)

    def let_go(operation: str) -> Callable[..., None]:
        def hook(_result: Any, claim: port.Claim, *args: Any, **kw: Any) -> None:
            note("let_go", claim.run_id, how=operation)

        return hook

    for operation in ("begin_effect", "finish_step", "park", "finish"):
        wrapped.after(operation, written, times=None)
    wrapped.after("transaction_step", transacted, times=None)
    wrapped.after("claim", claimed, times=None)
    for operation in ("park", "finish", "release"):
        wrapped.after(operation, let_go(operation), times=None)
    return wrapped


def serve() -> None:
    """Serve ``chaos_soak`` runs until SIGTERM or SIGKILL."""
    logging.basicConfig(
        level=logging.WARNING,
        stream=sys.stderr,
        format="%(asctime)s %(process)d %(threadName)s %(name)s %(levelname)s %(message)s",
    )
    url = os.environ["PERDURE_STORE"]
    who = os.environ.get(PHASE_ENV, "worker")
    slow = float(os.environ.get("PERDURE_SOAK_SLOW", "30"))
    store = recording(Timed(open_store(url, migrate=False), slow), os.environ[EVENTS_ENV], who)
    with app.using(store):
        worker = app.worker(
            concurrency=2,
            lease_ttl=float(os.environ.get("PERDURE_SOAK_LEASE", "1")),
            heartbeat=float(os.environ.get("PERDURE_SOAK_HEARTBEAT", "0.3")),
            poll_interval=0.1,
            sweep_interval=1.0,
            grace=2.0,
            store_url=url,
        )
        print(f"{who}: worker {worker.worker_id} pid {os.getpid()} serving", file=sys.stderr)
        worker.run()


if __name__ == "__main__":
    serve()
