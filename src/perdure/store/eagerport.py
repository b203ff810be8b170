"""Port section: a run created already claimed by a worker of the process that starts it.

A process that both starts runs and serves them (an app with its own
worker, a script, a test) need not announce a new run and then claim it
back: when its worker has a free slot, the start stores the run as the
claim would leave it, running under that worker at generation 1 with a
lease, in the write that creates it. Nothing else changes: the lease is
renewed as any claim's, and if the process dies the run lapses and any
worker recovers it (``failures`` 1, a ``recovered`` receipt).

Only a run that an ordinary claim could take at once is created this way:
in no queue (a queue's limits are judged by its claims) and with no plan
(its tasks are claimed one by one).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from perdure.store import port


@runtime_checkable
class EagerStarts(Protocol):
    """The store operation of an eager start."""

    def create_claimed(
        self, new: port.NewRun, worker: str, *, lease_ttl: float
    ) -> tuple[port.Run, port.Claimed | None]:
        """Create ``new`` running under ``worker``, or return the run stored under its key.

        A created run is ``running`` at generation 1 under ``worker``, with a
        lease of ``lease_ttl`` seconds from the store's clock (and that
        ``lease_ttl`` kept, as a claim keeps it), its ledger ``initialized``
        then ``claimed``; no wake-up announces it. It is returned with its
        claim (an empty journal). A run already stored under ``(app, key)`` is
        returned as stored with None, untouched and unclaimed; an id already
        taken without a key is refused as ``create_run`` refuses it.

        Raises:
            errors.InvalidInput: ``new`` is in a queue or has a plan, the
                worker id or ``lease_ttl`` is malformed, or the id is taken.
        """
        ...
