"""The command line for signals, waits, resume and channels, on both stores.

Runs are made and parked by an App in this process (a worker with a
FakeClock, stopped once the run waits); the commands then work from the store
alone, as from any other host. A FakeClock in 2030 makes deadlines that the
command line's real clock sees as future; one in 2020 makes deadlines it sees
as long passed, so expiry needs no sleep.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from click.testing import CliRunner, Result

import perdure
from perdure import cli, codec
from perdure.testing.clock import FakeClock

FUTURE = datetime(2030, 1, 1, tzinfo=UTC)
PAST = datetime(2020, 1, 1, tzinfo=UTC)
TIMEOUT = timedelta(minutes=1)
WORKER: dict[str, Any] = {"concurrency": 2, "lease_ttl": 2, "heartbeat": 0.5, "poll_interval": 0.2}
LIMIT = 15.0


@dataclasses.dataclass
class Shop:
    """An app on the test's store, and the URL the command line is given."""

    app: perdure.App
    url: str
    clock: FakeClock

    def cli(self, *args: str) -> Result:
        return CliRunner().invoke(cli.cli, [*args, "--store", self.url])

    def park(self, workflow: str) -> str:
        """Start a run, let a worker park it on its wait, stop the worker."""
        with self.app.worker(**WORKER):
            run_id = self.app.start(workflow).run_id
            deadline = time.monotonic() + LIMIT
            while self.app.get(run_id).state != "waiting":
                assert time.monotonic() < deadline, f"run {run_id} never parked"
                time.sleep(0.02)
        return run_id


def build(url: str, start: datetime) -> Shop:
    clock = FakeClock(start)
    app = perdure.App(url, name=f"clisig_{uuid.uuid4().hex[:8]}", clock=clock)

    @app.workflow()
    def approval(ctx: perdure.Context) -> dict[str, Any]:
        try:
            return {"branch": "signaled", "payload": ctx.wait("go", timeout=TIMEOUT)}
        except perdure.WaitTimedOut:
            return {"branch": "timed_out"}

    @app.workflow()
    def open_ended(ctx: perdure.Context) -> Any:
        return ctx.wait("ok")

    @app.workflow()
    def inbox(ctx: perdure.Context) -> Any:
        return ctx.receive("events").payload

    return Shop(app, url, clock)


@pytest.fixture
def shop(store_url: str) -> Iterator[Shop]:
    made = build(store_url, FUTURE)
    yield made
    made.app.close()


@pytest.fixture
def stale_shop(store_url: str) -> Iterator[Shop]:
    """Deadlines computed in 2020: long passed for the command line's clock."""
    made = build(store_url, PAST)
    yield made
    made.app.close()


def refused(result: Result, code: str) -> str:
    """Assert exit 1 with one refusal line naming ``code`` on stderr, and no traceback."""
    assert result.exit_code == 1, (result.exit_code, result.stdout, result.stderr)
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"perdure: refused: [{code}] "), lines[0]
    return lines[0]


def receipt_doc(shop: Shop, run_id: str) -> dict[str, Any]:
    """Return the stored outcome of ``run_id/go`` as a receipt document."""
    (stored,) = shop.app.store.outcomes(run_id)
    return {
        "wait_id": f"{run_id}/go",
        "run_id": run_id,
        "name": "go",
        "outcome": stored.outcome,
        "signal_id": stored.signal_id,
        "at": stored.at.isoformat(),
        "payload_digest": stored.payload_digest,
    }


def receipt_lines(doc: dict[str, Any]) -> list[str]:
    at = datetime.fromisoformat(doc["at"]).astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")
    return [
        f"wait     {doc['wait_id']}",
        f"outcome  {doc['outcome']}",
        f"at       {at}",
        f"signal   {doc['signal_id'] or '-'}",
        f"digest   {doc['payload_digest'] or '-'}",
    ]


# -- signal ----------------------------------------------------------------------------


