"""Which wait a signal settles, and the receipt its sender is shown.

A run may wait on one name many times: its first wait on ``submit`` is the
wait ``submit``, its second ``submit#2``, and so on, numbered as step keys
are. A signal sent to ``submit`` settles the earliest of those waits that has
no outcome yet, whether the run has reached it or not (a signal that arrives
first is kept until the run waits), so signals are applied in arrival order,
one per wait. A signal sent to ``submit#2`` settles that wait only, and is
refused if something else settled it.

Each wait keeps the rules of a single one: its outcome is written once (a
signal, its deadline or a cancel wins, the others are shown what is stored),
a signal sent again with the same ``signal_id`` gets its original receipt,
and a signal that finds the wait it would settle past its deadline settles it
as timed out and is refused.
"""

from __future__ import annotations

import re
import uuid
from typing import Any

from perdure import codec, effects, errors, journal, payloads, records
from perdure.store import port

_NUMBERED = re.compile(r"^(?P<base>[^#]+)#(?P<index>[1-9][0-9]*)$")


def wait_key(name: str, count: int) -> str:
    """Return the key of the ``count``-th wait on ``name`` in a run."""
    return effects.step_key(name, count)


def check_wait_name(name: str) -> None:
    """Refuse a name a workflow cannot wait on.

    Raises:
        errors.InvalidInput: empty, with ``/`` or ``#``, or a child's record name.
    """
    codec.check_text("a wait name", name)
    if "/" in name or "#" in name or name.startswith("child:"):
        raise errors.InvalidInput(
            f"wait name {name!r} must be non-empty, without '/' or '#', and not a child's"
        )


def target(name: str) -> tuple[str, str | None]:
    """Split what a sender named into the wait name and, if it named one wait, its key.

    ``submit`` names every wait on ``submit`` (the earliest open one is
    meant); ``submit#2`` names the second only; ``submit#1`` is ``submit``.

    Raises:
        errors.InvalidInput: a name no wait can have.
    """
    codec.check_text("a wait name", name)
    numbered = _NUMBERED.match(name)
    if numbered is None:
        check_wait_name(name)
        return name, None
    base, index = numbered["base"], int(numbered["index"])
    check_wait_name(base)
    return base, wait_key(base, index)


def index_of(base: str, key: str) -> int | None:
    """Return which wait on ``base`` the key ``key`` is (1, 2, ...), or None if another name's."""
    if key == base:
        return 1
    numbered = _NUMBERED.match(key)
    if numbered is None or numbered["base"] != base:
        return None
    index = int(numbered["index"])
    return index if index >= 2 else None


def receipt(outcome: port.Outcome) -> records.Receipt:
    """Return the receipt every sender of this wait is shown."""
    return records.Receipt(
        wait_id=f"{outcome.run_id}/{outcome.name}",
        run_id=outcome.run_id,
        name=outcome.name,
        outcome=outcome.outcome,
        signal_id=outcome.signal_id,
        at=outcome.at,
        payload_digest=outcome.payload_digest,
    )


def _answer(stored: port.Outcome, created: bool, sent_id: str) -> records.Receipt | None:
    """Return the sender's receipt, raise its refusal, or None when another signal took the wait."""
    found = receipt(stored)
    if stored.outcome == "signaled" and stored.signal_id == sent_id:
        return found
    if stored.outcome == "timed_out" and created:
        raise errors.WaitExpired(f"wait {found.wait_id} expired before this signal", found)
    return None


