"""Hostile fixtures: a real run's rows are corrupted behind the engine's back.

Every case creates real runs through the API and drives them with a worker
to a resting point (three steps done, parked on a signal wait or in a sleep),
then damages the store's rows directly with SQL (:class:`Db`, the one helper
that knows each adapter's tables) and asserts that the engine fails closed
with the invariant named (``docs/provenance.md``, ``validation.py`` and the
adapters' ``*_rows.py``):

* a damaged ledger: ``app.history`` raises ``CorruptState`` (``READ``);
* a damaged run, journal or outcome the adapter can read: the next claim ends
  the run in ``needs_attention`` with code ``corrupt_state`` and the invariant
  in its error (``CLAIMED``);
* a row the adapter cannot read at all: reading it raises ``CorruptState``,
  and a claim that meets the run sets it aside in ``needs_attention`` with a
  ``finished`` receipt, leaving its journal, outcomes and waits as they were
  (``SET_ASIDE``).

Each case runs a healthy run of the same workflow alongside, through the same
worker, to show that no other run is affected, and checks that nothing was
repaired: the damaged rows are still as the test left them. Every case runs on
SQLite and PostgreSQL. Ordering is by bounded polling of the store, never by
sleeping.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest

import perdure
from perdure.store.sqlite import connection as sqlite_connection
from perdure.testing.clock import FakeClock

WORKER: dict[str, Any] = {"concurrency": 4, "lease_ttl": 2, "heartbeat": 0.5, "poll_interval": 0.05}
LIMIT = 15.0  # seconds: an upper bound for anything to happen, never a pause
STEPS = ("a", "b", "c")  # recorded before the run parks
TERMINAL = ("succeeded", "failed", "canceled", "needs_attention")


def wait_for(check: Callable[[], Any], what: str, timeout: float = LIMIT) -> Any:
    """Poll ``check`` until it returns something truthy; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.01)


# -- the store's rows, behind the engine's back ---------------------------------


class Db:
    """Execute SQL on a store's database: sqlite3 on the file, psycopg on the URL.

    Statements name tables as ``{runs}``, ``{journal}``, ``{ledger}``,
    ``{outcomes}`` and ``{waits}`` and take ``%s`` parameters.
    """

    TABLES = ("runs", "journal", "ledger", "outcomes", "waits")

    def __init__(self, url: str) -> None:
        self.url = url
        self.kind = "sqlite" if url.startswith("sqlite:") else "postgres"
        prefix = "" if self.kind == "sqlite" else "perdure."
        self._tables = {name: prefix + name for name in self.TABLES}

    def execute(self, sql: str, *params: Any) -> list[dict[str, Any]]:
        """Run one statement in its own transaction; return its rows as dicts."""
        sql = sql.format(**self._tables)
        if self.kind == "sqlite":
            conn = sqlite3.connect(sqlite_connection.database_path(self.url), timeout=10)
            conn.row_factory = sqlite3.Row
            try:
                found = [dict(row) for row in conn.execute(sql.replace("%s", "?"), params)]
                conn.commit()
                return found
            finally:
                conn.close()
        import psycopg
        from psycopg.rows import dict_row

        with psycopg.connect(self.url, autocommit=True, row_factory=dict_row) as shared:
            cur = shared.execute(sql, params)
            return list(cur.fetchall()) if cur.description else []

    def refuses(self, sql: str, *params: Any) -> bool:
        """Return whether the database refuses the statement as a constraint violation."""
        refusals: tuple[type[Exception], ...] = (sqlite3.IntegrityError,)
        if self.kind == "postgres":
            import psycopg

            refusals = (psycopg.IntegrityError,)
        try:
            self.execute(sql, *params)
        except refusals:
            return True
        return False

    def run(self, run_id: str) -> dict[str, Any]:
        (row,) = self.execute("SELECT * FROM {runs} WHERE run_id = %s", run_id)
        return row

    def rows(self, table: str, run_id: str) -> list[dict[str, Any]]:
        order = {"journal": "position", "ledger": "sequence"}.get(table, "name")
        return self.execute(f"SELECT * FROM {{{table}}} WHERE run_id = %s ORDER BY {order}", run_id)

    def snapshot(self, run_id: str) -> dict[str, Any]:
        """Return every row the store holds for the run."""
        found: dict[str, Any] = {"runs": self.run(run_id)}
        for table in ("journal", "ledger", "outcomes", "waits"):
            found[table] = self.rows(table, run_id)
        return found


