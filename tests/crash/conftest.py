"""Fixtures of the crash tests: worker processes on a real store (URLs from tests/conftest.py)."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from perdure.store import open_store, port

HERE = Path(__file__).resolve().parent
APP_NAME = "crash"


def skip_unless_adapter(url: str) -> None:
    """Skip a PostgreSQL parametrization while its adapter module does not exist."""
    if (
        url.startswith(("postgresql:", "postgres:"))
        and importlib.util.find_spec("perdure.store.postgres") is None
    ):
        pytest.skip("perdure.store.postgres does not exist yet")


class Workers:
    """Start worker processes of ``crash_app``; stop every one that is left at teardown."""

    def __init__(self, env: dict[str, str], logs: Path) -> None:
        self.env = env
        self.logs = logs
        self.procs: list[subprocess.Popen[bytes]] = []

    def command(self, *, via_cli: bool, lease_ttl: float, heartbeat: float) -> list[str]:
        if via_cli and importlib.util.find_spec("perdure.cli") is not None:
            return [
                sys.executable,
                "-m",
                "perdure",
                "worker",
                "crash_app:app",
                "--concurrency",
                "1",
                "--lease-ttl",
                str(lease_ttl),
                "--heartbeat",
                str(heartbeat),
            ]
        return [sys.executable, "-c", "import crash_app; crash_app.serve()"]

    def start(
        self,
        name: str,
        *,
        via_cli: bool = True,
        lease_ttl: float = 1.0,
        heartbeat: float = 0.3,
        **extra_env: str,
    ) -> subprocess.Popen[bytes]:
        env = {
            **self.env,
            "CRASH_LEASE_TTL": str(lease_ttl),
            "CRASH_HEARTBEAT": str(heartbeat),
            **extra_env,
        }
        log = open(self.logs / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(
            self.command(via_cli=via_cli, lease_ttl=lease_ttl, heartbeat=heartbeat),
            cwd=HERE,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        self.procs.append(proc)
        return proc

    def log(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text(errors="replace")

    def stop(self, proc: subprocess.Popen[bytes], timeout: float = 10.0) -> int:
        """Stop a worker gracefully (SIGCONT first, in case it is frozen), then for sure."""
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.terminate()
            try:
                return proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
        return proc.wait(timeout=timeout)

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
                proc.kill()
                proc.wait(timeout=10)


@pytest.fixture
def crash_env(store_url: str, tmp_path: Path) -> dict[str, str]:
    """The environment of a worker process: store, effects log, import path."""
    skip_unless_adapter(store_url)
    path = [str(HERE), *(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PERDURE_CRASH", "ZOMBIE_"))}
    env.update(
        {
            "PERDURE_STORE": store_url,
            "CRASH_EFFECTS_LOG": str(tmp_path / "effects.log"),
            "PYTHONPATH": os.pathsep.join(path),
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


@pytest.fixture
def workers(crash_env: dict[str, str], tmp_path: Path) -> Iterator[Workers]:
    started = Workers(crash_env, tmp_path)
    yield started
    started.close()


class PlanWorkers(Workers):
    """Worker processes of ``plan_app``, whose tasks record what ran in ``PLAN_LOG``."""

    def command(self, *, via_cli: bool, lease_ttl: float, heartbeat: float) -> list[str]:
        return [sys.executable, "-c", "import plan_app; plan_app.serve()"]

    def serving(self, name: str) -> bool:
        """Whether the worker logged under ``name`` has started serving."""
        path = self.logs / f"{name}.log"
        return path.exists() and b" serving" in path.read_bytes()


@pytest.fixture
def plan_workers(crash_env: dict[str, str], tmp_path: Path) -> Iterator[PlanWorkers]:
    env = {
        **crash_env,
        "PLAN_LOG": str(tmp_path / "plan.log"),
        "PLAN_ENTERED": str(tmp_path / "entered"),
    }
    started = PlanWorkers(env, tmp_path)
    yield started
    started.close()


@pytest.fixture
def store(store_url: str) -> Iterator[port.Store]:
    """The test's own handle on the store the workers use."""
    skip_unless_adapter(store_url)
    opened = open_store(store_url)
    yield opened
    opened.close()