def test_signal_prints_the_receipt_and_exits_0(shop: Shop) -> None:
    rid = shop.park("approval")
    done = shop.cli("signal", rid, "go", "--payload", '{"ok": true}', "--signal-id", "s1")
    assert done.exit_code == 0, (done.stdout, done.stderr)
    stored = receipt_doc(shop, rid)
    assert stored["outcome"] == "signaled" and stored["signal_id"] == "s1"
    assert stored["payload_digest"] == codec.digest(codec.encode({"ok": True}))
    assert done.stdout.splitlines() == receipt_lines(stored)
    assert done.stderr == ""
    assert shop.app.get(rid).state == "queued"

    # The same signal id again: the original receipt, exit 0, in JSON too.
    again = shop.cli("signal", rid, "go", "--payload", "2", "--signal-id", "s1", "--json")
    assert again.exit_code == 0, (again.stdout, again.stderr)
    assert json.loads(again.stdout) == stored

    with shop.app.worker(**WORKER):
        result = shop.app.handle(rid).result(timeout=LIMIT)
    assert result == {"branch": "signaled", "payload": {"ok": True}}


def test_a_refused_signal_prints_the_stored_receipt_and_exits_1(shop: Shop) -> None:
    rid = shop.park("approval")
    first = shop.cli("signal", rid, "go", "--payload", '"yes"', "--signal-id", "s1", "--json")
    assert first.exit_code == 0, (first.stdout, first.stderr)
    stored = receipt_doc(shop, rid)

    # Naming the first wait exactly (the bare name would keep it for a second wait).
    other = shop.cli("signal", rid, "go#1", "--payload", '"no"', "--signal-id", "s2")
    line = refused(other, "wait_settled")
    assert f"{rid}/go" in line
    assert other.stdout.splitlines() == receipt_lines(stored)

    as_json = shop.cli("signal", rid, "go#1", "--signal-id", "s3", "--json")
    refused(as_json, "wait_settled")
    doc = json.loads(as_json.stdout)
    assert doc["refused"]["code"] == "wait_settled"
    assert doc["receipt"] == stored
    assert [o.signal_id for o in shop.app.store.outcomes(rid)] == ["s1"]


def test_a_signal_after_the_deadline_is_refused_with_the_timeout_receipt(
    stale_shop: Shop,
) -> None:
    rid = stale_shop.park("approval")
    late = stale_shop.cli("signal", rid, "go", "--payload", "1", "--signal-id", "late", "--json")
    refused(late, "wait_expired")
    stored = receipt_doc(stale_shop, rid)
    assert stored["outcome"] == "timed_out"
    assert (stored["signal_id"], stored["payload_digest"]) == (None, None)
    assert json.loads(late.stdout)["receipt"] == stored
    # Now settled: the next one is told it was settled, with the same receipt.
    later = stale_shop.cli("signal", rid, "go#1", "--payload", "1", "--signal-id", "late")
    refused(later, "wait_settled")
    assert later.stdout.splitlines() == receipt_lines(stored)
    assert stale_shop.app.get(rid).state == "queued"


def test_signal_to_an_ended_run_is_refused_and_to_an_unknown_run_is_bad_input(
    shop: Shop,
) -> None:
    rid = shop.app.start("approval").run_id
    assert shop.app.cancel(rid) is True
    refused(shop.cli("signal", rid, "go", "--payload", "1"), "run_finished")
    missing = shop.cli("signal", "no-such-run", "go", "--payload", "1")
    assert missing.exit_code == 2
    assert missing.stderr.startswith("perdure: error: [run_not_found] ")


# -- waits and resume --------------------------------------------------------------------


def test_waits_json_lists_wait_ids_and_deadlines(shop: Shop) -> None:
    bounded = shop.park("approval")
    unbounded = shop.park("open_ended")
    shop.app.start("approval")  # queued, never reached its wait: not listed

    listed = shop.cli("waits", "--app", shop.app.name, "--json")
    assert listed.exit_code == 0, (listed.stdout, listed.stderr)
    expected = [
        {
            "wait_id": f"{bounded}/go",
            "run_id": bounded,
            "name": "go",
            "deadline": (FUTURE + TIMEOUT).isoformat(),
            "kind": "signal",
        },
        {
            "wait_id": f"{unbounded}/ok",
            "run_id": unbounded,
            "name": "ok",
            "deadline": None,
            "kind": "signal",
        },
    ]
    assert sorted(json.loads(listed.stdout), key=lambda w: w["wait_id"]) == sorted(
        expected, key=lambda w: w["wait_id"]
    )
    only = shop.cli("waits", "--run", bounded, "--json")
    assert only.exit_code == 0 and json.loads(only.stdout) == [expected[0]]

    table = shop.cli("waits", "--app", shop.app.name)
    assert table.exit_code == 0
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["WAIT", "KIND", "DEADLINE"]
    rows = sorted(line.split() for line in lines[1:])
    assert rows == sorted(
        [[f"{bounded}/go", "signal", "2030-01-01", "00:01:00Z"], [f"{unbounded}/ok", "signal", "-"]]
    )