# -- the workflow under attack --------------------------------------------------


def register(app: perdure.App) -> None:
    """Register ``hostile``: three steps, a park (signal wait or sleep), one more step."""

    @app.step()
    def a(n: int) -> str:
        return f"a:{n}"

    @app.step()
    def b(n: int) -> str:
        return f"b:{n}"

    @app.step()
    def c(n: int) -> str:
        return f"c:{n}"

    @app.step()
    def d(n: int) -> str:
        return f"d:{n}"

    @app.workflow(version="1")
    def hostile(ctx: perdure.Context, n: int, park: str) -> list[Any]:
        done: list[Any] = [a(n), b(n), c(n)]
        if park == "wait":
            done.append(ctx.wait("go"))
        else:
            ctx.sleep(timedelta(hours=1))
        done.append(d(n))
        return done


def expected_result(n: int, park: str) -> list[Any]:
    middle = [{"go": n}] if park == "wait" else []
    return [f"a:{n}", f"b:{n}", f"c:{n}", *middle, f"d:{n}"]


@dataclass
class Scene:
    """Two runs of ``hostile`` parked after three steps: one to damage, one healthy."""

    app: perdure.App
    db: Db
    clock: FakeClock
    park: str
    victim: str
    healthy: str

    @property
    def store(self) -> str:
        return self.db.kind

    def wake(self) -> None:
        """Make both runs claimable (before the damage: a signal reads the run's row)."""
        if self.park == "wait":
            for n, run_id in ((1, self.victim), (2, self.healthy)):
                self.app.signal(run_id, "go", {"go": n})
        else:
            self.clock.advance(hours=2)

    def drive(self, victim_done: Callable[[], bool]) -> None:
        """Serve both runs until the healthy one succeeded and ``victim_done()``."""
        with self.app.worker(**WORKER):
            wait_for(
                lambda: self.db.run(self.healthy)["state"] == "succeeded" and victim_done(),
                "the healthy run to succeed and the damaged one to be dealt with",
            )
        assert self.app.handle(self.healthy).result(timeout=0) == expected_result(2, self.park)


def stage(
    make_app: Callable[..., perdure.App], store_url: str, *, park: str, **options: Any
) -> Scene:
    """Start two runs and let a worker drive them to their park; stop the worker."""
    clock = FakeClock()
    app = make_app(clock=clock, **options)
    register(app)
    victim = app.start("hostile", 1, park).run_id
    healthy = app.start("hostile", 2, park).run_id
    db = Db(store_url)
    with app.worker(**WORKER):
        wait_for(
            lambda: db.run(victim)["state"] == db.run(healthy)["state"] == "waiting",
            "both runs to park",
        )
    journal = [
        (e["position"], e["kind"], e["name"], e["status"]) for e in db.rows("journal", victim)
    ]
    parked = ("wait", "go", "started") if park == "wait" else ("sleep", "sleep", "ok")
    assert journal == [(i + 1, "step", s, "ok") for i, s in enumerate(STEPS)] + [(4, *parked)]
    return Scene(app, db, clock, park, victim, healthy)


# -- the damage -----------------------------------------------------------------


def last_sequence(s: Scene) -> int:
    return int(s.db.run(s.victim)["ledger_sequence"])


def ledger_truncated(s: Scene) -> None:
    s.db.execute(
        "DELETE FROM {ledger} WHERE run_id = %s AND sequence > %s", s.victim, last_sequence(s) - 2
    )


def ledger_first_forged(s: Scene) -> None:
    s.db.execute(
        "UPDATE {ledger} SET kind = 'claimed' WHERE run_id = %s AND sequence = 1", s.victim
    )


def ledger_gap(s: Scene) -> None:
    # Two statements, so that no intermediate state collides on the primary key.
    for shift in (1000, -999):
        s.db.execute(
            "UPDATE {ledger} SET sequence = sequence + %s WHERE run_id = %s AND sequence >= %s",
            shift,
            s.victim,
            3 if shift > 0 else 1003,
        )


def ledger_initialized_later(s: Scene) -> None:
    s.db.execute(
        "UPDATE {ledger} SET kind = 'initialized' WHERE run_id = %s AND sequence = 3", s.victim
    )


