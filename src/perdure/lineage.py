"""The runs of a chain, as the client follows them: from any run id to the current run.

A run that continued as new (:mod:`perdure.chains`) is answered by the
current run of its chain: ``get``, ``result()``, signals, messages and cancel
sent to the first run id reach it.
"""

from __future__ import annotations

from perdure.store import chainport, port


def current(store: port.Store, run: port.Run) -> port.Run:
    """Return the current run of ``run``'s chain (``run`` itself if it did not continue)."""
    if run.continued_as is None:
        return run
    found = chainport.require(store).current_run(run.run_id)
    return run if found is None else found


def chain_ids(store: port.Store, run: port.Run) -> tuple[str, ...]:
    """Return the run ids of ``run``'s chain, first to current; ``()`` outside any chain."""
    if run.origin is None:
        return ()
    return tuple(r.run_id for r in chainport.require(store).chain(run.run_id))


def first(store: port.Store, run: port.Run) -> port.Run:
    """Return the first run of ``run``'s chain, whose inputs its key names (``run`` if pruned)."""
    if run.origin is None or run.origin == run.run_id:
        return run
    found = store.get_run(run.origin)
    return run if found is None else found