def test_waits_settles_expired_waits_while_listing(stale_shop: Shop) -> None:
    rid = stale_shop.park("approval")
    listed = stale_shop.cli("waits", "--app", stale_shop.app.name, "--json")
    assert listed.exit_code == 0, (listed.stdout, listed.stderr)
    assert json.loads(listed.stdout) == []
    assert receipt_doc(stale_shop, rid)["outcome"] == "timed_out"
    assert stale_shop.app.get(rid).state == "queued"
    with stale_shop.app.worker(**WORKER):
        assert stale_shop.app.handle(rid).result(timeout=LIMIT) == {"branch": "timed_out"}


def test_resume_refuses_an_open_wait_with_exit_1(shop: Shop) -> None:
    rid = shop.park("open_ended")
    line = refused(shop.cli("resume", rid), "wait_still_open")
    assert f"{rid}/ok" in line
    as_json = shop.cli("resume", rid, "--json")
    refused(as_json, "wait_still_open")
    assert json.loads(as_json.stdout)["refused"]["code"] == "wait_still_open"
    assert shop.app.get(rid).state == "waiting"
    assert shop.app.store.outcomes(rid) == []


def test_resume_requeues_a_run_whose_wait_expired(stale_shop: Shop) -> None:
    rid = stale_shop.park("approval")
    done = stale_shop.cli("resume", rid, "--json")
    assert done.exit_code == 0, (done.stdout, done.stderr)
    assert json.loads(done.stdout) == {"run_id": rid, "requeued": True, "state": "queued"}
    assert receipt_doc(stale_shop, rid)["outcome"] == "timed_out"
    text = stale_shop.cli("resume", rid)
    assert text.exit_code == 0
    assert text.stdout.strip() == f"run {rid} is queued; nothing to resume"


# -- send ----------------------------------------------------------------------------------


def test_send_prints_stored_then_duplicate(shop: Shop) -> None:
    rid = shop.park("inbox")
    first = shop.cli("send", rid, "events", "k1", "--payload", '{"n": 1}')
    assert first.exit_code == 0, (first.stdout, first.stderr)
    assert first.stdout.strip() == f"message k1 stored on channel events of run {rid}"
    assert shop.app.get(rid).state == "queued"  # the waiting run was woken

    dup = shop.cli("send", rid, "events", "k1", "--payload", '{"n": 2}')
    assert dup.exit_code == 0, (dup.stdout, dup.stderr)
    assert dup.stdout.strip() == (
        f"message k1 was already sent on channel events of run {rid}; the first payload is kept"
    )
    for key, stored in (("k1", False), ("k2", True)):
        doc = shop.cli("send", rid, "events", key, "--payload", "3", "--json")
        assert doc.exit_code == 0
        assert json.loads(doc.stdout) == {
            "run_id": rid,
            "channel": "events",
            "key": key,
            "stored": stored,
        }
    message = shop.app.store.next_message(rid, "events", 0)
    assert message is not None and (message.key, message.payload) == ("k1", '{"n":1}')
    with shop.app.worker(**WORKER):
        assert shop.app.handle(rid).result(timeout=LIMIT) == {"n": 1}
    refused(shop.cli("send", rid, "events", "k3"), "run_finished")


# -- the real entry point -------------------------------------------------------------------


def test_python_m_perdure_signal_exit_codes(shop: Shop) -> None:
    rid = shop.park("approval")

    def perdure_cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "perdure", *args, "--store", shop.url],
            capture_output=True,
            text=True,
            timeout=60,
        )

    done = perdure_cli("signal", rid, "go", "--payload", "[1]", "--signal-id", "p1", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == receipt_doc(shop, rid)
    other = perdure_cli("signal", rid, "go#1", "--payload", "[2]", "--signal-id", "p2")
    assert other.returncode == 1
    assert other.stderr.startswith("perdure: refused: [wait_settled] ")
    assert other.stdout.splitlines() == receipt_lines(receipt_doc(shop, rid))