def ledger_generation_backwards(s: Scene) -> None:
    s.db.execute("UPDATE {ledger} SET generation = 0 WHERE run_id = %s AND sequence = 4", s.victim)


def ledger_generation_ahead(s: Scene) -> None:
    s.db.execute(
        "UPDATE {ledger} SET generation = 7 WHERE run_id = %s AND sequence = %s",
        s.victim,
        last_sequence(s),
    )


def ledger_unknown_kind(s: Scene) -> None:
    s.db.execute(
        "UPDATE {ledger} SET kind = 'teleported' WHERE run_id = %s AND sequence = 3", s.victim
    )


def ledger_emptied(s: Scene) -> None:
    s.db.execute("DELETE FROM {ledger} WHERE run_id = %s", s.victim)


def ledger_extra_old_receipt(s: Scene) -> None:
    # With ledger_limit=4 the run keeps receipts S-3..S; S-4 was trimmed: put it back.
    last = last_sequence(s)
    assert [r["sequence"] for r in s.db.rows("ledger", s.victim)] == list(range(last - 3, last + 1))
    s.db.execute(
        "INSERT INTO {ledger} (run_id, sequence, kind, at, generation, worker, step, digest, note)"
        " SELECT run_id, sequence - 1, kind, at, generation, worker, step, digest, note"
        " FROM {ledger} WHERE run_id = %s AND sequence = %s",
        s.victim,
        last - 3,
    )


def ledger_worker(value: str) -> Callable[[Scene], None]:
    def damage(s: Scene) -> None:
        s.db.execute(
            "UPDATE {ledger} SET worker = %s WHERE run_id = %s AND kind = 'claimed'",
            value,
            s.victim,
        )

    return damage


def run_column(column: str, value: Any) -> Callable[[Scene], None]:
    def damage(s: Scene) -> None:
        s.db.execute(f"UPDATE {{runs}} SET {column} = %s WHERE run_id = %s", value, s.victim)

    return damage


def journal_column(position: int, column: str, value: Any) -> Callable[[Scene], None]:
    def damage(s: Scene) -> None:
        s.db.execute(
            f"UPDATE {{journal}} SET {column} = %s WHERE run_id = %s AND position = %s",
            value,
            s.victim,
            position,
        )

    return damage


def journal_position_repeated(s: Scene) -> None:
    # The primary key (run_id, position) refuses a second entry at a position...
    assert s.db.refuses(
        "INSERT INTO {journal} (run_id, position, kind, name, status, output, error, attempt,"
        " created_at, updated_at) SELECT run_id, position, kind, name, status, output, error,"
        " attempt, created_at, updated_at FROM {journal} WHERE run_id = %s AND position = 2",
        s.victim,
    )
    # ...so the positions are shifted instead: 2, 3, 4, 5 (a gap before the first).
    for shift in (100, -99):
        s.db.execute(
            "UPDATE {journal} SET position = position + %s WHERE run_id = %s", shift, s.victim
        )


def journal_gap(s: Scene) -> None:
    s.db.execute("DELETE FROM {journal} WHERE run_id = %s AND position = 2", s.victim)


def outcome_column(column: str, value: Any) -> Callable[[Scene], None]:
    def damage(s: Scene) -> None:
        s.db.execute(
            f"UPDATE {{outcomes}} SET {column} = %s WHERE run_id = %s AND name = 'go'",
            value,
            s.victim,
        )

    return damage


def outcome_added(name: str) -> Callable[[Scene], None]:
    def damage(s: Scene) -> None:
        payload = json.dumps({"run_id": "0" * 32, "state": "succeeded", "result": 1, "error": None})
        s.db.execute(
            "INSERT INTO {outcomes} (run_id, name, outcome, signal_id, payload, payload_digest, at)"
            " SELECT run_id, %s, 'signaled', NULL, %s, NULL, at FROM {outcomes}"
            " WHERE run_id = %s AND name = 'go'",
            name,
            payload,
            s.victim,
        )

    return damage


# -- the cases ------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One kind of damage and the invariant the engine must name (per store if they differ)."""

    damage: Callable[[Scene], None]
    invariant: str | dict[str, str]
    park: str = "wait"
    read: str = "history"  # the client call that must refuse: history, get, journal, outcomes
    options: dict[str, Any] = field(default_factory=dict)
    cleared: bool = False  # setting the run aside overwrites the damaged column

    def expected(self, store: str) -> str:
        if isinstance(self.invariant, str):
            return self.invariant
        return self.invariant[store]


