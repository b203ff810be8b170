"""Helpers shared by the benchmark's orchestrator and its workload modules.

Nothing here imports perdure or DBOS, so every module can use it.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_DIR = os.path.dirname(BENCH_DIR)
OUT_DIR = os.path.join(BENCH_DIR, "out")
PG_ADMIN = os.environ.get("BENCH_PG_ADMIN", "postgresql://postgres@127.0.0.1:5432/postgres")


# -- fresh databases ------------------------------------------------------------


@dataclass
class Database:
    """One fresh database: a SQLite file in its own temp dir, or a PostgreSQL database."""

    kind: str  # "sqlite" | "postgres"
    perdure_url: str
    dbos_url: str
    path: str | None = None  # the SQLite file
    name: str | None = None  # the PostgreSQL database

    def raw_connect(self) -> Any:
        """A plain DB-API connection (sqlite3 or psycopg, autocommit)."""
        if self.kind == "sqlite":
            conn = sqlite3.connect(self.path, timeout=30, isolation_level=None)
            return conn
        import psycopg

        return psycopg.connect(pg_url(self.name), autocommit=True)


def pg_url(name: str) -> str:
    base = PG_ADMIN.rsplit("/", 1)[0]
    return f"{base}/{name}"


def create_database(kind: str) -> Database:
    """Create a fresh, empty database of ``kind``."""
    if kind == "sqlite":
        folder = tempfile.mkdtemp(prefix="perdure-bench-", dir=os.environ.get("BENCH_TMP"))
        path = os.path.join(folder, "bench.db")
        return Database("sqlite", f"sqlite:///{path}", f"sqlite:///{path}", path=path)
    import psycopg

    name = f"bench_{secrets.token_hex(6)}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = pg_url(name)
    return Database("postgres", url, url, name=name)


def drop_database(db: Database) -> None:
    if db.kind == "sqlite":
        assert db.path is not None
        shutil.rmtree(os.path.dirname(db.path), ignore_errors=True)
        return
    import psycopg

    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{db.name}" WITH (FORCE)')


def database_from_env() -> Database:
    """The database the orchestrator made for this workload subprocess."""
    spec = json.loads(os.environ["BENCH_DB"])
    return Database(**spec)


def sqlite_wal_full(path: str) -> tuple[str, int]:
    """Put the SQLite file in WAL mode (persistent) and report (journal_mode, synchronous)."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        conn.execute("PRAGMA synchronous=FULL")
        sync = conn.execute("PRAGMA synchronous").fetchone()[0]
        return str(mode), int(sync)
    finally:
        conn.close()


# -- statistics -----------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of ``values``."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), int(-(-q * len(ordered) // 100))))
    return ordered[rank - 1]


