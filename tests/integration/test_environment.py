"""perdure.testing.Environment: a throwaway store, an in-process worker and a fake clock."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import perdure
from perdure.testing import Busy, Environment, FakeClock, faults, temporary_store

DOCS = Path(__file__).resolve().parents[2] / "docs"
sys.path.insert(0, str(DOCS / "examples"))

import onboarding  # noqa: E402 - docs/examples/onboarding.py, the page's example


def make_app(url: str | None = None) -> perdure.App:
    app = perdure.App(url, name=f"env_{uuid.uuid4().hex[:8]}")
    calls: dict[str, int] = {"charge": 0}

    @app.step(effect="once")
    def charge(cents: int) -> str:
        calls["charge"] += 1
        return f"ch_{cents}"

    @app.workflow()
    def nap(ctx: perdure.Context, hours: float) -> str:
        ctx.sleep(timedelta(hours=hours))
        return ctx.now().isoformat()

    @app.workflow()
    def approval(ctx: perdure.Context) -> Any:
        try:
            return ctx.wait("go", timeout=timedelta(hours=1))
        except perdure.WaitTimedOut:
            return "timed out"

    @app.workflow()
    def parent(ctx: perdure.Context, n: int) -> list[Any]:
        handles = [ctx.start_child(nap, 0.5) for _ in range(n)]
        return [charge(100), *[h.result() for h in handles]]

    @app.workflow()
    async def concurrent(ctx: perdure.Context) -> str:
        return str(await ctx.astep(_async_double, 21))

    @app.workflow()
    def chain(ctx: perdure.Context, depth: int) -> int:
        return int(ctx.start_child(chain, depth + 1).result())

    app.calls = calls  # type: ignore[attr-defined]
    return app


async def _async_double(n: int) -> int:
    return n * 2


# -- the page's example ------------------------------------------------------------------


@pytest.mark.perdure_app(onboarding.app)
def test_the_docs_example_runs_a_day_and_a_signal_in_well_under_a_second(
    perdure_env: Environment,
) -> None:
    began = time.perf_counter()
    onboarding.sent.clear()
    handle = perdure_env.start(onboarding.onboarding, "ada")
    perdure_env.run_until_idle()
    assert handle.status() == "waiting"  # asleep for a day
    assert onboarding.sent == ["welcome:ada"]

    perdure_env.advance(timedelta(days=1))
    assert onboarding.sent == ["welcome:ada", "tips:ada"]
    assert [w.name for w in perdure_env.app.waits(handle.run_id)] == ["upgrade"]

    perdure_env.app.signal(handle.run_id, "upgrade", "pro")
    perdure_env.run_until_idle()
    assert handle.result(timeout=0) == {"user": "ada", "plan": "pro"}
    assert time.perf_counter() - began < 1.0  # a day of workflow time

    other = perdure_env.start(onboarding.onboarding, "bob")
    perdure_env.run_until_idle()
    perdure_env.advance(timedelta(days=8))  # the sleep ends, then the week's timeout
    assert other.result(timeout=0) == {"user": "bob", "plan": "free"}


# -- the environment -----------------------------------------------------------------------


def test_an_app_built_on_a_fake_clock_keeps_it() -> None:
    clock = FakeClock()
    app = perdure.App(name="clocked", clock=clock)

    @app.workflow()
    def nap(ctx: perdure.Context) -> str:
        ctx.sleep(timedelta(hours=1))
        return "up"

    with Environment(app) as env:
        assert env.clock is clock
        handle = env.start(nap)
        env.run_until_idle()
        clock.advance(hours=1)  # the app's own clock: nothing runs until asked
        assert handle.status() == "waiting"
        env.run_until_idle()
        assert handle.result(timeout=0) == "up"


def test_run_until_idle_runs_children_and_async_workflows() -> None:
    app = make_app()
    with Environment(app) as env:
        handle = env.start("parent", 3)
        assert handle.status() == "queued"
        ran = env.run_until_idle()
        # The parent parks on its first child; each child sleeps half an hour.
        assert ran >= 4 and handle.status() == "waiting"
        assert env.run_until_idle() == 0
        env.advance(timedelta(minutes=30))
        result = handle.result(timeout=0)
        assert result[0] == "ch_100" and len(result) == 4
        assert app.calls["charge"] == 1  # type: ignore[attr-defined]
        assert env.app.children(handle.run_id) == {"succeeded": 3}

        concurrent = env.start("concurrent")
        env.run_until_idle()
        assert concurrent.result(timeout=0) == "42"


def test_advance_wakes_a_sleep_only_once_it_is_due() -> None:
    app = make_app()
    with Environment(app) as env:
        started = env.now()
        handle = env.start("nap", 2)
        env.run_until_idle()
        env.advance(timedelta(hours=1, minutes=59))
        assert handle.status() == "waiting"
        env.advance(timedelta(minutes=1))
        assert handle.result(timeout=0) == (started + timedelta(hours=2)).isoformat()


def test_a_wait_times_out_when_the_clock_passes_its_deadline() -> None:
    app = make_app()
    with Environment(app) as env:
        late = env.start("approval")
        on_time = env.start("approval")
        env.run_until_idle()
        env.app.signal(on_time.run_id, "go", {"ok": True})
        env.run_until_idle()
        assert on_time.result(timeout=0) == {"ok": True}
        assert late.status() == "waiting"
        env.advance(timedelta(hours=1))
        assert late.result(timeout=0) == "timed out"


def test_a_run_that_never_rests_is_reported() -> None:
    app = make_app()
    with Environment(app) as env:
        env.start("chain", 0)
        with pytest.raises(Busy, match="after 5 executions"):
            env.run_until_idle(max_executions=5)


def test_the_app_gets_its_own_store_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PERDURE_STORE", raising=False)
    url = f"sqlite:///{tmp_path / 'own.db'}"
    app = make_app(url)
    try:
        with Environment(app) as env:
            env.start("nap", 1)
            assert app.store is env.store and app.store.url != url
            assert len(app.runs()) == 1
        assert app.url == url and app.runs() == []
    finally:
        app.close()
    assert sorted(p.name for p in tmp_path.iterdir())[0] == "own.db"
    outside = make_app()  # no URL: an environment never opens the default store
    with Environment(outside) as env:
        env.start("nap", 1)
        env.run_until_idle()
    assert not (tmp_path / "perdure.db").exists()


def test_an_environment_opens_on_first_use_without_with() -> None:
    app = make_app()
    env = Environment(app)
    try:
        handle = env.start("nap", 1)
        env.advance(timedelta(hours=1))
        assert handle.status() == "succeeded"
    finally:
        env.close()
    # Each environment starts from an empty store.
    with Environment(app) as again:
        assert again.app.runs() == []


@pytest.mark.postgres
def test_the_environment_on_postgresql(postgres_url: str) -> None:
    app = make_app()
    with Environment(app, store=postgres_url) as env:
        assert env.store.url.startswith("postgresql")
        handle = env.start("nap", 24)
        env.run_until_idle()
        env.advance(timedelta(days=1))
        assert handle.status() == "succeeded"


def test_temporary_store_moved_to_perdure_testing_and_stays_in_faults() -> None:
    assert faults.temporary_store is temporary_store
    with temporary_store() as store:
        assert store.url.startswith("sqlite:///") and store.list_runs("any") == []


# -- FakeClock wakes a worker at once --------------------------------------------------------


def test_advancing_a_fake_clock_wakes_a_worker_without_waiting_for_its_poll(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    app = perdure.App(f"sqlite:///{tmp_path / 'w.db'}", name="woken", clock=clock)

    @app.workflow()
    def nap(ctx: perdure.Context) -> str:
        ctx.sleep(timedelta(days=1))
        return "rested"

    try:
        # A poll of a minute: only the clock's notification can wake it in time.
        worker = app.worker(lease_ttl=3, heartbeat=1, poll_interval=60, liveness="thread")
        with worker:
            handle = app.start(nap)
            deadline = time.monotonic() + 10
            while handle.status() != "waiting":
                assert time.monotonic() < deadline
                time.sleep(0.01)
            clock.advance(days=1)
            assert handle.result(timeout=10) == "rested"
    finally:
        app.close()


# -- the pytest plugin ------------------------------------------------------------------------

PLUGIN_TESTS = textwrap.dedent(
    """
    from datetime import timedelta

    import pytest

    import perdure

    app = perdure.App(name="plugged")


    @app.workflow()
    def nap(ctx: perdure.Context) -> str:
        ctx.sleep(timedelta(days=3))
        return "ok"


    @pytest.fixture
    def perdure_app():
        return app


    def test_with_the_fixture(perdure_env):
        handle = perdure_env.start(nap)
        perdure_env.run_until_idle()
        perdure_env.advance(timedelta(days=3))
        assert handle.result(timeout=0) == "ok"


    other = perdure.App(name="marked")


    @other.workflow()
    def quick(ctx: perdure.Context) -> int:
        return 7


    @pytest.mark.perdure_app(other)
    def test_with_the_mark(perdure_env):
        assert perdure_env.app is other
        handle = perdure_env.start(quick)
        perdure_env.run_until_idle()
        assert handle.result(timeout=0) == 7
    """
)


def test_the_pytest_plugin_is_installed_and_gives_perdure_env(tmp_path: Path) -> None:
    (tmp_path / "test_plugged.py").write_text(PLUGIN_TESTS, encoding="utf-8")
    (tmp_path / "test_unconfigured.py").write_text(
        "def test_missing_app(perdure_env):\n    pass\n", encoding="utf-8"
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "2 passed" in done.stdout, done.stdout + done.stderr
    assert "perdure_app" in done.stdout and "1 error" in done.stdout, done.stdout
    assert not (tmp_path / "perdure.db").exists()
