"""Records as query parameters: a batch of records as parallel lists, one per column.

A transition that writes or looks up many rows at once (journal entries, receipts, a
fan-out of children, the waits of a park) passes each column as one list,
named by the query's parameter: PostgreSQL unnests them as arrays; SQLite
receives them zipped into one JSON array of rows (each adapter's ``_batch``).
Each ``*_ARRAYS`` table maps a parameter to the record attribute it lists.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

ENTRY_ARRAYS = {
    "positions": "position",
    "kinds": "kind",
    "names": "name",
    "statuses": "status",
    "outputs": "output",
    "errors": "error",
    "attempts": "attempt",
}
RECEIPT_ARRAYS = {
    "run_ids": "run_id",
    "sequences": "sequence",
    "kinds": "kind",
    "generations": "generation",
    "workers": "worker",
    "steps": "step",
    "digests": "digest",
    "notes": "note",
}
CHILD_ARRAYS = {
    "run_ids": "run_id",
    "apps": "app",
    "workflows": "workflow",
    "versions": "version",
    "inputs": "input",
    "keys": "key",
    "parent_closes": "parent_close",
}
KEY_ARRAYS = {"apps": "app", "keys": "key"}
WAIT_ARRAYS = {
    "names": "name",
    "kinds": "kind",
    "deadlines": "deadline",
    "after": "after_sequence",
}


def arrays(items: Sequence[object], columns: dict[str, str]) -> dict[str, list[Any]]:
    """Return one list per query parameter (``{param: attribute}``)."""
    return {param: [getattr(item, attr) for item in items] for param, attr in columns.items()}
