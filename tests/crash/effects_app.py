"""The app the effect-window crash tests run in real worker processes.

Every workflow is ``prepare`` (idempotent), the step under test, ``confirm``
(idempotent). The step under test is ``pure_work``, ``idempotent_work``,
``once_work`` or the transactional ``book``. Configuration comes from the
environment, read when used (importing this module touches nothing):

* ``PERDURE_STORE``: the store URL.
* ``CRASH_EFFECTS_LOG``: a file every step body appends lines to, durably:
  ``enter <step> <idempotency key> <nonce>`` when the body starts,
  ``refused <step> ...`` when it raises ``EffectFailed`` and
  ``effect <step> <idempotency key> <nonce>`` once its effect is done. The
  nonce is fresh for every execution of a body and ends up in its output, so
  a test can tell which execution an outcome came from.
* ``EFFECT_CRASH_AT=<step>:<window>[:<attempt>]``: the failpoint; the worker
  process dies there with ``os._exit(137)``. Windows of a plain step:

  - ``before_start``: a ``once`` step dies inside ``begin_effect``, before the
    real call (nothing about the step is stored); another step dies right
    after ``prepare``'s outcome committed (the last write before the step).
  - ``started``: a ``once`` step dies right after ``begin_effect`` committed,
    before its body runs; another step dies in its body before its effect.
  - ``body_done``: inside ``finish_step`` of the step's outcome, before the
    real call (the effect is in the log, the outcome is not stored).
  - ``recorded``: inside ``finish_step``, right after the real call.

  Windows of ``book``: ``before_commit`` (inside ``transaction_step``, after
  the body's INSERT ran, before the transaction commits) and ``after_commit``
  (right after ``transaction_step`` returned). ``<attempt>`` narrows the
  ``once`` windows to one attempt of the step.
* ``EFFECT_REFUSE_FIRST=<step>``: the first body call of that step in this
  process raises ``perdure.EffectFailed`` (after logging ``enter``).
* ``EFFECT_LEASE_TTL``, ``EFFECT_HEARTBEAT``, ``EFFECT_POLL``: worker timing for ``serve()``.

``book`` inserts ``(n, nonce)`` into the table ``bookings``, which the test
creates in the store's database before starting any worker.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import sys
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import perdure
from perdure.store import open_store, port

app = perdure.App(name="effects")

EXIT_STATUS = 137
WORK = {"pure": "pure_work", "idempotent": "idempotent_work", "once": "once_work"}
_refused: set[str] = set()


def crash_at() -> tuple[str, str, int | None] | None:
    """Return the armed failpoint as (step, window, attempt or None)."""
    spec = os.environ.get("EFFECT_CRASH_AT")
    if not spec:
        return None
    step, window, *attempt = spec.split(":")
    return step, window, int(attempt[0]) if attempt else None


def die() -> None:
    """End the worker process at once: no clean-up, no flush, no goodbye to the store."""
    os._exit(EXIT_STATUS)


def record(event: str, step: str, key: str, nonce: str) -> None:
    """Append one line to the effects log, durably."""
    fd = os.open(os.environ["CRASH_EFFECTS_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{event} {step} {key} {nonce}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def _logged_step(name: str, effect: str, retry: perdure.Retry | None = None) -> Callable[..., str]:
    def body(n: int) -> str:
        key = perdure.idempotency_key()
        nonce = uuid.uuid4().hex[:12]
        record("enter", name, key, nonce)
        if os.environ.get("EFFECT_REFUSE_FIRST") == name and name not in _refused:
            _refused.add(name)
            record("refused", name, key, nonce)
            raise perdure.EffectFailed(f"{name}: the gateway said no, nothing happened")
        armed = crash_at()
        if effect != "once" and armed is not None and armed[:2] == (name, "started"):
            die()
        record("effect", name, key, nonce)
        return f"{name}:{n}:{nonce}"

    body.__name__ = body.__qualname__ = name
    body.__annotations__ = {"n": int, "return": str}
    decorated: Callable[..., str] = app.step(name=name, effect=effect, retry=retry)(body)  # type: ignore[call-overload]
    return decorated


prepare = _logged_step("prepare", "idempotent")
confirm = _logged_step("confirm", "idempotent")
pure_work = _logged_step("pure_work", "pure")
idempotent_work = _logged_step("idempotent_work", "idempotent")
once_work = _logged_step(
    "once_work", "once", perdure.Retry(max_attempts=2, initial_delay=0, jitter=False)
)


@app.transaction()
def book(conn: Any, n: int) -> str:
    """Insert a booking inside the transaction that journals this step."""
    nonce = uuid.uuid4().hex[:12]
    record("enter", "book", "-", nonce)
    marker = "?" if isinstance(conn, sqlite3.Connection) else "%s"
    conn.execute(f"INSERT INTO bookings (n, nonce) VALUES ({marker}, {marker})", (n, nonce))
    return f"book:{n}:{nonce}"


@app.workflow(version="1")
def pure_flow(ctx: perdure.Context, n: int) -> list[str]:
    return [prepare(n), pure_work(n), confirm(n)]


@app.workflow(version="1")
def idempotent_flow(ctx: perdure.Context, n: int) -> list[str]:
    return [prepare(n), idempotent_work(n), confirm(n)]


@app.workflow(version="1")
def once_flow(ctx: perdure.Context, n: int) -> list[str]:
    return [prepare(n), once_work(n), confirm(n)]


@app.workflow(version="1")
def tx_flow(ctx: perdure.Context, n: int) -> list[str]:
    return [prepare(n), book(n), confirm(n)]  # type: ignore[call-arg]  # conn is the engine's


class CrashingStore:
    """Delegate to the real store; die at the armed failpoint around a journal write."""

    def __init__(self, inner: port.Store) -> None:
        self._inner = inner
        self._armed = crash_at()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def _hits(self, window: str, entries: Sequence[port.JournalEntry], status: str) -> bool:
        if self._armed is None:
            return False
        step, armed_window, attempt = self._armed
        return armed_window == window and any(
            e.kind == "step"
            and e.name == step
            and e.status == status
            and (attempt is None or e.attempt == attempt)
            for e in entries
        )

    def _after_prepare(self, entries: Sequence[port.JournalEntry]) -> bool:
        """Whether this write recorded ``prepare`` while a non-once ``before_start`` is armed."""
        if self._armed is None or self._armed[1] != "before_start":
            return False
        if self._armed[0] == WORK["once"]:
            return False
        return any(e.name == "prepare" and e.status == "ok" for e in entries)

    def begin_effect(
        self,
        claim: port.Claim,
        entries: Sequence[port.JournalEntry],
        marks: Sequence[port.Mark] = (),
    ) -> None:
        if self._hits("before_start", entries, "started"):
            die()
        self._inner.begin_effect(claim, entries, marks)
        if self._hits("started", entries, "started"):
            die()

    def finish_step(
        self,
        claim: port.Claim,
        entries: Sequence[port.JournalEntry],
        marks: Sequence[port.Mark] = (),
    ) -> None:
        if self._hits("body_done", entries, "ok"):
            die()
        self._inner.finish_step(claim, entries, marks)
        if self._hits("recorded", entries, "ok") or self._after_prepare(entries):
            die()

    def transaction_step(
        self,
        claim: port.Claim,
        entries: Sequence[port.JournalEntry],
        body: Callable[[Any], port.JournalEntry],
        marks: Sequence[port.Mark] = (),
    ) -> port.JournalEntry:
        armed = self._armed

        def inside(conn: Any) -> port.JournalEntry:
            entry = body(conn)
            if armed is not None and armed[:2] == (entry.name, "before_commit"):
                die()  # the body's writes are in the open transaction, not committed
            return entry

        recorded = self._inner.transaction_step(claim, entries, inside, marks)
        if armed is not None and armed[:2] == (recorded.name, "after_commit"):
            die()
        return recorded


def serve() -> None:
    """Run a worker on the crashing store until SIGTERM (timing from the environment)."""
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(process)d %(threadName)s %(name)s %(levelname)s %(message)s",
    )
    store = CrashingStore(open_store(os.environ["PERDURE_STORE"]))
    worker = perdure.Worker(
        app,
        store,
        concurrency=1,
        lease_ttl=float(os.environ.get("EFFECT_LEASE_TTL", "2")),
        heartbeat=float(os.environ.get("EFFECT_HEARTBEAT", "0.5")),
        poll_interval=float(os.environ.get("EFFECT_POLL", "0.2")),
    )
    print(f"worker {worker.worker_id} serving", file=sys.stderr, flush=True)
    worker.run()
