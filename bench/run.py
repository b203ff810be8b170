"""Run every workload on perdure and on DBOS Transact, on SQLite and PostgreSQL, plus the floor.

Each (workload, engine, store, repeat) runs in a fresh subprocess against a
fresh database (a SQLite file in a new temp dir, or ``CREATE DATABASE
bench_<random>`` dropped afterwards). Repeats are interleaved (every job once,
then every job again) so that slow drifts of the machine spread over all of
them. Prints one table (medians with min-max over the repeats, the ratios
perdure/DBOS and perdure/floor) and writes it, with the machine and versions,
to bench/out/latest.md; the raw results go to bench/out/latest.json.

    bench/run.sh                       # everything, 3 repeats
    bench/run.sh --quick               # fewer items, 1 repeat
    bench/run.sh --only W1,W3 --stores sqlite
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common

ALL = ["FLOOR", "W1", "W2", "W3", "W4", "W5", "W6", "W7", "W8", "W9"]
DBOS_WORKLOADS = {"W1", "W2", "W3", "W5"}
MODULES = {
    "floor": "floor.py",
    "perdure": "perdure_workloads.py",
    "dbos": "dbos_workloads.py",
}
TIMEOUT = {"W7": 3600, "W8": 1800, "W3": 1500}


@dataclasses.dataclass(frozen=True)
class Job:
    workload: str
    engine: str  # floor | perdure | dbos
    store: str  # sqlite | postgres
    workers: int = 1  # W4 only

    @property
    def key(self) -> str:
        extra = f"x{self.workers}" if self.workload == "W4" else ""
        return f"{self.workload}{extra}/{self.engine}/{self.store}"


def plan(args: argparse.Namespace) -> list[Job]:
    only = [w.strip().upper() for w in args.only.split(",")] if args.only else ALL
    stores = [s.strip() for s in args.stores.split(",")]
    engines = [e.strip() for e in args.engines.split(",")]
    jobs = []
    for w in only:
        for store in stores:
            if w == "FLOOR":
                jobs.append(Job(w, "floor", store))
                continue
            if w == "W4":
                if store == "postgres" and "perdure" in engines:
                    counts = [int(x) for x in args.workers.split(",")]
                    # W3 on PostgreSQL is the 1-worker point; run it if W3 is not planned.
                    w3_planned = "W3" in only
                    jobs += [Job(w, "perdure", store, n) for n in counts
                             if not (n == 1 and w3_planned)]
                continue
            if "perdure" in engines:
                jobs.append(Job(w, "perdure", store))
            if "dbos" in engines and w in DBOS_WORKLOADS:
                jobs.append(Job(w, "dbos", store))
    return jobs


def source_hash(sub: str = "") -> str:
    """A short hash of perdure's source as the job starts (the tree may change while the benchmark runs)."""
    import hashlib

    h = hashlib.sha256()
    root = os.path.join(common.REPO_DIR, "src", "perdure", sub)
    for folder, _, files in sorted(os.walk(root)):
        for name in sorted(files):
            if name.endswith((".py", ".sql")):
                with open(os.path.join(folder, name), "rb") as f:
                    h.update(f.read())
    return h.hexdigest()[:12]


def cpu_busy_s() -> float:
    """CPU-seconds the whole machine has spent busy (all cores), from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def own_cpu_s() -> float:
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def wait_for_calm(limit: float, patience: float) -> float:
    """Wait (up to ``patience`` s) until the machine's busy share over 1 s is below ``limit``;
    return the last share seen. Other people's test runs share these 2 cores."""
    deadline = time.monotonic() + patience
    while True:
        b0 = cpu_busy_s()
        time.sleep(1.0)
        share = (cpu_busy_s() - b0) / (os.cpu_count() or 1)
        if share < limit or time.monotonic() > deadline:
            return share


