"""Time PostgreSQL store calls on their own: a delivery, a claim, a woken run's answer.

    PYTHONPATH=src bench/.venv/bin/python bench/store_calls.py [N]

A fresh database on 127.0.0.1:5432 is created and dropped after. ``deliver``
times ``deliver_update`` of N updates to one queued run (each a new id);
``claim`` starts N runs, then times N claims of one run each by a worker
that serves their workflow. Then one run is parked on an update 2N times,
and the update delivered: each park is timed, and what takes the woken run
up and answers it, alternating between the two ways a worker does it:
``claim_warm`` and then ``answer_ahead`` in turn, or ``claim_answering``
(both in one commit).
Prints the median and the tenth percentile of each, in microseconds.
Nothing else runs: no worker, no second process.
"""

from __future__ import annotations

import statistics
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg

import perdure
from perdure.store import liveport, port

SERVER = "postgresql://postgres@127.0.0.1:5432/postgres"


def _timed(call: Callable[[int], Any], n: int) -> str:
    took = []
    for i in range(n):
        started = time.perf_counter_ns()
        call(i)
        took.append((time.perf_counter_ns() - started) / 1e3)
    return _summary(took)


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    db = f"perdure_store_calls_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(SERVER, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {db}")
    try:
        app = perdure.App(SERVER.rsplit("/", 1)[0] + "/" + db, name="calls")

        @app.workflow(name="idle")
        def idle(ctx: perdure.Context) -> int:
            return 1

        store: Any = app.store
        target = app.start("idle").run_id
        live = liveport.require(store)
        deliver = _timed(
            lambda i: live.deliver_update(liveport.NewUpdate(target, f"u{i}", "ask", "1")), n
        )
        runs = [app.start("idle").run_id for _ in range(n)]
        run = store.get_run(runs[0])
        wanted = [(run.workflow, run.version)]
        claim = _timed(lambda i: store.claim("calls", "w-1", wanted, lease_ttl=30), n)
        answering = perdure.App(SERVER.rsplit("/", 1)[0] + "/" + db, name="answers")
        answering.workflow(name="idle")(idle)
        split, joined, park = _answers(store, answering.start("idle").run_id, wanted, n)
        answering.close()
        app.close()
        print(f"deliver_update  {deliver}")
        print(f"claim (1 run)   {claim}")
        print(f"claim_warm, then answer_ahead  {split}")
        print(f"claim_answering                {joined}")
        print(f"park (on one update)           {park}")
    finally:
        with psycopg.connect(SERVER, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")


def _answers(
    store: Any, run_id: str, wanted: list[tuple[str, str]], n: int
) -> tuple[str, str, str]:
    """Wake ``run_id`` by an update ``2 * n`` times; time its claim and answer, each way n times.

    Also returns the time of the park that precedes each wake.
    """
    [claimed] = store.claim("answers", "w-1", wanted, lease_ttl=30)
    assert claimed.claim.run_id == run_id
    claim = claimed.claim
    held: list[port.JournalEntry] = []
    took: dict[bool, list[float]] = {False: [], True: []}
    parks: list[float] = []
    for i in range(2 * n):
        wait = port.JournalEntry(len(held) + 1, "update", f"ask#{i}", "started")
        started = time.perf_counter_ns()
        assert store.park(
            claim, [wait], [port.WaitSpec("ask", "update", after_sequence=i)], wake_at=None
        )
        parks.append((time.perf_counter_ns() - started) / 1e3)
        held.append(wait)
        store.deliver_update(liveport.NewUpdate(run_id, f"a{i}", "ask", "1"))
        done = port.JournalEntry(wait.position, "update", wait.name, "ok", "1")
        answer = port.JournalEntry(wait.position + 1, "respond", wait.name, "ok", "2")
        known = port.KnownJournal(claim.generation, tuple(held), frozenset(), (("ask", i),))
        joined = i % 2 == 1
        started = time.perf_counter_ns()
        if joined:
            found, wrote = store.claim_answering(
                "answers",
                "w-1",
                wanted,
                run_id=run_id,
                known=known,
                lease_ttl=30,
                dry_run=False,
                entries=[done, answer],
                update_id=f"a{i}",
                response="2",
            )
        else:
            found = store.claim_warm(
                "answers", "w-1", wanted, run_id=run_id, known=known, lease_ttl=30
            )
            wrote = found is not None and store.answer_ahead(
                found.claim, [done, answer], f"a{i}", "2"
            )
        took[joined].append((time.perf_counter_ns() - started) / 1e3)
        assert found is not None and wrote
        claim = found.claim
        held[-1:] = [done, answer]
    return _summary(took[False]), _summary(took[True]), _summary(parks)


def _summary(took: list[float]) -> str:
    took.sort()
    return f"median {statistics.median(took):.0f} us, p10 {took[len(took) // 10]:.0f} us"


if __name__ == "__main__":
    main()