READ = {
    "ledger_truncated": Case(ledger_truncated, "ledger_count"),
    "ledger_first_forged": Case(ledger_first_forged, "ledger_first"),
    "ledger_sequence_gap": Case(ledger_gap, "ledger_sequence_gap"),
    "ledger_initialized_later": Case(ledger_initialized_later, "ledger_first"),
    "ledger_generation_backwards": Case(ledger_generation_backwards, "ledger_generation"),
    "ledger_generation_ahead_of_run": Case(ledger_generation_ahead, "ledger_generation"),
    "ledger_unknown_kind": Case(ledger_unknown_kind, "ledger_kind"),
    "ledger_empty": Case(ledger_emptied, "ledger_empty"),
    "ledger_count_above_limit": Case(
        ledger_extra_old_receipt, "ledger_count", options={"ledger_limit": 4}
    ),
    "ledger_worker_with_space": Case(ledger_worker("evil worker"), "ledger_worker_id"),
    "ledger_worker_too_long": Case(ledger_worker("w" * 129), "ledger_worker_id"),
    "run_result_json": Case(run_column("result", '{"half'), "run_result_json", read="get"),
    "run_error_json": Case(run_column("error", "[1,"), "run_error_json", read="get"),
}

CLAIMED = {
    "run_failures_above_max": Case(run_column("failures", 9), "run_failures"),
    "run_input_json": Case(run_column("input", '{"args": [1, "wait"'), "run_input_json"),
    "run_input_shape": Case(run_column("input", '[1, "wait"]'), "run_input_shape"),
    "journal_position_repeated": Case(journal_position_repeated, "journal_gap"),
    "journal_gap": Case(journal_gap, "journal_gap"),
    "journal_unknown_kind": Case(journal_column(2, "kind", "teleport"), "journal_kind"),
    "journal_empty_name": Case(journal_column(2, "name", ""), "journal_name"),
    "journal_started_not_last": Case(
        journal_column(2, "status", "started"), "journal_started_not_last", park="sleep"
    ),
    "journal_started_before_open_wait": Case(
        journal_column(2, "status", "started"), "journal_started_not_last"
    ),
    "journal_sleep_deadline_shape": Case(
        journal_column(4, "output", '"yesterday"'), "journal_output_shape", park="sleep"
    ),
    "journal_output_json": Case(journal_column(1, "output", '{"oops'), "journal_output_json"),
    "journal_error_json": Case(journal_column(3, "error", "{]"), "journal_error_json"),
    "outcome_unknown_child": Case(outcome_added("child:" + "f" * 32), "outcome_unknown_wait"),
    "outcome_impossible_name": Case(outcome_added("go/../stop"), "outcome_unknown_wait"),
    "outcome_payload_json": Case(outcome_column("payload", '{"go": '), "outcome_payload_json"),
}

SET_ASIDE = {
    "run_unknown_state": Case(run_column("state", "zombie"), "run_state", read="get"),
    "run_negative_generation": Case(
        run_column("generation", -1),
        "run_generation",
        read="get",
    ),
    "run_generation_far_below_zero": Case(
        run_column("generation", -5),
        "run_generation",
        read="get",
    ),
    "run_negative_ledger_sequence": Case(
        run_column("ledger_sequence", -2),
        "run_ledger_sequence",
        read="get",
    ),
    "journal_unknown_status": Case(
        journal_column(2, "status", "exploded"),
        "journal_status",
        read="journal",
    ),
    "journal_attempt_zero": Case(
        journal_column(2, "attempt", 0),
        "journal_attempt",
        read="journal",
    ),
    "outcome_unknown_kind": Case(
        outcome_column("outcome", "exploded"),
        "outcome_kind",
        read="outcomes",
    ),
    "run_worker_with_space": Case(
        run_column("worker", "evil worker"), "run_worker_id", read="get", cleared=True
    ),
    "run_worker_too_long": Case(
        run_column("worker", "w" * 129), "run_worker_id", read="get", cleared=True
    ),
}


