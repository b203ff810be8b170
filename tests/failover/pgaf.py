"""A pg_auto_failover formation on loopback: a monitor, a primary, a synchronous standby.

Everything lives in a temporary directory on free ports and is stopped at
teardown, even when the test fails. The binaries come from Debian's
``postgresql-NN-auto-failover`` package; without them the tests skip (and fail
on CI, where the package is installed by ``.ci/run``).
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import psycopg

# The monitor's defaults take about 30 s to fail over; the test wants seconds.
MONITOR_SETTINGS = {
    "pgautofailover.health_check_period": "1000",
    "pgautofailover.health_check_retry_delay": "500",
    "pgautofailover.health_check_timeout": "1000",
    "pgautofailover.health_check_max_retries": "1",
    "pgautofailover.node_considered_unhealthy_timeout": "3000",
    "pgautofailover.primary_demote_timeout": "5000",
}


def _bindir() -> str | None:
    """The bin directory of the PostgreSQL version pg_auto_failover is built for."""
    controls = sorted(glob.glob("/usr/share/postgresql/*/extension/pgautofailover.control"))
    for control in reversed(controls):
        bindir = f"/usr/lib/postgresql/{Path(control).parts[4]}/bin"
        if os.path.exists(f"{bindir}/pg_ctl"):
            return bindir
    return None


def missing_binaries() -> str | None:
    """Why the formation cannot be started here, or None."""
    if shutil.which("pg_autoctl") is None:
        return "pg_autoctl is not installed (apt-get install postgresql-15-auto-failover)"
    if _bindir() is None:
        return "no PostgreSQL server with the pgautofailover extension is installed"
    if os.getuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and there is no postgres user to run pg_autoctl as"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Formation:
    """A monitor and two data nodes, each a ``pg_autoctl run`` in its own process group."""

    def __init__(self, root: Path) -> None:
        self.root = root
        bindir = _bindir()
        assert bindir is not None
        self.pg_ctl = f"{bindir}/pg_ctl"
        self.env = {
            "PATH": f"{bindir}:/usr/local/bin:/usr/bin:/bin",
            "HOME": str(root),
            # pg_autoctl keeps its configuration, state and pid files under these.
            "XDG_CONFIG_HOME": str(root / "config"),
            "XDG_DATA_HOME": str(root / "data"),
            "XDG_RUNTIME_DIR": str(root / "run"),
            "LANG": "C.UTF-8",
        }
        self.monitor_port = free_port()
        self.ports = {"node1": free_port(), "node2": free_port()}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.database = "perdure"

    # -- commands -----------------------------------------------------------

    def _argv(self, *args: str) -> list[str]:
        # initdb and pg_autoctl refuse to run as root.
        prefix = ["runuser", "-u", "postgres", "--"] if os.getuid() == 0 else []
        env = [f"{k}={v}" for k, v in self.env.items()]
        return [*prefix, "env", "-i", *env, "pg_autoctl", *args]

    def autoctl(self, *args: str, timeout: float = 120) -> str:
        done = subprocess.run(
            self._argv(*args), capture_output=True, text=True, timeout=timeout, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"pg_autoctl {' '.join(args)} exited {done.returncode}:\n{done.stderr[-4000:]}"
            )
        return done.stdout

    def run(self, name: str) -> None:
        log = open(self.root / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        self.procs[name] = subprocess.Popen(
            self._argv("run", "--pgdata", str(self.root / name)),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()

    def log(self, name: str) -> str:
        return (self.root / f"{name}.log").read_text(errors="replace")[-4000:]

    # -- set-up -------------------------------------------------------------

    @property
    def monitor_url(self) -> str:
        return f"postgresql://autoctl_node@127.0.0.1:{self.monitor_port}/pg_auto_failover"

    @property
    def url(self) -> str:
        """The multi-host URL perdure connects with."""
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.ports.values())
        return f"postgresql://postgres@{hosts}/{self.database}?target_session_attrs=read-write"

    def node_url(self, name: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.ports[name]}/{self.database}"

    def start(self) -> None:
        common = ["--hostname", "127.0.0.1", "--auth", "trust", "--no-ssl", "--pgctl", self.pg_ctl]
        self.autoctl(
            "create", "monitor", "--pgdata", str(self.root / "monitor"),
            "--pgport", str(self.monitor_port), *common,
        )  # fmt: skip
        self.run("monitor")
        self.wait(lambda: self._monitor_answers(), 60, "the monitor to accept connections")
        with psycopg.connect(
            f"postgresql://postgres@127.0.0.1:{self.monitor_port}/pg_auto_failover",
            autocommit=True,
        ) as conn:
            for name, value in MONITOR_SETTINGS.items():
                conn.execute(f"ALTER SYSTEM SET {name} = {value}")
            conn.execute("SELECT pg_reload_conf()")
        for name in self.ports:
            self.autoctl(
                "create", "postgres", "--pgdata", str(self.root / name),
                "--pgport", str(self.ports[name]), "--listen", "127.0.0.1",
                "--name", name, "--monitor", f"{self.monitor_url}?sslmode=disable",
                "--dbname", self.database, "--username", "postgres", *common,
            )  # fmt: skip
            self.run(name)
            want = {"node1": "single"} if name == "node1" else None
            self.wait(lambda want=want: self.healthy(want), 120, f"{name} to join")

    def _monitor_answers(self) -> bool:
        try:
            psycopg.connect(self.monitor_url, connect_timeout=1).close()
            return True
        except psycopg.Error:
            return False

    def states(self) -> dict[str, tuple[str, str]]:
        """Each node's (reported, assigned) state, from the monitor."""
        with psycopg.connect(self.monitor_url, connect_timeout=2) as conn:
            rows = conn.execute(
                "SELECT nodename, reportedstate::text, goalstate::text FROM pgautofailover.node"
            ).fetchall()
        return {name: (reported, goal) for name, reported, goal in rows}

    def promoted_at(self, name: str) -> float | None:
        """When the monitor saw ``name`` report itself writable (epoch seconds), or None."""
        with psycopg.connect(self.monitor_url, connect_timeout=2) as conn:
            row = conn.execute(
                "SELECT extract(epoch FROM min(eventtime)) FROM pgautofailover.event"
                " WHERE nodename = %s AND reportedstate IN ('wait_primary', 'primary')",
                [name],
            ).fetchone()
        return None if row is None or row[0] is None else float(row[0])

    def healthy(self, want: dict[str, str] | None = None) -> bool:
        """Whether the nodes are in the wanted states (default: primary + sync secondary)."""
        try:
            states = self.states()
        except psycopg.Error:
            return False
        want = want or {"node1": "primary", "node2": "secondary"}
        if any(states.get(name) != (state, state) for name, state in want.items()):
            return False
        if "node2" not in want:
            return True
        with psycopg.connect(self.node_url("node1"), connect_timeout=2) as conn:
            rows = conn.execute("SELECT sync_state FROM pg_stat_replication").fetchall()
        return [r[0] for r in rows] in (["sync"], ["quorum"])

    def wait(self, ready: Any, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            if time.monotonic() > deadline:
                logs = "\n".join(f"--- {n}\n{self.log(n)}" for n in self.procs)
                raise TimeoutError(f"waited {timeout:.0f} s for {what}\n{logs}")
            time.sleep(0.2)

    # -- faults and teardown ------------------------------------------------

    def postmaster(self, name: str) -> int | None:
        try:
            return int((self.root / name / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def crash(self, name: str) -> None:
        """SIGKILL the node's pg_autoctl and its postmaster at once: the host is gone."""
        pid = self.postmaster(name)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.procs[name].pid, signal.SIGKILL)
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def stop(self) -> None:
        for name in [*self.ports, "monitor"]:
            proc = self.procs.get(name)
            if proc is None or proc.poll() is not None:
                continue
            with contextlib.suppress(Exception):
                self.autoctl("stop", "--pgdata", str(self.root / name), timeout=30)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=30)
        for name, proc in self.procs.items():
            pid = self.postmaster(name)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
