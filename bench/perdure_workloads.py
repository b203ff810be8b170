"""perdure's side of the benchmark: W1-W8, and the worker process some of them spawn.

``python bench/perdure_workloads.py W1`` runs one workload once against the
fresh database named by BENCH_DB and writes its result to BENCH_RESULT.
``python bench/perdure_workloads.py worker [...]`` is a worker process that
the workloads drive over stdin/stdout (ready -> go -> stop).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common

import perdure

APP = "bench"
QUICK = os.environ.get("BENCH_QUICK") == "1"


# -- the workflows --------------------------------------------------------------


def _noop(i: int) -> int:
    return i


def _stamp(i: int) -> int:
    # CLOCK_REALTIME: comparable with the signaler's time.time_ns() in another process.
    return time.time_ns()


def _logged(i: int) -> int:
    """W6: record every execution of step i (and hang in the first worker at step HANG_AT)."""
    at = time.time_ns()
    with open(os.environ["BENCH_STEP_LOG"], "a") as f:
        f.write(f"{i} {os.getpid()} {at}\n")
        f.flush()
        os.fsync(f.fileno())
    if i == int(os.environ.get("BENCH_HANG_AT", "0")):
        time.sleep(600)  # killed here with SIGKILL
    return i


def _hold(i: int) -> int:
    """W8: stay running until the flag file appears."""
    flag = os.environ["BENCH_HOLD_FLAG"]
    while not os.path.exists(flag):
        time.sleep(0.2)
    return i


def build(url: str) -> perdure.App:
    app = perdure.App(url, name=APP)
    noop = app.step(name="noop")(_noop)
    stamp = app.step(name="stamp")(_stamp)
    logged = app.step(name="logged")(_logged)
    hold = app.step(name="hold")(_hold)

    @app.workflow(name="ten_steps")
    def ten_steps(ctx: perdure.Context, n: int) -> int:
        for i in range(n):
            noop(i)
        return n

    @app.workflow(name="zero_steps")
    def zero_steps(ctx: perdure.Context) -> int:
        return 0

    @app.workflow(name="signals")
    def signals(ctx: perdure.Context, n: int, prefix: int = 0) -> list[int]:
        for i in range(prefix):  # journal entries recorded before the first wait
            noop(i)
        stamps = []
        for i in range(n):
            ctx.wait(f"s{i}")
            stamps.append(stamp(i))
        return stamps

    @app.workflow(name="answers")
    def answers(ctx: perdure.Context, n: int) -> int:
        for _ in range(n):
            upd = ctx.next_update("ask")
            ctx.respond(upd, upd.payload)
        return n

    @app.workflow(name="recovery")
    def recovery(ctx: perdure.Context, n: int) -> int:
        for i in range(1, n + 1):
            logged(i)
        return n

    @app.workflow(name="waiter")
    def waiter(ctx: perdure.Context) -> None:
        ctx.wait("never")

    @app.workflow(name="holder")
    def holder(ctx: perdure.Context, i: int) -> int:
        return hold(i)

    return app


# -- the worker process -----------------------------------------------------------


def worker_main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--concurrency", type=int, default=None)
    parser.add_argument("--lease-ttl", type=float, default=None)
    parser.add_argument("--heartbeat", type=float, default=None)
    args = parser.parse_args(argv)
    db = common.database_from_env()
    app = build(db.perdure_url)
    _ = app.store  # open (and migrate) the store now
    options: dict[str, Any] = {}
    if args.concurrency is not None:
        options["concurrency"] = args.concurrency
    if args.lease_ttl is not None:
        options["lease_ttl"] = args.lease_ttl
    if args.heartbeat is not None:
        options["heartbeat"] = args.heartbeat
    if os.environ.get("BENCH_LIVENESS"):
        # Where leases are renewed from: process (the keeper, the default) or thread.
        options["liveness"] = os.environ["BENCH_LIVENESS"]
    common.say({"event": "ready", "pid": os.getpid()})
    cmd = common.read_command()
    if cmd.get("cmd") != "go":
        return
    started = time.time_ns()
    worker = app.worker(**options)  # everything else at its default
    worker.start()
    common.say({"event": "started", "t_ns": started, "worker_id": worker.worker_id})
    common.read_command()  # stop (or EOF)
    worker.stop(timeout=30)
    app.close()
    common.say({"event": "stopped"})


def spawn_worker(*args: str, env: dict[str, str] | None = None) -> common.Child:
    argv = [common.python(), os.path.abspath(__file__), "worker", *args]
    return common.Child(argv, env=env)


# -- raw reads of the store (for measuring, not part of the API) -------------------


class Peek:
    """Direct SQL reads of perdure's tables, for completion checks and timestamps."""

    def __init__(self, db: common.Database) -> None:
        self.db = db
        self.conn = db.raw_connect()
        self.runs = "runs" if db.kind == "sqlite" else "perdure.runs"

    def one(self, sql: str) -> Any:
        return self.conn.execute(sql).fetchone()

    def states(self) -> dict[str, int]:
        rows = self.conn.execute(
            f"SELECT state, count(*) FROM {self.runs} WHERE app = '{APP}' GROUP BY state"
        ).fetchall()
        return {s: int(n) for s, n in rows}

    def last_update_s(self, workflow: str) -> float:
        """The latest updated_at among the workflow's runs, in Unix seconds."""
        if self.db.kind == "sqlite":
            (us,) = self.one(f"SELECT max(updated_at) FROM runs WHERE workflow = '{workflow}'")
            return us / 1e6
        (s,) = self.one(
            f"SELECT extract(epoch FROM max(updated_at)) FROM perdure.runs "
            f"WHERE workflow = '{workflow}'")
        return float(s)

    def lease_expires_s(self, run_id: str) -> float | None:
        if self.db.kind == "sqlite":
            (us,) = self.one(f"SELECT lease_expires_at FROM runs WHERE run_id = '{run_id}'")
            return None if us is None else us / 1e6
        (s,) = self.one(f"SELECT extract(epoch FROM lease_expires_at) FROM perdure.runs "
                        f"WHERE run_id = '{run_id}'")
        return None if s is None else float(s)

    def wait_states(self, want: dict[str, int], timeout: float,
                    poll: float = 0.05) -> dict[str, int]:
        """Poll until every state in ``want`` has at least that many runs."""
        deadline = time.monotonic() + timeout
        while True:
            found = self.states()
            if all(found.get(s, 0) >= n for s, n in want.items()):
                return found
            bad = {s: n for s, n in found.items() if s in ("failed", "needs_attention", "canceled")}
            if bad:
                raise RuntimeError(f"runs ended badly: {found}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"waited {timeout}s for {want}; have {found}")
            time.sleep(poll)

    def close(self) -> None:
        self.conn.close()


def store_settings(db: common.Database) -> dict[str, Any]:
    conn = db.raw_connect()
    try:
        if db.kind == "sqlite":
            return {"journal_mode": conn.execute("PRAGMA journal_mode").fetchone()[0],
                    "synchronous(default for a new connection; perdure sets FULL=2)":
                        conn.execute("PRAGMA synchronous").fetchone()[0]}
        return {k: conn.execute(f"SHOW {k}").fetchone()[0]
                for k in ("fsync", "synchronous_commit")}
    finally:
        conn.close()


# -- W1 / W2: sequential ------------------------------------------------------------


def _sequential(app: perdure.App, workflow: str, args: tuple, count: int,
                warmup: int = 5) -> dict[str, Any]:
    """Start and await ``count`` runs one by one with an in-process worker (defaults)."""
    for _ in range(warmup):
        app.start(workflow, *args).result(timeout=60)
    latencies = []
    run_ids = []
    t0 = time.perf_counter()
    for _ in range(count):
        s = time.perf_counter()
        handle = app.start(workflow, *args)
        handle.result(timeout=60)
        latencies.append(time.perf_counter() - s)
        run_ids.append(handle.run_id)
    elapsed = time.perf_counter() - t0
    # Time inside the engine: the run's created_at -> its final updated_at (store clock).
    inside = []
    for run_id in run_ids:
        info = app.get(run_id)
        inside.append((info.updated_at - info.created_at).total_seconds())
    return {"elapsed": elapsed, "latencies": latencies, "inside": inside}


def w1(db: common.Database) -> dict[str, Any]:
    count = 100 if QUICK else 500
    steps = 10
    app = build(db.perdure_url)
    _ = app.store  # open (and migrate) the store now
    before = common.floor_probe(db)
    with app.worker():
        r = _sequential(app, "ten_steps", (steps,), count)
    app.close()
    floor = (before + common.floor_probe(db)) / 2
    total_steps = count * steps
    lat = common.summary([x * 1e3 for x in r["latencies"]])
    inside = common.summary([x * 1e3 for x in r["inside"]])
    return {
        "metrics": {
            "us_per_step": r["elapsed"] / total_steps * 1e6,
            "us_per_step_in_engine": sum(r["inside"]) / total_steps * 1e6,
            "floor_us_adjacent": floor,
            "x_floor": r["elapsed"] / total_steps * 1e6 / floor,
            "x_floor_in_engine": sum(r["inside"]) / total_steps * 1e6 / floor,
            "wf_ms_p50": lat["p50"],
            "wf_ms_p99": lat["p99"],
        },
        "detail": {"workflows": count, "steps": steps, "elapsed_s": r["elapsed"],
                   "latency_ms": lat, "in_engine_ms": inside},
    }


def w2(db: common.Database) -> dict[str, Any]:
    count = 100 if QUICK else 500
    app = build(db.perdure_url)
    _ = app.store  # open (and migrate) the store now
    before = common.floor_probe(db)
    with app.worker():
        r = _sequential(app, "zero_steps", (), count)
    app.close()
    floor = (before + common.floor_probe(db)) / 2
    lat = common.summary([x * 1e3 for x in r["latencies"]])
    return {
        "metrics": {
            "ms_per_workflow": r["elapsed"] / count * 1e3,
            "ms_in_engine": sum(r["inside"]) / count * 1e3,
            "floor_us_adjacent": floor,
            "x_floor": r["elapsed"] / count * 1e6 / floor,
            "wf_ms_p99": lat["p99"],
        },
        "detail": {"workflows": count, "elapsed_s": r["elapsed"], "latency_ms": lat,
                   "in_engine_ms": common.summary([x * 1e3 for x in r["inside"]])},
    }


# -- W3 / W4: throughput ------------------------------------------------------------


def throughput(db: common.Database, workers: int) -> dict[str, Any]:
    count = 300 if QUICK else 2000
    steps = 10
    app = build(db.perdure_url)
    t0 = time.perf_counter()
    for _ in range(count):
        app.start("ten_steps", steps)
    start_s = time.perf_counter() - t0
    app.close()
    children = [spawn_worker() for _ in range(workers)]
    peek = Peek(db)
    cpu = common.CpuLedger([c.pid for c in children])
    try:
        for c in children:
            c.expect("ready")
        cpu.mark()
        go = time.time()
        for c in children:
            c.send({"cmd": "go"})
        peek.wait_states({"succeeded": count}, timeout=600, poll=0.1)
        end = peek.last_update_s("ten_steps")
        # Read at once: the last poll may come up to 0.1 s after the end, idle time
        # that lowers the busy share a little and adds nothing per step.
        spent = cpu.read(count * steps)
    finally:
        for c in children:
            c.stop()
        peek.close()
    elapsed = end - go
    return {
        "metrics": {"steps_per_s": count * steps / elapsed,
                    "workflows_per_s": count / elapsed},
        "detail": {"workflows": count, "steps": steps, "workers": workers,
                   "elapsed_s": elapsed, "enqueue_s": start_s,
                   "enqueue_per_s": count / start_s, "cpu": spent},
    }


def w3(db: common.Database) -> dict[str, Any]:
    return throughput(db, 1)


def w4(db: common.Database) -> dict[str, Any]:
    workers = int(os.environ.get("BENCH_WORKERS", "1"))
    return throughput(db, workers)


# -- W5: signal latency --------------------------------------------------------------


# Steps the W5 run records before its first wait (BENCH_W5_PREFIX): the claim
# that takes a woken run up reads a journal this much longer.
W5_PREFIX = int(os.environ.get("BENCH_W5_PREFIX", "0"))


def w5(db: common.Database) -> dict[str, Any]:
    count = 50 if QUICK else 200
    app = build(db.perdure_url)
    _ = app.store  # open (and migrate) the store now
    child = spawn_worker()
    returned = []
    try:
        child.expect("ready")
        child.send({"cmd": "go"})
        child.expect("started")
        handle = app.start("signals", count, W5_PREFIX)
        for i in range(count):
            deadline = time.monotonic() + 30
            while app.get(handle.run_id).state != "waiting":
                if time.monotonic() > deadline:
                    raise TimeoutError(f"run never parked on s{i}")
                time.sleep(0.001)
            app.signal(handle.run_id, f"s{i}", i)
            returned.append(time.time_ns())
            time.sleep(0.02)  # leave the worker alone while it resumes
        stamps = handle.result(timeout=120)
    finally:
        child.stop()
        app.close()
    lat = [(s - r) / 1e6 for s, r in zip(stamps, returned, strict=True)]
    summ = common.summary(lat)
    return {
        "metrics": {"p50_ms": summ["p50"], "p99_ms": summ["p99"]},
        "detail": {"signals": count, "prefix_entries": W5_PREFIX, "latency_ms": summ,
                   "negative": sum(1 for x in lat if x < 0)},
    }


# -- W9: update round trip -----------------------------------------------------------


def w9(db: common.Database) -> dict[str, Any]:
    """Caller -> answer: ``app.update`` against a run parked on ``next_update``."""
    count = 50 if QUICK else 200
    app = build(db.perdure_url)
    _ = app.store
    child = spawn_worker()
    lat = []
    try:
        child.expect("ready")
        child.send({"cmd": "go"})
        child.expect("started")
        handle = app.start("answers", count)
        for i in range(count):
            deadline = time.monotonic() + 30
            while app.get(handle.run_id).state != "waiting":
                if time.monotonic() > deadline:
                    raise TimeoutError(f"run never parked before update {i}")
                time.sleep(0.001)
            t0 = time.perf_counter_ns()
            answer = app.update(handle.run_id, "ask", i, update_id=f"u{i}", timeout=30)
            lat.append((time.perf_counter_ns() - t0) / 1e6)
            assert answer == i, answer
            time.sleep(0.02)  # leave the worker alone while it parks again
        handle.result(timeout=120)
    finally:
        child.stop()
        app.close()
    summ = common.summary(lat)
    return {
        "metrics": {"p50_ms": summ["p50"], "p99_ms": summ["p99"]},
        "detail": {"updates": count, "latency_ms": summ},
    }


# -- W6: recovery --------------------------------------------------------------------


W6_LEASE_TTL = 5.0
W6_HEARTBEAT = 1.0


def w6(db: common.Database) -> dict[str, Any]:
    steps, hang_at = 20, 10
    folder = os.path.dirname(db.path) if db.kind == "sqlite" else "/tmp"
    log_path = os.path.join(folder, f"w6-{os.getpid()}-{time.time_ns()}.log")
    open(log_path, "w").close()
    env = {"BENCH_STEP_LOG": log_path}
    timing = ("--lease-ttl", str(W6_LEASE_TTL), "--heartbeat", str(W6_HEARTBEAT))
    app = build(db.perdure_url)
    peek = Peek(db)

    def lines() -> list[tuple[int, int, int]]:
        with open(log_path) as f:
            return [tuple(map(int, ln.split())) for ln in f if ln.strip()]  # type: ignore[misc]

    first = spawn_worker(*timing, env={**env, "BENCH_HANG_AT": str(hang_at)})
    second = None
    try:
        first.expect("ready")
        first.send({"cmd": "go"})
        first.expect("started")
        handle = app.start("recovery", steps)
        deadline = time.monotonic() + 60
        while not any(i == hang_at for i, _, _ in lines()):
            if time.monotonic() > deadline:
                raise TimeoutError("step 10 never started")
            time.sleep(0.005)
        os.kill(first.pid, signal.SIGKILL)
        killed = time.time()
        first.proc.wait()
        lease_at_kill = peek.lease_expires_s(handle.run_id)
        spawned = time.time()
        second = spawn_worker(*timing, env=env)
        second.expect("ready")
        second.send({"cmd": "go"})
        started = second.expect("started")["t_ns"] / 1e9
        result = handle.result(timeout=120)
        assert result == steps, result
    finally:
        first.kill()
        if second is not None:
            second.stop()
        peek.close()
        app.close()
    log = lines()
    os.unlink(log_path)
    pids = {p for _, p, _ in log}
    second_pid = second.pid
    resumed = min(t for i, p, t in log if p == second_pid) / 1e9
    first_resumed_step = min((i for i, p, _ in log if p == second_pid))
    runs_per_step = {i: sum(1 for j, _, _ in log if j == i) for i in range(1, steps + 1)}
    rerun_finished = [i for i in range(1, hang_at) if runs_per_step[i] != 1]
    total = resumed - started
    lease_left = max(0.0, (lease_at_kill or started) - started)
    return {
        "metrics": {
            "resume_s": total,
            "lease_left_s": lease_left,
            "overhead_s": total - lease_left,
            "finished_steps_rerun": len(rerun_finished),
        },
        "detail": {"lease_ttl": W6_LEASE_TTL, "heartbeat": W6_HEARTBEAT,
                   "kill_to_spawn_s": spawned - killed, "spawn_to_start_s": started - spawned,
                   "first_resumed_step": first_resumed_step, "runs_per_step": runs_per_step,
                   "processes": len(pids)},
    }


# -- W7: big store -------------------------------------------------------------------


def _bulk_sqlite(db: common.Database, finished: int, waiting: int) -> None:
    """Insert the runs (with a journal entry, 3 ledger receipts and, for waiting
    runs, a registered wait each) in one transaction, straight into the tables."""
    conn = db.raw_connect()
    now = int(time.time() * 1e6)
    month = 30 * 86400 * 10**6
    conn.execute("BEGIN IMMEDIATE")
    conn.execute(
        """
        CREATE TEMP TABLE gen AS
        WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < :total)
        SELECT lower(hex(randomblob(16))) AS run_id,
               CASE WHEN x <= :finished THEN 'succeeded' ELSE 'waiting' END AS state,
               :now - abs(random() % :month) AS t
        FROM c
        """, {"total": finished + waiting, "finished": finished, "now": now - 60 * 10**6,
              "month": month})
    conn.execute(
        """
        INSERT INTO runs (run_id, app, workflow, version, state, input, result, generation,
                          ledger_sequence, created_at, updated_at)
        SELECT run_id, :app, CASE state WHEN 'waiting' THEN 'waiter' ELSE 'ten_steps' END, '1',
               state, CASE state WHEN 'waiting' THEN '{"args":[],"kwargs":{}}'
                                 ELSE '{"args":[10],"kwargs":{}}' END,
               CASE state WHEN 'waiting' THEN NULL ELSE '10' END, 1, 3, t, t + 20000
        FROM gen
        """, {"app": APP})
    conn.execute(
        """
        INSERT INTO journal (run_id, position, kind, name, status, output, error, attempt,
                             created_at, updated_at)
        SELECT run_id, 1,
               CASE state WHEN 'waiting' THEN 'wait' ELSE 'step' END,
               CASE state WHEN 'waiting' THEN 'never' ELSE 'noop' END,
               CASE state WHEN 'waiting' THEN 'started' ELSE 'ok' END,
               CASE state WHEN 'waiting' THEN '{"deadline": null}' ELSE '0' END,
               NULL, 1, t, t
        FROM gen
        """)
    conn.execute(
        """
        INSERT INTO waits (run_id, name, app, kind, deadline, after_sequence, created_at)
        SELECT run_id, 'never', :app, 'signal', NULL, 0, t FROM gen WHERE state = 'waiting'
        """, {"app": APP})
    conn.execute(
        """
        INSERT INTO ledger (run_id, sequence, kind, at, generation, worker)
        SELECT g.run_id, k.seq,
               CASE k.seq WHEN 1 THEN 'initialized' WHEN 2 THEN 'claimed'
                    ELSE CASE g.state WHEN 'waiting' THEN 'parked' ELSE 'finished' END END,
               g.t + k.seq, CASE k.seq WHEN 1 THEN 0 ELSE 1 END,
               CASE k.seq WHEN 1 THEN NULL ELSE 'bulk-worker' END
        FROM gen AS g CROSS JOIN (SELECT 1 AS seq UNION ALL SELECT 2 UNION ALL SELECT 3) AS k
        """)
    conn.execute("COMMIT")
    conn.execute("DROP TABLE gen")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()


def _bulk_postgres(db: common.Database, finished: int, waiting: int) -> None:
    """The same rows as _bulk_sqlite, then what autovacuum would do after such a load."""
    conn = db.raw_connect()
    with conn.transaction():
        conn.execute(
            """
            CREATE TEMP TABLE gen ON COMMIT DROP AS
            SELECT md5(random()::text || x::text) AS run_id,
                   CASE WHEN x <= %(finished)s THEN 'succeeded' ELSE 'waiting' END AS state,
                   now() - interval '1 minute' - random() * interval '30 days' AS t
            FROM generate_series(1, %(total)s) AS x
            """, {"finished": finished, "total": finished + waiting})
        conn.execute(
            """
            INSERT INTO perdure.runs (run_id, app, workflow, version, state, input, result,
                                      generation, ledger_sequence, created_at, updated_at)
            SELECT run_id, %(app)s,
                   CASE state WHEN 'waiting' THEN 'waiter' ELSE 'ten_steps' END, '1', state,
                   CASE state WHEN 'waiting' THEN '{"args":[],"kwargs":{}}'
                              ELSE '{"args":[10],"kwargs":{}}' END,
                   CASE state WHEN 'waiting' THEN NULL ELSE '10' END, 1, 3,
                   t, t + interval '20 ms'
            FROM gen
            """, {"app": APP})
        conn.execute(
            """
            INSERT INTO perdure.journal (run_id, position, kind, name, status, output, attempt,
                                         created_at, updated_at)
            SELECT run_id, 1,
                   CASE state WHEN 'waiting' THEN 'wait' ELSE 'step' END,
                   CASE state WHEN 'waiting' THEN 'never' ELSE 'noop' END,
                   CASE state WHEN 'waiting' THEN 'started' ELSE 'ok' END,
                   CASE state WHEN 'waiting' THEN '{"deadline": null}' ELSE '0' END,
                   1, t, t
            FROM gen
            """)
        conn.execute(
            """
            INSERT INTO perdure.waits (run_id, name, app, kind, deadline, after_sequence,
                                       created_at)
            SELECT run_id, 'never', %(app)s, 'signal', NULL, 0, t FROM gen
            WHERE state = 'waiting'
            """, {"app": APP})
        conn.execute(
            """
            INSERT INTO perdure.ledger (run_id, sequence, kind, at, generation, worker)
            SELECT g.run_id, k.seq,
                   CASE k.seq WHEN 1 THEN 'initialized' WHEN 2 THEN 'claimed'
                        ELSE CASE g.state WHEN 'waiting' THEN 'parked' ELSE 'finished' END END,
                   g.t + k.seq * interval '1 ms',
                   CASE k.seq WHEN 1 THEN 0 ELSE 1 END,
                   CASE k.seq WHEN 1 THEN NULL ELSE 'bulk-worker' END
            FROM gen AS g CROSS JOIN generate_series(1, 3) AS k(seq)
            """)
    conn.execute("VACUUM ANALYZE")
    conn.close()


def _claim_latency(app: perdure.App, count: int) -> dict[str, list[float]]:
    """Time store.claim() with exactly one ready run, and with none."""
    store = app.store
    versions = app.workflow_versions()
    one, none = [], []
    for _ in range(count):
        app.start("zero_steps")
        s = time.perf_counter()
        claimed = store.claim(APP, "bench-claimer", versions, lease_ttl=30, limit=1)
        one.append((time.perf_counter() - s) * 1e3)
        assert len(claimed) == 1, claimed
        store.finish(claimed[0].claim, [], state="succeeded", result="0")
        s = time.perf_counter()
        assert store.claim(APP, "bench-claimer", versions, lease_ttl=30, limit=8) == []
        none.append((time.perf_counter() - s) * 1e3)
    return {"one": one, "none": none}


def clone_template(template: common.Database) -> common.Database:
    """A fresh copy of the pre-generated big store (run.py builds it once per invocation)."""
    if template.kind == "sqlite":
        import shutil
        import tempfile

        folder = tempfile.mkdtemp(prefix="perdure-bench-", dir=os.environ.get("BENCH_TMP"))
        path = os.path.join(folder, "bench.db")
        shutil.copyfile(template.path, path)
        return common.Database("sqlite", f"sqlite:///{path}", f"sqlite:///{path}", path=path)
    import secrets

    import psycopg

    name = f"bench_{secrets.token_hex(6)}"
    with psycopg.connect(common.PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template.name}" STRATEGY FILE_COPY')
    url = common.pg_url(name)
    return common.Database("postgres", url, url, name=name)


def generate_template(db: common.Database) -> dict[str, Any]:
    """Build the big store in ``db``: perdure's schema, then the bulk rows."""
    scale = float(os.environ.get("BENCH_W7_SCALE", "0.01" if QUICK else "1"))
    finished, waiting = int(1_000_000 * scale), int(100_000 * scale)
    app = build(db.perdure_url)
    _ = app.store  # open (and migrate) the store now
    app.close()
    t0 = time.perf_counter()
    (_bulk_sqlite if db.kind == "sqlite" else _bulk_postgres)(db, finished, waiting)
    return {"finished_runs": finished, "waiting_runs": waiting,
            "generate_s": time.perf_counter() - t0}


def _w7_phase(db: common.Database, claims: int, w1_count: int) -> dict[str, Any]:
    app = build(db.perdure_url)
    _claim_latency(app, 20)  # warm-up
    lat = _claim_latency(app, claims)
    with app.worker():
        r = _sequential(app, "ten_steps", (10,), w1_count)
    app.close()
    return {
        "claim_ms": common.summary(lat["one"]),
        "empty_claim_ms": common.summary(lat["none"]),
        "w1_wf_ms": common.summary([x * 1e3 for x in r["latencies"]]),
        "w1_us_per_step": r["elapsed"] / (w1_count * 10) * 1e6,
    }


def w7(db: common.Database) -> dict[str, Any]:
    claims = 50 if QUICK else 300
    w1_count = 100 if QUICK else 500
    spec = os.environ.get("BENCH_W7_TEMPLATE")
    if spec:
        import json

        template = common.Database(**json.loads(spec))
        made = json.loads(os.environ["BENCH_W7_MADE"])
    else:  # standalone: build the big store here
        template = common.create_database(db.kind)
        made = generate_template(template)
    out: dict[str, Any] = {"empty": _w7_phase(db, claims, w1_count)}
    t0 = time.perf_counter()
    big = clone_template(template)
    out["clone_s"] = time.perf_counter() - t0
    try:
        out["big"] = _w7_phase(big, claims, w1_count)
        peek = Peek(big)
        out["states_after"] = peek.states()
        peek.close()
    finally:
        common.drop_database(big)
        if not spec:
            common.drop_database(template)
    e, b = out["empty"], out["big"]
    return {
        "metrics": {
            "claim_p99_ms_empty": e["claim_ms"]["p99"],
            "claim_p99_ms_big": b["claim_ms"]["p99"],
            "claim_p99_ratio": b["claim_ms"]["p99"] / e["claim_ms"]["p99"],
            "claim_p50_ratio": b["claim_ms"]["p50"] / e["claim_ms"]["p50"],
            "w1_wf_p99_ms_empty": e["w1_wf_ms"]["p99"],
            "w1_wf_p99_ms_big": b["w1_wf_ms"]["p99"],
            "w1_p99_ratio": b["w1_wf_ms"]["p99"] / e["w1_wf_ms"]["p99"],
            "w1_us_per_step_ratio": b["w1_us_per_step"] / e["w1_us_per_step"],
        },
        "detail": {**made, "claims": claims, "w1_workflows": w1_count, **out},
    }


# -- W8: memory ----------------------------------------------------------------------


def _rss_settled(pid: int, seconds: float) -> tuple[int, int]:
    """Max RSS (KiB) and threads sampled over ``seconds``."""
    peak, threads = 0, 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        peak = max(peak, common.rss_kib(pid))
        threads = max(threads, common.threads_of(pid))
        time.sleep(0.1)
    return peak, threads


def w8(db: common.Database) -> dict[str, Any]:
    """Worker RSS: (a) a default worker before and after it parks 10k runs; (b) a fresh
    worker (concurrency 1000) on the store holding those 10k waiting runs; (c) the same
    worker with 1000 runs running at once (each inside a step that waits for a flag)."""
    waiting = 2000 if QUICK else 10_000
    running = 200 if QUICK else 1000
    folder = os.path.dirname(db.path) if db.kind == "sqlite" else "/tmp"
    flag = os.path.join(folder, f"w8-{os.getpid()}-{time.time_ns()}.flag")
    env = {"BENCH_HOLD_FLAG": flag}
    app = build(db.perdure_url)
    _ = app.store  # open (and migrate) the store now
    peek = Peek(db)
    out: dict[str, Any] = {}
    a = spawn_worker(env=env)  # default settings
    b = None
    try:
        a.expect("ready")
        a.send({"cmd": "go"})
        a.expect("started")
        out["default_fresh_kib"], _ = _rss_settled(a.pid, 3)
        t0 = time.perf_counter()
        for _ in range(waiting):
            app.start("waiter")
        out["start_waiting_s"] = time.perf_counter() - t0
        peek.wait_states({"waiting": waiting}, timeout=600)
        out["parked_waiting_s"] = time.perf_counter() - t0
        out["default_after_parking_kib"], _ = _rss_settled(a.pid, 3)
        a.stop()
        b = spawn_worker("--concurrency", str(running), env=env)
        b.expect("ready")
        b.send({"cmd": "go"})
        b.expect("started")
        # 12 s: spans the sweep at start and the next one (sweep_interval=10 s)
        out["c1000_fresh_with_waiting_kib"], out["fresh_threads"] = _rss_settled(b.pid, 12)
        t0 = time.perf_counter()
        for i in range(running):
            app.start("holder", i)
        peek.wait_states({"running": running}, timeout=600)
        out["all_running_s"] = time.perf_counter() - t0
        out["running_kib"], out["running_threads"] = _rss_settled(b.pid, 3)
        open(flag, "w").close()
        t0 = time.perf_counter()
        peek.wait_states({"succeeded": running}, timeout=600)
        out["drain_running_s"] = time.perf_counter() - t0
        out["after_drain_kib"] = common.rss_kib(b.pid)
    finally:
        open(flag, "w").close()
        if a.proc.poll() is None:
            a.kill()
        if b is not None:
            b.stop()
        peek.close()
        app.close()
        os.unlink(flag)
    # (c) against a fresh worker with concurrency 1000 on an empty store, for reference
    empty = common.create_database(db.kind)
    import dataclasses
    import json

    c = spawn_worker("--concurrency", str(running),
                     env={**env, "BENCH_DB": json.dumps(dataclasses.asdict(empty))})
    try:
        c.expect("ready")
        c.send({"cmd": "go"})
        c.expect("started")
        out["c1000_fresh_empty_kib"], _ = _rss_settled(c.pid, 12)
    finally:
        c.stop()
        common.drop_database(empty)
    mb = 1024.0
    return {
        "metrics": {
            "rss_mb_fresh_empty": out["c1000_fresh_empty_kib"] / mb,
            "rss_mb_fresh_10k_waiting": out["c1000_fresh_with_waiting_kib"] / mb,
            "waiting_cost_mb": (out["c1000_fresh_with_waiting_kib"]
                                - out["c1000_fresh_empty_kib"]) / mb,
            "rss_mb_default_before_parking": out["default_fresh_kib"] / mb,
            "rss_mb_default_after_parking": out["default_after_parking_kib"] / mb,
            "rss_mb_1k_running": out["running_kib"] / mb,
        },
        "detail": {"waiting": waiting, "running": running, **out},
    }


WORKLOADS = {
    "W1": w1, "W2": w2, "W3": w3, "W4": w4, "W5": w5, "W6": w6, "W7": w7, "W8": w8, "W9": w9,
}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        worker_main(sys.argv[2:])
        return
    name = sys.argv[1]
    db = common.database_from_env()
    if name == "W7-template":
        common.write_result(generate_template(db))
        return
    result = WORKLOADS[name](db)
    result.setdefault("detail", {})["store_settings"] = store_settings(db)
    common.write_result(result)


if __name__ == "__main__":
    main()