def make_templates(jobs: list[Job], args: argparse.Namespace, log: Any,
                   stores: set[str] | None = None) -> dict[str, Any]:
    """Build W7's big store once per store kind; each W7 run works on a fresh copy.

    A template is rebuilt when perdure's SQL changed since it was made (its schema
    would be stale: a migration edited in place is not re-applied to a copy)."""
    templates = {}
    for store in sorted(stores or {j.store for j in jobs if j.workload == "W7"}):
        db = common.create_database(store)
        res = run_job(Job("W7-template", "perdure", store), args, log, db=db, keep=True)
        if "error" in res:
            print(f"W7 template on {store} failed: {res['error']}", flush=True)
            common.drop_database(db)
            continue
        if store == "sqlite":  # fold the WAL into the file before copies are made
            conn = db.raw_connect()
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            conn.close()
        print(f"W7 template on {store}: {res['finished_runs']:,} finished + "
              f"{res['waiting_runs']:,} waiting runs in {res['generate_s']:.0f}s", flush=True)
        res["sql"] = source_hash("store/sql")
        templates[store] = (db, res)
    return templates


def run_job(job: Job, args: argparse.Namespace, log: Any, *, db: common.Database | None = None,
            keep: bool = False, templates: dict[str, Any] | None = None) -> dict[str, Any]:
    calm = wait_for_calm(args.calm, args.patience) if args.calm > 0 else None
    db = db or common.create_database(job.store)
    fd, result_path = tempfile.mkstemp(prefix="bench-result-", suffix=".json")
    os.close(fd)
    env = {
        **os.environ,
        "BENCH_DB": json.dumps(dataclasses.asdict(db)),
        "BENCH_RESULT": result_path,
        "BENCH_QUICK": "1" if args.quick else "0",
        "BENCH_WORKERS": str(job.workers),
        "PYTHONUNBUFFERED": "1",
    }
    if args.w7_scale is not None:
        env["BENCH_W7_SCALE"] = str(args.w7_scale)
    if job.workload == "W7" and templates and job.store in templates:
        tdb, made = templates[job.store]
        env["BENCH_W7_TEMPLATE"] = json.dumps(dataclasses.asdict(tdb))
        env["BENCH_W7_MADE"] = json.dumps(made)
    argv = [sys.executable, os.path.join(common.BENCH_DIR, MODULES[job.engine]), job.workload]
    if job.workload == "W7-template":
        argv[-1] = "W7-template"
    if job.engine == "floor":
        argv = argv[:-1]
    t0 = time.monotonic()
    src = source_hash()
    started_at = dt.datetime.now(dt.UTC).strftime("%H:%M:%S")
    busy0, own0 = cpu_busy_s(), own_cpu_s()
    try:
        proc = subprocess.run(argv, env=env, cwd=common.REPO_DIR, capture_output=True,
                              text=True, timeout=TIMEOUT.get(job.workload, 900))
        log.write(f"=== {job.key} rc={proc.returncode}\n{proc.stdout[-4000:]}\n"
                  f"{proc.stderr[-8000:]}\n")
        log.flush()
        if proc.returncode != 0:
            tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
            return {"error": f"exit {proc.returncode}: {tail}"}
        with open(result_path) as f:
            result = json.load(f)
    except subprocess.TimeoutExpired:
        return {"error": "timed out"}
    finally:
        os.unlink(result_path)
        if not keep:
            try:
                common.drop_database(db)
            except Exception as exc:
                log.write(f"drop {db}: {exc}\n")
    wall = time.monotonic() - t0
    result["wall_s"] = wall
    # CPU the machine spent on anything but this job's processes (the PostgreSQL
    # server counts as foreign here, so for PostgreSQL jobs this is an upper bound).
    foreign = (cpu_busy_s() - busy0) - (own_cpu_s() - own0)
    result["foreign_cpu_share"] = max(0.0, foreign) / (wall * (os.cpu_count() or 1))
    result["calm_before"] = calm
    result["src"] = src
    result["started_at"] = started_at
    return result


# -- reporting ------------------------------------------------------------------------


