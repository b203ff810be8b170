"""The retention section of the store port: deleting runs that ended long ago.

A run is pruned with everything recorded for it (journal, ledger, waits,
outcomes, messages) once it has ended (``succeeded``, ``failed`` or
``canceled``) before a cutoff. A run that is live or in ``needs_attention``
is never pruned, whatever its age. Each call deletes a bounded batch in one
transaction, so that pruning a large store never holds the claim path for
long; the worker's sweep and ``perdure prune`` repeat it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Protocol, runtime_checkable

PRUNABLE_STATES = ("succeeded", "failed", "canceled")


@runtime_checkable
class PrunableStore(Protocol):
    """The store's retention operation."""

    def prune(self, app: str, ended_before: datetime, limit: int = 500) -> int:
        """Delete up to ``limit`` of the app's runs that ended before ``ended_before``.

        Returns how many runs were deleted (with their records).
        """
        ...