def refusal(scene: Scene, read: str) -> perdure.CorruptState:
    """Make the client call ``read`` on the victim; return the CorruptState it raised."""
    calls: dict[str, Callable[[str], Any]] = {
        "history": scene.app.history,
        "get": scene.app.get,
        "journal": scene.app.store.journal,
        "outcomes": scene.app.store.outcomes,
    }
    with pytest.raises(perdure.CorruptState) as raised:
        calls[read](scene.victim)
    return raised.value


def run_changes(before: dict[str, Any], after: dict[str, Any]) -> set[str]:
    return {column for column in before if before[column] != after[column]}


# A claim that sets a run aside changes these columns of the run (and no others).
SET_ASIDE_TOUCHES = {
    "state",
    "error",
    "worker",
    "lease_expires_at",
    "ready_at",
    "ledger_sequence",
    "updated_at",
}

# A claim and the needs_attention that follows may change these columns of the run.
CLAIM_TOUCHES = {
    "state",
    "error",
    "worker",
    "lease_expires_at",
    "ready_at",
    "generation",
    "ledger_sequence",
    "updated_at",
}


# -- the tests ------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(READ))
def test_a_damaged_ledger_or_run_row_is_refused_on_read(
    name: str, make_app: Callable[..., perdure.App], store_url: str
) -> None:
    case = READ[name]
    scene = stage(make_app, store_url, park=case.park, **case.options)
    case.damage(scene)
    damaged = scene.db.snapshot(scene.victim)

    refused = refusal(scene, case.read)

    assert (refused.run_id, refused.invariant) == (scene.victim, case.expected(scene.store))
    assert refusal(scene, case.read).invariant == refused.invariant  # refused every time
    assert scene.db.snapshot(scene.victim) == damaged  # nothing repaired
    # No other run is affected.
    assert scene.app.history(scene.healthy)[-1].kind == "parked"
    assert scene.app.get(scene.healthy).state == "waiting"


@pytest.mark.parametrize("name", sorted(CLAIMED))
def test_damaged_state_stops_the_run_at_its_next_claim(
    name: str, make_app: Callable[..., perdure.App], store_url: str
) -> None:
    case = CLAIMED[name]
    scene = stage(make_app, store_url, park=case.park, **case.options)
    scene.wake()
    case.damage(scene)
    damaged = scene.db.snapshot(scene.victim)

    scene.drive(lambda: scene.db.run(scene.victim)["state"] in TERMINAL)

    info = scene.app.get(scene.victim)
    assert info.state == "needs_attention", info.error
    assert info.error is not None
    assert info.error["code"] == "corrupt_state", info.error
    assert info.error.get("invariant") == case.expected(scene.store), info.error
    # The run was not advanced and nothing was repaired.
    after = scene.db.snapshot(scene.victim)
    assert after["journal"] == damaged["journal"]
    assert after["outcomes"] == damaged["outcomes"]
    assert after["waits"] == damaged["waits"]
    assert run_changes(damaged["runs"], after["runs"]) <= CLAIM_TOUCHES
    assert after["runs"]["generation"] == damaged["runs"]["generation"] + 1
    assert after["ledger"][: len(damaged["ledger"])] == damaged["ledger"]
    added = after["ledger"][len(damaged["ledger"]) :]
    if added and added[0]["kind"] == "woken":  # a sweep may wake a sleeper before its claim
        added = added[1:]
    assert [(r["kind"], r["generation"]) for r in added] == [
        ("claimed", after["runs"]["generation"]),
        ("finished", after["runs"]["generation"]),
    ]


