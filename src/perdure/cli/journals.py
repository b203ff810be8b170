"""``perdure show RUN --journal``: the journal as rows, with each step's duration.

The journal holds no instants of its own, so a step's duration is read from
the provenance ledger: from its effect's first start (a ``once`` step) or from
the run's previous receipt (the claim or the write before it) to the receipt of
its outcome. It includes the pauses between retries; a step whose receipts the
bounded ledger no longer keeps shows no duration.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from perdure import records
from perdure.cli import common, output
from perdure.store import port

# How much of an output or an error a line shows; --json shows them whole.
WIDTH = 48

_ENDED = ("step_completed", "step_failed")


def durations(ledger: Sequence[records.Provenance]) -> dict[str, float]:
    """Return the seconds each step key took, as far as the ledger still shows."""
    found: dict[str, float] = {}
    began: dict[str, datetime] = {}
    previous: datetime | None = None
    for receipt in ledger:
        step = receipt.step
        if step and receipt.kind == "effect_started":
            began.setdefault(step, receipt.at)
        elif step and receipt.kind == "step_started" and previous is not None:
            # Appended with the outcome: the step began after the previous write.
            began.setdefault(step, previous)
        if step and receipt.kind in _ENDED:
            start = began.get(step, previous)
            if start is not None:
                found[step] = max(0.0, (receipt.at - start).total_seconds())
        if receipt.kind != "step_started":
            previous = receipt.at
    return found


def _decoded(text: str | None) -> Any:
    if text is None:
        return None
    try:
        # Sealed payloads inside a body open with perdure --codec, else show as stored.
        return common.payload_layer().reveal(json.loads(text))
    except ValueError:
        return text  # shown as stored; validation elsewhere names corruption


def rows(
    entries: Sequence[port.JournalEntry], ledger: Sequence[records.Provenance]
) -> list[dict[str, Any]]:
    """Return one document per journal position, oldest first."""
    took = durations(ledger)
    return [
        {
            "position": e.position,
            "kind": e.kind,
            "name": e.name,
            "status": e.status,
            "attempts": e.attempt,
            "duration": took.get(e.name) if e.kind == "step" else None,
            "output": _decoded(e.output),
            "error": _decoded(e.error),
        }
        for e in entries
    ]


def _cut(text: str) -> str:
    return text if len(text) <= WIDTH else text[: WIDTH - 3] + "..."


def _error_text(error: Any) -> str:
    if error is None:
        return "-"
    if isinstance(error, dict):
        kind = error.get("type") or error.get("code") or "error"
        return f"{kind}: {error.get('message', '')}"
    return str(error)


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.0f}ms" if value < 1 else f"{value:.2f}s"


def table(docs: Sequence[dict[str, Any]]) -> list[str]:
    """Return the journal as aligned lines for people."""
    return output.table(
        ["POS", "KIND", "NAME", "STATUS", "ATTEMPTS", "DURATION", "OUTPUT", "ERROR"],
        [
            [
                str(d["position"]),
                d["kind"],
                d["name"],
                d["status"],
                str(d["attempts"]),
                _seconds(d["duration"]),
                "-" if d["output"] is None else _cut(output.compact(d["output"])),
                _cut(_error_text(d["error"])),
            ]
            for d in docs
        ],
    )