def summary(values: list[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "p50": percentile(values, 50),
        "p90": percentile(values, 90),
        "p99": percentile(values, 99),
        "max": max(values) if values else float("nan"),
        "mean": statistics.fmean(values) if values else float("nan"),
    }


# -- processes ------------------------------------------------------------------


def rss_kib(pid: int) -> int:
    """Resident set size of ``pid`` in KiB (VmRSS), 0 if it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def threads_of(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Threads:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


class CpuLedger:
    """CPU-seconds spent by a set of processes, the PostgreSQL server and the machine.

    Read from /proc at :meth:`mark` and again at :meth:`read`: the workers
    (each worker pid with every process below it, the lease keeper
    included), every process named ``postgres`` (the server: its backends,
    WAL writer and checkpointer), and the whole machine (all cores, busy).
    It is how a throughput run says what a step costs the CPU and how busy
    the cores were, on both sides of the connection.
    """

    def __init__(self, workers: list[int]) -> None:
        self.workers = workers
        self._start: dict[str, float] = {}
        self._t0 = 0.0

    @staticmethod
    def _stat(pid: str) -> tuple[str, int, float] | None:
        try:
            with open(f"/proc/{pid}/stat") as f:
                raw = f.read()
        except OSError:
            return None
        name = raw[raw.index("(") + 1 : raw.rindex(")")]
        fields = raw.rsplit(")", 1)[1].split()
        # utime, stime (and the reaped children's cutime, cstime) in clock ticks.
        ticks = sum(int(x) for x in fields[11:15])
        return name, int(fields[1]), ticks / os.sysconf("SC_CLK_TCK")

    def _sample(self) -> dict[str, float]:
        procs = {pid: s for pid in os.listdir("/proc") if pid.isdigit() and (s := self._stat(pid))}
        below: dict[int, list[int]] = {}
        for pid, (_, ppid, _) in procs.items():
            below.setdefault(ppid, []).append(int(pid))
        workers = 0.0
        todo = list(self.workers)
        while todo:
            pid = todo.pop()
            if str(pid) in procs:
                workers += procs[str(pid)][2]
            todo += below.get(pid, [])
        server = sum(cpu for name, _, cpu in procs.values() if name == "postgres")
        with open("/proc/stat") as f:
            ticks = [int(x) for x in f.readline().split()[1:]]
        busy = (sum(ticks[:8]) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")
        return {"workers": workers, "server": server, "machine": busy}

    def mark(self) -> None:
        self._start, self._t0 = self._sample(), time.monotonic()

    def read(self, steps: int) -> dict[str, float]:
        """CPU per step (µs) of the workers, the server and the machine since mark(),
        and the machine's busy share of all its cores over that time."""
        now, wall = self._sample(), time.monotonic() - self._t0
        spent = {k: now[k] - self._start[k] for k in now}
        cores = os.cpu_count() or 1
        return {
            "worker_cpu_us_per_step": spent["workers"] / steps * 1e6,
            "server_cpu_us_per_step": spent["server"] / steps * 1e6,
            "machine_cpu_us_per_step": spent["machine"] / steps * 1e6,
            "machine_busy_share": spent["machine"] / (wall * cores) if wall > 0 else 0.0,
        }


class Child:
    """A helper process speaking line-based JSON on stdin/stdout."""

    def __init__(self, argv: list[str], env: dict[str, str] | None = None,
                 stderr: Any = None) -> None:
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr,
            text=True, bufsize=1, env={**os.environ, **(env or {})}, cwd=REPO_DIR,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(message) + "\n")
        self.proc.stdin.flush()

    def recv(self, timeout: float = 120.0) -> dict[str, Any]:
        """Read the next JSON line (other lines are skipped)."""
        import select

        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"child {self.pid} said nothing for {timeout}s")
            ready, _, _ = select.select([self.proc.stdout], [], [], left)
            if not ready:
                continue
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"child {self.pid} exited with {self.proc.wait()}")
            line = line.strip()
            if line.startswith("{"):
                return json.loads(line)

    def expect(self, event: str, timeout: float = 120.0) -> dict[str, Any]:
        while True:
            msg = self.recv(timeout)
            if msg.get("event") == event:
                return msg

    def stop(self, timeout: float = 60.0) -> int:
        if self.proc.poll() is None:
            with contextlib.suppress(BrokenPipeError, OSError):
                self.send({"cmd": "stop"})
            try:
                return self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def say(message: dict[str, Any]) -> None:
    """Write one JSON line to stdout for the parent process."""
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def read_command() -> dict[str, Any]:
    """Block until the parent sends a JSON line; EOF counts as stop."""
    line = sys.stdin.readline()
    if not line:
        return {"cmd": "stop"}
    return json.loads(line)


def python() -> str:
    return sys.executable


def write_result(result: dict[str, Any]) -> None:
    """Hand the workload's result to the orchestrator (the file named by BENCH_RESULT)."""
    target = os.environ.get("BENCH_RESULT")
    text = json.dumps(result, indent=1, default=str)
    if target:
        with open(target, "w") as f:
            f.write(text)
    else:
        print(text)


def floor_probe(db: Database, seconds: float = 1.5) -> float:
    """µs per one-row INSERT+COMMIT on one connection, measured now, next to the store.

    The disk's fsync latency on this machine drifts a lot over minutes, so the
    W1/W2 ratios to the floor use a probe taken right next to the measurement.
    SQLite: a separate file in the store's directory (WAL, synchronous=FULL);
    PostgreSQL: a table in the public schema of the store's database.
    """
    if db.kind == "sqlite":
        path = os.path.join(os.path.dirname(db.path), "floor-probe.db")
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("CREATE TABLE IF NOT EXISTS floor (id INTEGER PRIMARY KEY, v TEXT)")

        def insert() -> None:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO floor (v) VALUES ('x')")
            conn.execute("COMMIT")
    else:
        import psycopg

        conn = psycopg.connect(pg_url(db.name), autocommit=True)
        conn.execute("CREATE TABLE IF NOT EXISTS public.bench_floor (id bigserial PRIMARY KEY, "
                     "v text)")

        def insert() -> None:
            conn.execute("INSERT INTO public.bench_floor (v) VALUES ('x')")
    try:
        for _ in range(10):
            insert()
        n = 0
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            insert()
            n += 1
        return (time.perf_counter() - t0) / n * 1e6
    finally:
        conn.close()
