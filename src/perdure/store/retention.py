"""The retention section of the store port: deleting runs that ended long ago.

A run is pruned with everything recorded for it (journal, ledger, waits,
outcomes, messages, updates) once it has ended (``succeeded``, ``failed`` or
``canceled``) before a cutoff. A run that is live or in ``needs_attention``
is never pruned, whatever its age. Each call deletes a bounded batch in one
transaction, so that pruning a large store never holds the claim path for
long; the worker's sweep and ``perdure prune`` repeat it.

:func:`prune_paced` is that repetition for pruning a backlog in one go (what
``perdure prune`` does): batch after batch until none is left, resting after
each one a multiple of the time it took. On PostgreSQL a batch does not lock
anything a claim needs, but its deletions fill the write-ahead log that a
claim committing meanwhile must flush too, and take a core of the server:
back to back, batches slowed the claims' tail 3x (``bench/prune.py``,
RELIABILITY.md). Resting in proportion to the batch's own duration keeps
pruning's share of the server's time bounded whatever the server's speed or
load (a slow batch is followed by a long rest).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime
from typing import Protocol, runtime_checkable

from perdure import errors

PRUNABLE_STATES = ("succeeded", "failed", "canceled")
# Runs per batch, for the worker's sweep and ``perdure prune``.
DEFAULT_BATCH = 500
# Rest after each batch of ``prune_paced``, in multiples of its duration:
# pruning then takes at most 1 / (1 + 3) of the time.
DEFAULT_PAUSE_FACTOR = 3.0
# No single rest is longer, so that a batch stalled by an unrelated lock does
# not park the pruning for minutes.
MAX_PAUSE = 5.0


@runtime_checkable
class PrunableStore(Protocol):
    """The store's retention operation."""

    def prune(self, app: str, ended_before: datetime, limit: int = 500) -> int:
        """Delete up to ``limit`` of the app's runs that ended before ``ended_before``.

        Returns how many runs were deleted (with their records).
        """
        ...


def prune_paced(
    store: PrunableStore,
    app: str,
    ended_before: datetime,
    *,
    batch: int = DEFAULT_BATCH,
    pause_factor: float = DEFAULT_PAUSE_FACTOR,
    on_batch: Callable[[int, float], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> int:
    """Prune every run of ``app`` that ended before ``ended_before``, one batch at a time.

    After each batch that deleted runs, rests ``pause_factor`` times as
    long as the batch took (at most :data:`MAX_PAUSE` seconds); 0 runs the
    batches back to back. ``on_batch(deleted, seconds)`` is told of each
    batch. Stops at the first batch that deletes nothing (runs another
    transaction holds are skipped, so a short batch does not mean the end).
    Returns how many runs were deleted.

    Raises:
        errors.InvalidInput: ``batch`` below 1, or a negative ``pause_factor``.
    """
    if batch < 1:
        raise errors.InvalidInput(f"batch must be at least 1, got {batch}")
    if not pause_factor >= 0:
        raise errors.InvalidInput(f"pause_factor must be 0 or more, got {pause_factor}")
    total = 0
    while True:
        began = clock()
        pruned = store.prune(app, ended_before, batch)
        took = clock() - began
        total += pruned
        if on_batch is not None:
            on_batch(pruned, took)
        if pruned == 0:
            return total
        if pause_factor > 0:
            sleep(min(took * pause_factor, MAX_PAUSE))
