"""DBOS Transact's side of the benchmark: W1, W2, W3 and W5 (the rest is perdure-only).

Same shapes as perdure_workloads.py: ``python bench/dbos_workloads.py W1`` runs
one workload once against the fresh database named by BENCH_DB;
``python bench/dbos_workloads.py worker MODE`` is a DBOS process that a
workload drives over stdin/stdout.

Durability on SQLite: before DBOS first opens the file it is switched to WAL
(``PRAGMA journal_mode=WAL`` is persistent), and a SQLAlchemy ``connect``
listener registered on every Engine runs ``PRAGMA journal_mode=WAL`` and
``PRAGMA synchronous=FULL`` on each new DBAPI connection DBOS opens. The
workload reads both back through DBOS's own engine and reports them.
PostgreSQL runs at the server's defaults for both engines.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common
import sqlalchemy as sa
from dbos import DBOS, DBOSClient, DBOSConfig
from sqlalchemy import event

QUICK = os.environ.get("BENCH_QUICK") == "1"
QUEUE = "bench"


@event.listens_for(sa.engine.Engine, "connect")
def _sqlite_durability(dbapi_conn: Any, _record: Any) -> None:
    if type(dbapi_conn).__module__.startswith("sqlite3"):
        dbapi_conn.execute("PRAGMA journal_mode=WAL")
        dbapi_conn.execute("PRAGMA synchronous=FULL")


# -- the workflows --------------------------------------------------------------


@DBOS.step()
def noop(i: int) -> int:
    return i


@DBOS.step()
def stamp(i: int) -> int:
    return time.time_ns()


@DBOS.workflow()
def ten_steps(n: int) -> int:
    for i in range(n):
        noop(i)
    return n


@DBOS.workflow()
def zero_steps() -> int:
    return 0


@DBOS.workflow()
def signals(n: int) -> list[int]:
    stamps = []
    for i in range(n):
        DBOS.set_event(f"at{i}", i)  # lets the signaler see that recv is next
        DBOS.recv(f"s{i}", timeout_seconds=120)
        stamps.append(stamp(i))
    return stamps


def config(db: common.Database) -> DBOSConfig:
    return {"name": "bench", "system_database_url": db.dbos_url, "log_level": "WARNING"}


def prepare(db: common.Database) -> None:
    if db.kind == "sqlite":
        common.sqlite_wal_full(db.path)


def launch(db: common.Database, *, listen: list[str] | None = None) -> None:
    prepare(db)
    DBOS(config=config(db))
    if listen is not None:
        DBOS.listen_queues(listen)
    DBOS.launch()


def durability(db: common.Database) -> dict[str, Any]:
    """Read the settings back through DBOS's own system-database engine."""
    from dbos._dbos import _get_dbos_instance

    engine = _get_dbos_instance()._sys_db.engine
    with engine.connect() as c:
        if db.kind == "sqlite":
            return {"journal_mode": c.exec_driver_sql("PRAGMA journal_mode").scalar(),
                    "synchronous": c.exec_driver_sql("PRAGMA synchronous").scalar()}
        return {k: c.exec_driver_sql(f"SHOW {k}").scalar()
                for k in ("fsync", "synchronous_commit")}


