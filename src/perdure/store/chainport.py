"""The chain section of the store port: a run that continues as new.

A claimed run may end by handing over to a *successor*: a new run of the same
workflow, with a fresh journal and new inputs, created queued in the same
transaction that ends the old one. The old run ends ``succeeded`` with no
result and names its successor (``continued_as``); every run of the chain
names the chain's first run (``origin``). The runs of a chain are therefore
ordered links from the first to the *current* one, the one link that has not
continued.

What moves to the successor in that transaction:

- the run key (the old run gives it up, so a start under the key returns the
  current run of the chain);
- the parent (``parent_id`` and ``parent_close``): the parent's wait on its
  child is named after the chain's first run, and is settled when the chain
  ends for good;
- the messages the old run has not consumed, renumbered from 1 in their send
  order; the keys of the messages it consumed are kept too, below sequence 1,
  so that a sender repeating one across the boundary is still refused as a
  duplicate (they are dropped at the next continue);
- the signals sent to waits the old run never reached (outcome records of
  ``signaled`` waits with no applied journal entry), renamed in arrival order
  within each wait name: ``submit#3`` and ``submit#4`` become ``submit`` and
  ``submit#2`` of the successor.

Everything else follows the end-of-run rules of ``finish``: the old run's
waits and other records are dropped, its pending updates are abandoned, and
its children whose ``parent_close`` is ``cancel`` are canceled with their
descendants (the others run on).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, cast, runtime_checkable

from perdure import errors
from perdure.store import port


@runtime_checkable
class ChainStore(Protocol):
    """The store's continue-as-new operations."""

    def continue_run(
        self,
        claim: port.Claim,
        entries: Sequence[port.JournalEntry],
        successor: port.NewRun,
        *,
        consumed: Mapping[str, int],
        marks: Sequence[port.Mark] = (),
    ) -> port.Run:
        """End the claimed run and create its queued successor, in one transaction (fenced).

        ``entries`` are the old run's last journal entries; ``consumed`` maps
        each channel to the sequence of the last message the old run
        consumed on it (a channel not named: none). ``successor`` gives the
        new run's id, workflow, version and input; its app, key, parent and
        parent_close are the old run's, whatever it says. The old run's
        ledger ends with ``continued`` (its note names the successor); the
        successor's opens with ``initialized`` (its note names the old run).

        Returns the successor as stored.

        Raises:
            errors.StaleClaim: the claim is no longer the run's.
            errors.Canceled: the run's cancel was requested (nothing is written).
            errors.InvalidInput: the successor's run id is taken.
        """
        ...

    def chain(self, run_id: str) -> list[port.Run]:
        """Return the runs of ``run_id``'s chain, first to current; ``[run]`` outside any chain.

        Raises:
            errors.RunNotFound: no run has this id.
        """
        ...

    def current_run(self, run_id: str) -> port.Run | None:
        """Return the current run of ``run_id``'s chain (the run itself outside any chain)."""
        ...


def require(store: port.Store) -> ChainStore:
    """Return ``store`` as a :class:`ChainStore`, or refuse a store without chains.

    Raises:
        errors.InvalidInput: the store lacks the operations of this section.
    """
    missing = [n for n in ("continue_run", "chain", "current_run") if not hasattr(store, n)]
    if missing:
        raise errors.InvalidInput(
            f"the store {store.url} cannot continue runs as new (it has no {', '.join(missing)})"
        )
    return cast(ChainStore, store)