def values(results: dict[str, list[dict[str, Any]]], key: str, metric: str) -> list[float]:
    return [r["metrics"][metric] for r in results.get(key, [])
            if "metrics" in r and metric in r["metrics"]]


def med(vals: list[float]) -> float | None:
    return statistics.median(vals) if vals else None


def fmt_num(x: float | None) -> str:
    if x is None:
        return "–"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    if abs(x) >= 100:
        return f"{x:.0f}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    if abs(x) >= 1:
        return f"{x:.2f}"
    return f"{x:.3f}"


def fmt_cell(vals: list[float]) -> str:
    if not vals:
        return "–"
    if len(vals) == 1:
        return fmt_num(vals[0])
    return f"{fmt_num(med(vals))} [{fmt_num(min(vals))}–{fmt_num(max(vals))}]"


def ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None or b == 0:
        return "–"
    r = a / b
    return f"{r:.2f}×" if abs(r) >= 0.1 else f"{r:.3f}×"


def w4_key(results: dict[str, list[dict[str, Any]]], n: int) -> str:
    key = f"W4x{n}/perdure/postgres"
    return "W3/perdure/postgres" if n == 1 and key not in results else key


def build_rows(results: dict[str, list[dict[str, Any]]], stores: list[str],
               workers: list[int], w7_made: dict[str, Any] | None) -> list[list[str]]:
    big = "big store"
    if w7_made:
        big = f"{w7_made['finished_runs']:,} finished + {w7_made['waiting_runs']:,} waiting"
    rows: list[list[str]] = []

    def add(store: str, workload: str, label: str, key: str, metric: str, *,
            dbos_key: str | None = None, floor: tuple[str, str] | None = None,
            target: str = "", check: Any = None, adjacent: str | None = None) -> None:
        p = values(results, key, metric)
        d = values(results, dbos_key, metric) if dbos_key else []
        f = med(values(results, floor[0], floor[1])) if floor else None
        pm, dm = med(p), med(d)
        xf = med(values(results, key, adjacent)) if adjacent else None
        verdict = ""
        if check is not None and pm is not None:
            verdict = "PASS" if check(pm, dm, xf if adjacent else f) else "MISS"
        if not p and not d:
            errs = [r.get("error") for r in results.get(key, []) if "error" in r]
            if errs:
                verdict = f"ERROR: {errs[0][:60]}"
            elif key not in results:
                return
        floor_cell = ratio(pm, f) if floor else ""
        if adjacent and xf is not None:
            floor_cell = f"{xf:.2f}× (adjacent)"
        rows.append([store, workload, label, fmt_cell(p), fmt_cell(d) if dbos_key else "n/a",
                     ratio(pm, dm) if dbos_key else "", floor_cell, target, verdict])

    for s in stores:
        fk = f"FLOOR/floor/{s}"
        if fk in results:
            for metric, label in (("commit_us_1conn", "µs per commit, 1 conn"),
                                  ("commits_per_s_1conn", "commits/s, 1 conn"),
                                  ("commits_per_s_8conn", "commits/s, 8 conns")):
                vals = values(results, fk, metric)
                rows.append([s, "floor", label, fmt_cell(vals), "", "", "", "", ""])
        floor_us = (fk, "commit_us_1conn")
        floor8 = (fk, "commits_per_s_8conn")
        # W1
        add(s, "W1", "floor µs per commit, probed next to the run", f"W1/perdure/{s}",
            "floor_us_adjacent", dbos_key=f"W1/dbos/{s}")
        add(s, "W1", "µs per step (start→result, 500×10 seq.)", f"W1/perdure/{s}", "us_per_step",
            dbos_key=f"W1/dbos/{s}", floor=floor_us, target="≤ 1.5× floor",
            adjacent="x_floor", check=lambda p, d, f: f is not None and f <= 1.5)
        add(s, "W1", "µs per step inside the engine", f"W1/perdure/{s}",
            "us_per_step_in_engine", dbos_key=f"W1/dbos/{s}", floor=floor_us,
            adjacent="x_floor_in_engine")
        add(s, "W1", "ms per workflow, p99", f"W1/perdure/{s}", "wf_ms_p99",
            dbos_key=f"W1/dbos/{s}")
        # W2
        limit = 1.0 if s == "sqlite" else 2.0
        add(s, "W2", "ms per workflow (no steps, start→result)", f"W2/perdure/{s}",
            "ms_per_workflow", dbos_key=f"W2/dbos/{s}",
            floor=(fk, "commit_ms_1conn"), target=f"≤ {limit:g} ms", adjacent="x_floor",
            check=lambda p, d, f, limit=limit: p <= limit)
        add(s, "W2", "ms per workflow inside the engine", f"W2/perdure/{s}", "ms_in_engine",
            dbos_key=f"W2/dbos/{s}")
        # W3
        want = 5000 if s == "sqlite" else 3000
        tgt = f"≥ {want:,}" + (" and ≥ 12× DBOS" if s == "postgres" else "")
        add(s, "W3", "steps/s (2,000×10 queued, 1 worker process)", f"W3/perdure/{s}",
            "steps_per_s", dbos_key=f"W3/dbos/{s}", floor=floor8, target=tgt,
            check=lambda p, d, f, want=want, s=s: p >= want and (
                s != "postgres" or d is None or p >= 12 * d))
        if s == "postgres":
            for n in workers:
                add(s, "W4", f"steps/s with {n} worker process(es)", w4_key(results, n),
                    "steps_per_s", floor=floor8, target="curve")
        # W5
        add(s, "W5", "signal → next step, p50 ms", f"W5/perdure/{s}", "p50_ms",
            dbos_key=f"W5/dbos/{s}", target="≤ 3 ms", check=lambda p, d, f: p <= 3)
        add(s, "W5", "signal → next step, p99 ms", f"W5/perdure/{s}", "p99_ms",
            dbos_key=f"W5/dbos/{s}", target="≤ 10 ms", check=lambda p, d, f: p <= 10)
        # W9
        add(s, "W9", "update → answer (round trip), p50 ms", f"W9/perdure/{s}", "p50_ms",
            target="≤ 5 ms", check=lambda p, d, f: p <= 5)
        add(s, "W9", "update → answer (round trip), p99 ms", f"W9/perdure/{s}", "p99_ms")
        # W6
        add(s, "W6", "new worker start → first resumed step, s", f"W6/perdure/{s}", "resume_s")
        add(s, "W6", "… of which the lease still had to run, s", f"W6/perdure/{s}",
            "lease_left_s")
        add(s, "W6", "… the rest (engine overhead), s", f"W6/perdure/{s}", "overhead_s",
            target="≤ 0.5 s", check=lambda p, d, f: p <= 0.5)
        add(s, "W6", "finished steps re-run", f"W6/perdure/{s}", "finished_steps_rerun",
            target="0", check=lambda p, d, f: p == 0)
        # W7
        add(s, "W7", "claim p99 ms, empty store", f"W7/perdure/{s}", "claim_p99_ms_empty")
        add(s, "W7", f"claim p99 ms, {big}", f"W7/perdure/{s}",
            "claim_p99_ms_big")
        add(s, "W7", "claim p99 big/empty", f"W7/perdure/{s}", "claim_p99_ratio",
            target="≤ 2×", check=lambda p, d, f: p <= 2)
        add(s, "W7", "W1 workflow p99 ms, empty store", f"W7/perdure/{s}", "w1_wf_p99_ms_empty")
        add(s, "W7", f"W1 workflow p99 ms, {big}", f"W7/perdure/{s}", "w1_wf_p99_ms_big")
        add(s, "W7", "W1 workflow p99 big/empty", f"W7/perdure/{s}", "w1_p99_ratio",
            target="≤ 2×", check=lambda p, d, f: p <= 2)
        # W8
        add(s, "W8", "RSS MB, fresh worker (concurrency 1000), empty store", f"W8/perdure/{s}",
            "rss_mb_fresh_empty")
        add(s, "W8", "RSS MB, fresh worker (concurrency 1000), 10k waiting", f"W8/perdure/{s}",
            "rss_mb_fresh_10k_waiting")
        add(s, "W8", "RSS cost of 10k waiting runs, MB", f"W8/perdure/{s}", "waiting_cost_mb",
            target="≈ 0", check=lambda p, d, f: p <= 5)
        add(s, "W8", "RSS MB, default worker, before → after parking 10k", f"W8/perdure/{s}",
            "rss_mb_default_before_parking")
        add(s, "W8", "… after parking 10k", f"W8/perdure/{s}", "rss_mb_default_after_parking")
        add(s, "W8", "worker RSS MB with 1k running", f"W8/perdure/{s}", "rss_mb_1k_running",
            target="≤ 150 MB", check=lambda p, d, f: p <= 150)
    return rows


