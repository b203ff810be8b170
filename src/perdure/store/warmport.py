"""Port section: wake-ups that name their run, and the claim of a run its worker keeps warm.

A worker that parks a run warm (:mod:`perdure.warm`) waits for the run to be
woken and then claims it like any other ready run. The general claim looks at
every way a run of the app becomes ready, in one transaction of its own; when
the wake-up names the run and the worker holds that run warm, the worker may
instead claim just that run, by key, at the generation it parked it with
(:meth:`WarmClaims.claim_warm`). A run claimed since (by any worker) has a
newer generation and is refused; so is one that is not ready, is in a queue,
or belongs to another app, and the worker claims the ordinary way then.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from perdure.store import port


@dataclass(frozen=True)
class Woken:
    """What the wake-ups since the last look named."""

    runs: frozenset[str]
    """Runs each woken by name (a delivery, a signal, a message, a timer's settlement)."""
    others: bool
    """A wake-up named no run (a run created, a local wake-up, a lost listener)."""
    updates: Mapping[str, port.UpdateRecord] = field(default_factory=dict)
    """The update whose delivery woke a named run, by run id, where the wake-up carried it."""


def carried_updates(
    known: port.KnownJournal, carried: port.UpdateRecord | None
) -> dict[tuple[str, int], port.UpdateRecord]:
    """The update waits of ``known`` that ``carried`` answers exactly, as ``Claimed.updates``.

    A run's updates are numbered one by one in delivery order and kept until
    the run ends, so an update of the waited name numbered right after the
    wait's sequence is the first one after it, now and at any later time.
    Any other (a later number, another name) might not be: the run reads.
    """
    if carried is None:
        return {}
    return {
        (name, after): carried
        for name, after in known.updates
        if carried.name == name and carried.sequence == after + 1
    }


ANY = Woken(frozenset(), True)
"""What a store whose wake-ups name no run reports: claim the ordinary way."""


@runtime_checkable
class WarmClaims(Protocol):
    """The store operations of claims of warm-parked runs."""

    def woken(self) -> Woken:
        """Return what the wake-ups seen by ``wait_ready`` since the last call named.

        Each wake-up is reported once, to one caller: a caller that gets
        nothing named claims the ordinary way, so sharing the store between
        several claimers costs only that.
        """
        ...

    def claim_warm(
        self,
        app: str,
        worker: str,
        workflows: Sequence[tuple[str, str]],
        *,
        run_id: str,
        known: port.KnownJournal,
        lease_ttl: float,
        dry_run: bool = False,
    ) -> port.Claimed | None:
        """Claim ``run_id`` alone, if it is ready and unclaimed since ``known`` was parked.

        The run must be of ``app``, in no queue, of a listed (workflow,
        version), match ``dry_run``, and be ready as :meth:`port.Store.claim`
        defines it except lapsed (``queued`` and due, or ``waiting`` with a
        due deadline) at ``known.generation``. It is claimed as the ordinary
        claim would (generation + 1, ``claimed`` receipt, lease of
        ``lease_ttl`` seconds) only when the journal's ``started`` tail reads
        back as ``known`` holds it (``resolve`` may have changed it), and
        returned with ``known``'s journal and the run's outcomes, of which
        those named in ``known.outcomes`` may be left out. So a claim by key
        is made only for the journal its worker holds, and that worker may
        write under it before the claim is back (:class:`AnswersAhead`).
        None: not claimed (the caller claims the ordinary way).
        """
        ...


@runtime_checkable
class AnswersAhead(Protocol):
    """An update's answer sent while the claim by key that takes its run up commits."""

    def answer_ahead(
        self,
        claim: port.Claim,
        entries: Sequence[port.JournalEntry],
        update_id: str,
        response: str,
        marks: Sequence[port.Mark] = (),
    ) -> bool:
        """Answer as ``answer_update`` does once ``claim`` (by its generation and worker) commits.

        Waits for the run's row lock, so a claim in progress is waited for.
        False: the run is not claimed so (nothing was written, nothing read).
        """
        ...

    def claim_answering(
        self,
        app: str,
        worker: str,
        workflows: Sequence[tuple[str, str]],
        *,
        run_id: str,
        known: port.KnownJournal,
        lease_ttl: float,
        dry_run: bool,
        entries: Sequence[port.JournalEntry],
        update_id: str,
        response: str,
        marks: Sequence[port.Mark] = (),
    ) -> tuple[port.Claimed | None, bool]:
        """:meth:`WarmClaims.claim_warm`, then ``answer_update`` under that claim, atomically.

        One commit for both: the claim of a warm run woken by an update and
        the answer its code gave before any other write. Returns the claim
        (None: not made, and nothing was written) and whether the answer was
        written; a claim can be made without it (the fence of the answer
        refuses a run whose cancel or suspend was requested), and then it
        stands and the run answers the ordinary way under it.
        """
        ...
