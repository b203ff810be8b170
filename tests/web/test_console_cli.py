"""``perdure tokens`` and ``perdure console`` on the command line."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from click.testing import CliRunner

from perdure import cli
from perdure.store import open_store
from perdure.web import auth


def _run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli.cli, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_tokens_create_list_revoke(sqlite_url: str) -> None:
    code, out, _ = _run(
        "tokens", "create", "--app", "shop", "--scope", "signal", "--expires", "2h",
        "--store", sqlite_url, "--json",
    )  # fmt: skip
    assert code == 0
    made = json.loads(out)
    assert set(made) >= {"token", "id", "app", "scope"}
    assert (made["app"], made["scope"]) == ("shop", "signal")
    assert made["token"].startswith(f"pdt_{made['id']}_")
    store = open_store(sqlite_url)
    try:
        held = auth.token_store(store)
        stored = held.get_token(made["id"])
        assert stored is not None and stored.digest == auth.digest(made["token"].split("_", 2)[2])
        assert auth.check(held, "shop", made["token"], store.now()).scope == "signal"
    finally:
        store.close()
    code, out, err = _run(
        "tokens", "create", "--app", "shop", "--scope", "read", "--store", sqlite_url
    )
    assert code == 0 and out.startswith("pdt_") and "shown only now" in err
    code, out, _ = _run("tokens", "list", "--store", sqlite_url)
    assert code == 0 and made["id"] in out and "usable" in out and made["token"] not in out
    code, out, _ = _run("tokens", "revoke", made["id"], "--store", sqlite_url, "--json")
    assert code == 0 and json.loads(out)["revoked_at"] is not None
    code, out, _ = _run("tokens", "list", "--app", "shop", "--store", sqlite_url, "--json")
    listed = {t["id"]: t for t in json.loads(out)}
    assert listed[made["id"]]["revoked_at"] is not None and "token" not in listed[made["id"]]


def test_tokens_refuse_bad_input(sqlite_url: str) -> None:
    code, _, err = _run("tokens", "revoke", "nothing", "--store", sqlite_url)
    assert code == 2 and "token_not_found" in err
    code, _, err = _run("tokens", "create", "--app", "a", "--scope", "admin", "--store", sqlite_url)
    assert code == 2
    code, _, err = _run(
        "tokens", "create", "--app", "a", "--scope", "read", "--expires", "soon",
        "--store", sqlite_url,
    )  # fmt: skip
    assert code == 2 and "duration" in err


def test_console_refuses_a_public_host_without_a_token(sqlite_url: str) -> None:
    code, _, err = _run("console", "--store", sqlite_url, "--app", "shop", "--host", "0.0.0.0")
    assert code == 2 and "127.0.0.1 only" in err
    code, _, err = _run("console", "--store", sqlite_url)
    assert code == 2 and "MODULE:APP" in err


def test_console_without_the_extra_says_how_to_install_it(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "uvicorn", None)
    code, _, err = _run("console", "--store", sqlite_url, "--app", "shop")
    assert code == 2 and "pip install 'perdure[web]'" in err


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_console_serves_in_its_own_process(sqlite_url: str, tmp_path: Path) -> None:
    port = _free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    server = subprocess.Popen(
        [sys.executable, "-m", "perdure", "console", "--store", sqlite_url, "--app", "shop",
         "--port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
    )  # fmt: skip
    try:
        assert server.stdout is not None
        banner = server.stdout.readline() + server.stdout.readline()
        assert f"http://127.0.0.1:{port}/" in banner and "loopback only" in banner
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/runs") as answer:
                    assert json.load(answer) == {"runs": [], "next_cursor": None}
                break
            except urllib.error.URLError:
                assert time.monotonic() < deadline and server.poll() is None
                time.sleep(0.05)
    finally:
        server.terminate()
        server.wait(timeout=10)


def test_perdure_imports_without_the_web_extra() -> None:
    code = (
        "import sys\n"
        "for name in ('starlette', 'uvicorn', 'jinja2', 'multipart'):\n"
        "    sys.modules[name] = None\n"
        "import perdure, perdure.cli\n"
        "assert 'perdure.web.app' not in sys.modules\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_console_with_the_apps_code_starts_runs_without_a_version(
    sqlite_url: str, tmp_path: Path
) -> None:
    (tmp_path / "tinyshop.py").write_text(
        "import perdure\n"
        "app = perdure.App(name='tiny')\n"
        "@app.workflow(version='7')\n"
        "def hello(ctx: perdure.Context, who: str) -> str:\n"
        "    return who\n"
    )
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "perdure", "console", "tinyshop:app", "--store", sqlite_url,
         "--port", str(port), "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    try:
        assert server.stdout is not None
        about = json.loads(server.stdout.readline())
        assert (about["app"], about["tokens"]) == ("tiny", False)
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/api/v1/runs",
            data=json.dumps({"workflow": "hello", "args": ["ada"]}).encode(),
            headers={"Content-Type": "application/json"},
        )
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(request) as answer:
                    assert answer.status == 201
                    run_id = json.load(answer)["run_id"]
                break
            except urllib.error.URLError:
                assert time.monotonic() < deadline and server.poll() is None
                time.sleep(0.05)
    finally:
        server.terminate()
        server.wait(timeout=10)
    store = open_store(sqlite_url)
    try:
        run = store.get_run(run_id)
        assert run is not None and (run.app, run.workflow, run.version) == ("tiny", "hello", "7")
    finally:
        store.close()