@pytest.mark.parametrize("name", sorted(SET_ASIDE))
def test_a_row_the_adapter_cannot_read_is_refused_and_set_aside(
    name: str,
    make_app: Callable[..., perdure.App],
    store_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    case = SET_ASIDE[name]
    scene = stage(make_app, store_url, park=case.park, **case.options)
    scene.wake()
    case.damage(scene)
    damaged = scene.db.snapshot(scene.victim)
    invariant = case.expected(scene.store)
    assert refusal(scene, case.read).invariant == invariant

    # The healthy run is ordered after the victim, so by the time it is claimed
    # the claim has met (and refused) the victim.
    scene.drive(lambda: True)

    if case.cleared:
        # A run set aside holds no worker: the damaged id is gone, the error names it.
        info = scene.app.get(scene.victim)
        assert info.error is not None
        assert (info.state, info.error["code"], info.error["invariant"]) == (
            "needs_attention",
            "corrupt_state",
            invariant,
        )
    else:
        refused = refusal(scene, case.read)
        assert (refused.run_id, refused.invariant) == (scene.victim, invariant)
    after = scene.db.snapshot(scene.victim)
    for table in ("journal", "outcomes", "waits"):
        assert after[table] == damaged[table], table
    if damaged["runs"]["state"] != "queued":
        # Never a claim candidate: left untouched, never rewritten, its records kept.
        assert after == damaged
        return
    # The claim sets the run aside: needs_attention, the invariant named, no claim.
    if scene.store == "postgres":
        # The shared claim says so in its log when it steps over the run.
        assert any(
            scene.victim in r.getMessage() and invariant in r.getMessage()
            for r in caplog.records
            if r.name == "perdure.store.postgres"
        ), [r.getMessage() for r in caplog.records]
    before, now = damaged["runs"], after["runs"]
    assert run_changes(before, now) <= SET_ASIDE_TOUCHES
    assert (now["state"], now["worker"], now["lease_expires_at"], now["ready_at"]) == (
        "needs_attention",
        None,
        None,
        None,
    )
    error = json.loads(now["error"])
    assert set(error) == {"code", "message", "invariant"}, error
    assert (error["code"], error["invariant"]) == ("corrupt_state", invariant)
    assert isinstance(error["message"], str) and scene.victim in error["message"]
    assert now["ledger_sequence"] == before["ledger_sequence"] + 1
    if now["ledger_sequence"] < 1:
        # No receipt can be numbered from a negative sequence: none is invented.
        assert after["ledger"] == damaged["ledger"]
        return
    # One receipt records it, numbered after the last; the older ones are kept.
    assert after["ledger"][: len(damaged["ledger"])] == damaged["ledger"]
    generation = before["generation"]
    (receipt,) = after["ledger"][len(damaged["ledger"]) :]
    assert receipt == {
        "run_id": scene.victim,
        "sequence": now["ledger_sequence"],
        "kind": "finished",
        "at": now["updated_at"],
        "generation": generation if isinstance(generation, int) and generation >= 0 else 0,
        "worker": None,
        "step": None,
        "digest": None,
        "note": f"set aside: {invariant}",
    }


def test_non_determinism_is_not_corruption(
    make_app: Callable[..., perdure.App], store_url: str
) -> None:
    """A known kind at the wrong position is the code's business, not the store's."""
    scene = stage(make_app, store_url, park="wait")
    scene.wake()
    journal_column(2, "kind", "random")(scene)
    journal_column(2, "name", "random")(scene)
    damaged = scene.db.snapshot(scene.victim)

    scene.drive(lambda: scene.db.run(scene.victim)["state"] == "needs_attention")

    error = scene.app.get(scene.victim).error
    assert error is not None
    assert error["code"] == "non_determinism", error
    assert scene.db.snapshot(scene.victim)["journal"] == damaged["journal"]


def test_a_sweep_keeps_the_records_of_a_run_stopped_on_corruption(
    make_app: Callable[..., perdure.App], store_url: str
) -> None:
    """The damaged outcome stays as evidence after the run went to needs_attention."""
    scene = stage(make_app, store_url, park="wait")
    scene.wake()
    outcome_column("payload", '{"go": ')(scene)
    scene.drive(lambda: scene.db.run(scene.victim)["state"] == "needs_attention")
    kept = scene.db.snapshot(scene.victim)
    assert kept["outcomes"] and kept["waits"]

    scene.app.store.sweep()

    after = scene.db.snapshot(scene.victim)
    assert (after["outcomes"], after["waits"]) == (kept["outcomes"], kept["waits"])


def test_a_run_set_aside_by_the_claim_surfaces_as_needs_attention(
    make_app: Callable[..., perdure.App], store_url: str
) -> None:
    """A journal row the adapter cannot read: the run row is fine, so it can say so."""
    scene = stage(make_app, store_url, park="wait")
    scene.wake()
    journal_column(2, "status", "exploded")(scene)

    scene.drive(lambda: True)

    info = scene.app.get(scene.victim)
    assert info.state == "needs_attention"
    assert info.error is not None
    invariant = "journal_status"
    assert (info.error["code"], info.error["invariant"]) == ("corrupt_state", invariant)
    last = scene.app.history(scene.victim)[-1]
    assert (last.kind, last.note, last.worker) == ("finished", f"set aside: {invariant}", None)