def deliver(
    store: port.Store,
    run: port.Run,
    name: str,
    payload: Any,
    signal_id: str | None,
    sealer: payloads.Payloads = payloads.PLAIN,
) -> records.Receipt:
    """Settle the wait ``name`` names on a live run; return the receipt.

    The payload is sealed by ``sealer`` (the app's payload layer); the
    receipt's digest is of the text stored.

    Raises:
        errors.WaitSettled: the one wait named was settled otherwise, or the run was asked
            to cancel (carries the latest receipt of that name).
        errors.WaitExpired: the wait it would settle was past its deadline.
        errors.RunFinished: the run ended meanwhile (the caller answers from its journal).
    """
    base, exact = target(name)
    run_id = run.run_id
    if signal_id is not None:
        codec.check_text("a signal id", signal_id)
    sent_id = signal_id or uuid.uuid4().hex
    outcomes = store.outcomes(run_id)
    if signal_id is not None:
        for known in outcomes:
            if known.signal_id == signal_id and index_of(base, known.name) is not None:
                return receipt(known)
    mine = [o for o in outcomes if index_of(base, o.name) is not None]
    if run.cancel_requested and exact is None and mine:
        # The run is unwinding: a signal kept for a later wait would never be
        # applied, so the sender is shown how its last wait on the name ended.
        latest = receipt(max(mine, key=lambda o: index_of(base, o.name) or 0))
        raise errors.WaitSettled(f"wait {latest.wait_id} was already {latest.outcome}", latest)
    text = sealer.seal(payload, "the signal's payload")
    digest = codec.digest(text)
    taken = {index_of(base, o.name) for o in mine}
    index = 1
    while True:
        if exact is None:
            while index in taken:
                index += 1
        key = exact or wait_key(base, index)
        offered = port.Outcome(run_id, key, "signaled", sent_id, text, digest, store.now())
        stored, created = store.settle_wait(run_id, key, offered)
        answered = _answer(stored, created, sent_id)
        if answered is not None:
            return answered
        if exact is not None:
            found = receipt(stored)
            raise errors.WaitSettled(f"wait {found.wait_id} was already {stored.outcome}", found)
        # Another signal, a timeout or a cancel settled it after we read: the next one.
        taken.add(index)


def _journal_receipt(run_id: str, entry: port.JournalEntry) -> records.Receipt | None:
    """Rebuild the receipt of a settled wait from its journal entry."""
    try:
        if entry.status == "ok":
            signaled = journal.Signaled.decode(entry.output)
            outcome, at = "signaled", signaled.at
            signal_id, digest = signaled.signal_id, signaled.digest
        else:
            ended = journal.WaitEnded.decode(entry.error)
            outcome, at, signal_id, digest = ended.outcome, ended.at, None, None
    except journal.Unreadable:
        return None  # a shape from before receipts were kept
    return records.Receipt(
        wait_id=f"{run_id}/{entry.name}",
        run_id=run_id,
        name=entry.name,
        outcome=outcome,
        signal_id=signal_id,
        at=at,
        payload_digest=digest,
    )


def ended_answer(
    store: port.Store, run: port.Run, name: str, signal_id: str | None
) -> records.Receipt:
    """Answer a signal to an ended run from its journal: a sender's retry gets its receipt.

    Raises:
        errors.WaitSettled: the waits it names were settled otherwise (carries the latest).
        errors.RunFinished: the run ended without settling any of them.
    """
    base, exact = target(name)

    def named(key: str) -> int | None:
        index = index_of(base, key)
        return index if exact is None or key == exact else None

    # The journal holds the waits the run applied; a signal it never applied
    # keeps its record after the end, so that its sender is answered too.
    settled: dict[int, records.Receipt] = {}
    for entry in store.journal(run.run_id):
        index = named(entry.name)
        if entry.kind != "wait" or entry.status == "started" or index is None:
            continue
        found = _journal_receipt(run.run_id, entry)
        if found is not None:
            settled[index] = found
    for kept in store.outcomes(run.run_id):
        index = named(kept.name)
        if index is not None and index not in settled:
            settled[index] = receipt(kept)
    for found in settled.values():
        if found.outcome == "signaled" and signal_id and found.signal_id == signal_id:
            return found
    if not settled:
        raise errors.RunFinished(run.run_id, run.state)
    latest = settled[max(settled)]
    raise errors.WaitSettled(f"wait {latest.wait_id} was already {latest.outcome}", latest)
