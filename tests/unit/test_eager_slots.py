"""A worker's slots, shared by eager starts and its claim loop: never more than its concurrency.

The two parties are modeled step by step, in every order hypothesis finds: starts that
reserve a slot and later hand a run over (or cancel), and the claim loop, which counts the
free slots, claims up to that many runs in a round trip and dispatches them. Whatever the
interleaving, what runs plus what is promised to run never passes the concurrency.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

from hypothesis import given, settings
from hypothesis import strategies as st

from perdure import eagerslots, telemetry
from perdure.store import port

APP = "shop"


class _Registry:
    name = APP

    def workflow_versions(self) -> list[tuple[str, str]]:
        return [("order", "1")]


class _Slots(eagerslots.EagerSlots):
    """EagerSlots with what the Worker supplies, executing nothing."""

    def __init__(self, concurrency: int) -> None:
        self.worker_id = "w-1"
        self.registry = _Registry()  # type: ignore[assignment]
        self.ownership = "run-lease"
        self.dry_run = False
        self.concurrency = concurrency
        self.telemetry = telemetry.NONE
        self._claim_ttl = 30.0
        self._active = {}
        self._active_lock = threading.Lock()
        self._slot_freed = threading.Event()
        self._stop_event = threading.Event()
        self._claims_open = True

    def _dispatch(
        self,
        claimed: Sequence[port.Claimed],
        known: Mapping[str, port.KnownJournal] | None = None,
    ) -> None:
        for item in claimed:
            self._active[item.claim.run_id] = object()  # type: ignore[assignment]


def _new(n: int) -> port.NewRun:
    return port.NewRun(run_id=f"r{n}", app=APP, workflow="order", version="1", input="{}")


def _claimed(run_id: str) -> port.Claimed:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    run = port.Run(
        run_id=run_id,
        app=APP,
        workflow="order",
        version="1",
        state="running",
        input="{}",
        result=None,
        error=None,
        key=None,
        parent_id=None,
        generation=1,
        failures=0,
        worker="w-1",
        lease_expires_at=at,
        ready_at=None,
        cancel_requested=False,
        ledger_sequence=2,
        created_at=at,
        updated_at=at,
    )
    return port.Claimed(port.Claim(run_id, "w-1", 1, at), run, [])


OPS = st.sampled_from(["reserve", "hand", "cancel", "claim", "dispatch", "finish"])


@settings(max_examples=300, deadline=None)
@given(concurrency=st.integers(1, 4), ops=st.lists(OPS, max_size=60), wanted=st.data())
def test_starts_and_claims_never_promise_more_than_the_concurrency(
    concurrency: int, ops: list[str], wanted: st.DataObject
) -> None:
    slots = _Slots(concurrency)
    reserved: list[port.NewRun] = []
    held = []  # the reservations, in the order they were made
    in_claim: int | None = None  # runs the claim loop's claim in flight will return
    made = 0
    for op in ops:
        if op == "reserve":
            made += 1
            got = slots.reserve(_new(made))
            if got is not None:
                reserved.append(_new(made))
                held.append(got)
        elif op in ("hand", "cancel") and held:
            got, new = held.pop(0), reserved.pop(0)
            if op == "hand":
                got.hand(_claimed(new.run_id))
            else:
                got.cancel()
        elif op == "claim" and in_claim is None:
            free = slots._claim_slots()
            in_claim = wanted.draw(st.integers(0, max(free, 0)))
        elif op == "dispatch" and in_claim is not None:
            made += in_claim
            slots._dispatch([_claimed(f"c{made}-{i}") for i in range(in_claim)])
            slots._claims_filled()
            in_claim = None
        elif op == "finish" and slots._active:
            del slots._active[next(iter(slots._active))]
        promised = len(slots._active) + len(held) + (in_claim or 0)
        assert promised <= concurrency
        assert slots._reserved == len(held)
        assert slots.takes_starts == (
            len(slots._active) + len(held) + (slots._claiming if in_claim is not None else 0)
            < concurrency
        )