class Peek:
    """Direct SQL reads of DBOS's workflow_status table."""

    def __init__(self, db: common.Database) -> None:
        self.db = db
        self.conn = db.raw_connect()
        self.table = "workflow_status" if db.kind == "sqlite" else "dbos.workflow_status"
        self.events = "workflow_events" if db.kind == "sqlite" else "dbos.workflow_events"
        self.mark = "?" if db.kind == "sqlite" else "%s"

    def states(self, name: str) -> dict[str, int]:
        rows = self.conn.execute(
            f"SELECT status, count(*) FROM {self.table} WHERE name LIKE {self.mark} "
            f"GROUP BY status", (f"%{name}",)).fetchall()
        return {s: int(n) for s, n in rows}

    def wait_success(self, name: str, count: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            found = self.states(name)
            if found.get("SUCCESS", 0) >= count:
                return
            if found.get("ERROR", 0) or found.get("MAX_RECOVERY_ATTEMPTS_EXCEEDED", 0):
                raise RuntimeError(f"workflows failed: {found}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"waited {timeout}s for {count} {name}; have {found}")
            time.sleep(0.1)

    def last_update_s(self, name: str) -> float:
        (ms,) = self.conn.execute(
            f"SELECT max(updated_at) FROM {self.table} WHERE name LIKE {self.mark}",
            (f"%{name}",)).fetchone()
        return int(ms) / 1e3

    def spans_s(self, ids: list[str]) -> list[float]:
        out = []
        for wid in ids:
            c, u = self.conn.execute(
                f"SELECT created_at, updated_at FROM {self.table} WHERE workflow_uuid = "
                f"{self.mark}", (wid,)).fetchone()
            out.append((int(u) - int(c)) / 1e3)
        return out

    def has_event(self, wid: str, key: str) -> bool:
        row = self.conn.execute(
            f"SELECT 1 FROM {self.events} WHERE workflow_uuid = {self.mark} AND key = {self.mark}",
            (wid, key)).fetchone()
        return row is not None

    def close(self) -> None:
        self.conn.close()


# -- the worker process -----------------------------------------------------------


def worker_main(mode: str) -> None:
    db = common.database_from_env()
    prepare(db)
    DBOS(config=config(db))
    common.say({"event": "ready", "pid": os.getpid()})
    if common.read_command().get("cmd") != "go":
        return
    started = time.time_ns()
    DBOS.launch()  # dequeues from every queue (the default)
    msg: dict[str, Any] = {"event": "started", "t_ns": started, "durability": durability(db)}
    if mode == "signals":
        n = int(os.environ["BENCH_SIGNALS"])
        msg["workflow_id"] = DBOS.start_workflow(signals, n).get_workflow_id()
    common.say(msg)
    common.read_command()
    DBOS.destroy()
    common.say({"event": "stopped"})


def spawn_worker(mode: str, env: dict[str, str] | None = None) -> common.Child:
    return common.Child([common.python(), os.path.abspath(__file__), "worker", mode], env=env)


# -- W1 / W2 -------------------------------------------------------------------------


def _sequential(db: common.Database, wf: Any, args: tuple, count: int,
                warmup: int = 5) -> dict[str, Any]:
    launch(db)
    settings = durability(db)
    before = common.floor_probe(db)
    for _ in range(warmup):
        DBOS.start_workflow(wf, *args).get_result()
    latencies, ids = [], []
    t0 = time.perf_counter()
    for _ in range(count):
        s = time.perf_counter()
        handle = DBOS.start_workflow(wf, *args)
        handle.get_result()
        latencies.append(time.perf_counter() - s)
        ids.append(handle.get_workflow_id())
    elapsed = time.perf_counter() - t0
    DBOS.destroy()
    floor = (before + common.floor_probe(db)) / 2
    peek = Peek(db)
    inside = peek.spans_s(ids)
    peek.close()
    return {"elapsed": elapsed, "latencies": latencies, "inside": inside, "settings": settings,
            "floor": floor}


def w1(db: common.Database) -> dict[str, Any]:
    count = 100 if QUICK else 500
    steps = 10
    r = _sequential(db, ten_steps, (steps,), count)
    lat = common.summary([x * 1e3 for x in r["latencies"]])
    total = count * steps
    return {
        "metrics": {
            "us_per_step": r["elapsed"] / total * 1e6,
            "us_per_step_in_engine": sum(r["inside"]) / total * 1e6,
            "floor_us_adjacent": r["floor"],
            "x_floor": r["elapsed"] / total * 1e6 / r["floor"],
            "x_floor_in_engine": sum(r["inside"]) / total * 1e6 / r["floor"],
            "wf_ms_p50": lat["p50"],
            "wf_ms_p99": lat["p99"],
        },
        "detail": {"workflows": count, "steps": steps, "elapsed_s": r["elapsed"],
                   "latency_ms": lat, "durability": r["settings"]},
    }


def w2(db: common.Database) -> dict[str, Any]:
    count = 100 if QUICK else 500
    r = _sequential(db, zero_steps, (), count)
    lat = common.summary([x * 1e3 for x in r["latencies"]])
    return {
        "metrics": {
            "ms_per_workflow": r["elapsed"] / count * 1e3,
            "ms_in_engine": sum(r["inside"]) / count * 1e3,
            "floor_us_adjacent": r["floor"],
            "x_floor": r["elapsed"] / count * 1e6 / r["floor"],
            "wf_ms_p99": lat["p99"],
        },
        "detail": {"workflows": count, "elapsed_s": r["elapsed"], "latency_ms": lat,
                   "durability": r["settings"]},
    }


# -- W3: throughput through a queue, one worker process --------------------------------


def w3(db: common.Database) -> dict[str, Any]:
    count = 300 if QUICK else 2000
    steps = 10
    # This process only enqueues: it listens to no queue.
    launch(db, listen=[])
    queue = DBOS.register_queue(QUEUE)  # every setting at its default
    t0 = time.perf_counter()
    for _ in range(count):
        queue.enqueue(ten_steps, steps)
    enqueue_s = time.perf_counter() - t0
    DBOS.destroy()
    child = spawn_worker("queue")
    peek = Peek(db)
    try:
        child.expect("ready")
        go = time.time()
        child.send({"cmd": "go"})
        started = child.expect("started")
        peek.wait_success("ten_steps", count, timeout=1200)
        end = peek.last_update_s("ten_steps")
    finally:
        child.stop()
        peek.close()
    elapsed = end - go
    return {
        "metrics": {"steps_per_s": count * steps / elapsed, "workflows_per_s": count / elapsed},
        "detail": {"workflows": count, "steps": steps, "workers": 1, "elapsed_s": elapsed,
                   "enqueue_s": enqueue_s, "enqueue_per_s": count / enqueue_s,
                   "durability": started.get("durability")},
    }


# -- W5: signal latency (DBOS.send from another process -> DBOS.recv) -------------------


def w5(db: common.Database) -> dict[str, Any]:
    count = 50 if QUICK else 200
    prepare(db)
    child = spawn_worker("signals", env={"BENCH_SIGNALS": str(count)})
    returned = []
    try:
        child.expect("ready")
        child.send({"cmd": "go"})
        started = child.expect("started")
        wid = started["workflow_id"]
        client = DBOSClient(system_database_url=db.dbos_url)
        peek = Peek(db)
        for i in range(count):
            deadline = time.monotonic() + 60
            while not peek.has_event(wid, f"at{i}"):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"workflow never reached recv s{i}")
                time.sleep(0.001)
            time.sleep(0.005)  # the event is set just before recv: let recv start waiting
            client.send(wid, i, topic=f"s{i}")
            returned.append(time.time_ns())
            time.sleep(0.02)
        stamps = client.retrieve_workflow(wid).get_result()
        peek.close()
        client.destroy()
    finally:
        child.stop()
    lat = [(s - r) / 1e6 for s, r in zip(stamps, returned, strict=True)]
    summ = common.summary(lat)
    return {
        "metrics": {"p50_ms": summ["p50"], "p99_ms": summ["p99"]},
        "detail": {"signals": count, "latency_ms": summ,
                   "negative": sum(1 for x in lat if x < 0),
                   "durability": started.get("durability")},
    }


WORKLOADS = {"W1": w1, "W2": w2, "W3": w3, "W5": w5}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        worker_main(sys.argv[2])
        return
    db = common.database_from_env()
    common.write_result(WORKLOADS[sys.argv[1]](db))


if __name__ == "__main__":
    main()