def render(rows: list[list[str]]) -> str:
    head = ["store", "workload", "metric", "perdure", "DBOS", "perdure/DBOS",
            "perdure/floor", "target", "verdict"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def machine() -> dict[str, str]:
    def sh(cmd: str) -> str:
        try:
            return subprocess.run(cmd, shell=True, capture_output=True, text=True,
                                  timeout=20).stdout.strip()
        except Exception:
            return "?"

    cpu = sh("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2").strip()
    tmp = tempfile.gettempdir()
    dev = sh(f"df --output=source {tmp} | tail -1")
    info = {
        "nproc": sh("nproc"),
        "cpu": cpu,
        "memory": sh("free -h | awk '/Mem:/ {print $2}'"),
        "disk": f"{dev} ({sh(f'df -h --output=size {tmp} | tail -1')}, "
                f"rotational={sh('cat /sys/block/' + os.path.basename(dev) + '/queue/rotational')}"
                f", fs={sh(f'df --output=fstype {tmp} | tail -1')}) holding {tmp} and the "
                f"PostgreSQL data directory",
        "kernel": platform.release(),
        "python": platform.python_version(),
        "perdure_commit": sh(f"git -C {common.REPO_DIR} rev-parse --short HEAD"),
        "perdure_tree": sh(f"git -C {common.REPO_DIR} status --porcelain -- src | wc -l")
        + " uncommitted/untracked paths under src/ (benchmarked as checked out)",
        "sqlite": sh(f"{sys.executable} -c 'import sqlite3; print(sqlite3.sqlite_version)'"),
    }
    for pkg in ("dbos", "psycopg", "psycopg-pool", "SQLAlchemy", "py-spy"):
        info[pkg] = sh(f"{sys.executable} -c \"import importlib.metadata as m; "
                       f"print(m.version('{pkg}'))\"")
    try:
        import psycopg

        with psycopg.connect(common.PG_ADMIN) as conn:
            info["postgresql"] = conn.execute("SHOW server_version").fetchone()[0]
            for k in ("fsync", "synchronous_commit", "shared_buffers", "max_connections"):
                info[f"pg {k}"] = conn.execute(f"SHOW {k}").fetchone()[0]
    except Exception as exc:
        info["postgresql"] = f"unreachable: {exc}"
    return info


def extra_notes(results: dict[str, list[dict[str, Any]]], workers: list[int]) -> str:
    lines = []
    curve = []
    for n in workers:
        v = values(results, w4_key(results, n), "steps_per_s")
        if v:
            curve.append(f"{n} → {fmt_num(med(v))} steps/s")
    if curve:
        lines.append("W4 curve (PostgreSQL, perdure): " + ", ".join(curve))
    spent = []
    for key in sorted(k for k in results if k.startswith(("W3/perdure/", "W4x"))):
        cpus = [r["detail"]["cpu"] for r in results[key] if "cpu" in r.get("detail", {})]
        if cpus:
            m = {f: statistics.median(c[f] for c in cpus) for f in cpus[0]}
            spent.append(f"{key} {m['worker_cpu_us_per_step']:,.0f} / "
                         f"{m['server_cpu_us_per_step']:,.0f} / {m['machine_cpu_us_per_step']:,.0f} µs, "
                         f"{100 * m['machine_busy_share']:.0f}% busy")
    if spent:
        lines.append("CPU per step while draining (worker processes / PostgreSQL server / whole "
                     "machine, medians) and the busy share of both cores: " + "; ".join(spent))
    shares = [(k, r["foreign_cpu_share"]) for k, rs in results.items() for r in rs
              if "foreign_cpu_share" in r]
    if shares:
        sq = [v for k, v in shares if k.endswith("/sqlite")]
        hi = sorted(shares, key=lambda kv: -kv[1])[:3]
        lines.append(
            "Machine shared with other work: CPU used by processes outside each job, as a share "
            f"of both cores: SQLite jobs median {100 * statistics.median(sq):.0f}% "
            f"(max {100 * max(sq):.0f}%)" if sq else "Machine shared with other work")
        lines.append("Busiest neighbours during: " + ", ".join(
            f"{k} {100 * v:.0f}%" for k, v in hi) + " (PostgreSQL jobs count the server too)")
    srcs = sorted({r["src"] for rs in results.values() for r in rs if "src" in r})
    if len(srcs) > 1:
        lines.append(f"perdure's source changed during the run: "
                     f"{len(srcs)} versions ({', '.join(srcs)}); latest.json has each job's")
    for key, rs in sorted(results.items()):
        errs = [r["error"] for r in rs if "error" in r]
        if errs:
            lines.append(f"{key}: {len(errs)} failed run(s): {errs[0]}")
    return "\n".join(f"- {ln}" for ln in lines)


def run_all(jobs: list[Job], repeats: int, args: argparse.Namespace, log: Any,
            templates: dict[str, Any], results: dict[str, list[dict[str, Any]]],
            report: Any = None) -> None:
    for r in range(repeats):
        for job in jobs:
            t0 = time.monotonic()
            if job.workload == "W7" and job.store in templates and \
                    templates[job.store][1].get("sql") != source_hash("store/sql"):
                common.drop_database(templates.pop(job.store)[0])
                templates.update(make_templates(jobs, args, log, {job.store}))
            res = run_job(job, args, log, templates=templates)
            results.setdefault(job.key, []).append(res)
            if report is not None:
                report(final=False)
            shown = res.get("error") or ", ".join(
                f"{k}={fmt_num(v)}" for k, v in res.get("metrics", {}).items())
            print(f"{res.get('started_at', '')} src {res.get('src', '?')} "
                  f"[{r + 1}/{repeats}] {job.key:28s} {time.monotonic() - t0:6.1f}s "
                  f"(foreign CPU {100 * res.get('foreign_cpu_share', 0):.0f}%)  {shown}",
                  flush=True)


def rerender(args: argparse.Namespace) -> None:
    with open(args.report) as f:
        data = json.load(f)
    results = data["results"]
    stores = [s for s in ("sqlite", "postgres") if any(k.endswith("/" + s) for k in results)]
    workers = sorted({int(k[3:].split("/")[0]) for k in results if k.startswith("W4x")} | {1})
    table = render(build_rows(results, stores, workers, data.get("w7_store")))
    print(table)
    print(extra_notes(results, workers))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer items, 1 repeat")
    parser.add_argument("--only", help="comma-separated workloads, e.g. W1,W3 (FLOOR included "
                        "automatically when a ratio needs it)")
    parser.add_argument("--stores", default="sqlite,postgres")
    parser.add_argument("--engines", default="perdure,dbos")
    parser.add_argument("--repeats", type=int, default=None, help="default 3 (1 with --quick)")
    parser.add_argument("--workers", default="1,2,4", help="W4 worker process counts")
    parser.add_argument("--w7-scale", type=float, default=None,
                        help="W7 store size as a fraction of 1M finished + 100k waiting runs "
                             "(default 1, or 0.01 with --quick)")
    parser.add_argument("--calm", type=float, default=0.0,
                        help="before each job wait until the machine is less busy than this "
                             "share of its CPUs over 1 s (0 disables)")
    parser.add_argument("--patience", type=float, default=20.0,
                        help="the longest wait for calm before a job, in seconds")
    parser.add_argument("--out", default=os.path.join(common.OUT_DIR, "latest.md"))
    parser.add_argument("--report", metavar="JSON",
                        help="run nothing: re-render the table of an earlier run's latest.json")
    args = parser.parse_args()
    if args.report:
        rerender(args)
        return
    if args.only:
        wanted = {w.strip().upper() for w in args.only.split(",")}
        if wanted & {"W1", "W2", "W3", "W4"}:
            wanted.add("FLOOR")
        args.only = ",".join(w for w in ALL if w in wanted)
    repeats = args.repeats or (1 if args.quick else 3)
    jobs = plan(args)
    os.makedirs(common.OUT_DIR, exist_ok=True)
    command = " ".join(["bench/run.sh", *(shlex.quote(a) for a in sys.argv[1:])])
    started = dt.datetime.now(dt.UTC)
    results: dict[str, list[dict[str, Any]]] = {}
    log_path = os.path.join(common.OUT_DIR, "latest.log")
    print(f"{len(jobs)} jobs × {repeats} repeats; log in {log_path}", flush=True)
    info = machine()
    stores = [s.strip() for s in args.stores.split(",")]
    workers = [int(x) for x in args.workers.split(",")]
    templates: dict[str, Any] = {}

    def report(final: bool) -> str:
        w7_made = next((made for _, made in templates.values()), None)
        # derived floor metric used by W2's perdure/floor column
        for s in stores:
            for res in results.get(f"FLOOR/floor/{s}", []):
                if "metrics" in res:
                    res["metrics"]["commit_ms_1conn"] = res["metrics"]["commit_us_1conn"] / 1e3
        table = render(build_rows(results, stores, workers, w7_made))
        now = dt.datetime.now(dt.UTC)
        done = sum(len(v) for v in results.values())
        text = "\n".join([
            f"# perdure benchmark — {now:%Y-%m-%d %H:%M} UTC"
            + ("" if final else f" (IN PROGRESS: {done}/{len(jobs) * repeats} jobs)"),
            "",
            f"Command: `{command}` ({repeats} repeat(s), "
            f"{(now - started).total_seconds() / 60:.1f} min)",
            "",
            "Machine and versions: " + "; ".join(f"{k}: {v}" for k, v in info.items()),
            "",
            "Cells: median [min–max] over the repeats. perdure/DBOS and perdure/floor are ratios "
            "of medians (for µs and ms lower is better, for steps/s higher is better). "
            "perdure/floor: W1 µs per step ÷ µs per commit on 1 connection and W2 time per "
            "workflow ÷ time per commit, each against a floor probe taken inside the same job "
            "right before and after the timed loop (median of the per-run ratios; the disk's "
            "fsync latency drifts by several × over minutes here); W3/W4 steps/s ÷ the FLOOR "
            "job's commits/s with 8 connections.",
            "",
            table,
            "",
            extra_notes(results, workers),
            "",
        ])
        with open(args.out, "w") as f:
            f.write(text)
        with open(os.path.splitext(args.out)[0] + ".json", "w") as f:
            json.dump({"command": command, "machine": info, "repeats": repeats,
                       "w7_store": w7_made, "results": results}, f, indent=1, default=str)
        return table

    with open(log_path, "w") as log:
        templates.update(make_templates(jobs, args, log))
        try:
            run_all(jobs, repeats, args, log, templates, results, report)
        finally:
            for tdb, _ in templates.values():
                common.drop_database(tdb)
    table = report(final=True)
    print()
    print(table)
    print(extra_notes(results, workers))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
