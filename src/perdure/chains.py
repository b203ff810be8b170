"""Continue-as-new: a run that hands over to a successor with a fresh journal.

``ctx.continue_as_new(...)`` raises :class:`ContinueAsNew`, which unwinds the
workflow code like any control signal; the worker's execution then ends the
run and creates its successor in one store transaction
(:mod:`perdure.store.chainport`). The runs form a *chain*: the first run id
keeps answering ``get``, ``result()``, signals, messages and cancel
(:mod:`perdure.lineage` finds the chain's current run for the client).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from perdure import errors


@dataclass
class Handover:
    """What the successor starts with: its workflow, version and encoded input.

    ``consumed`` maps each channel to the sequence of the last message the
    run consumed on it; the store moves the others to the successor.
    """

    workflow: str
    version: str
    input: str
    consumed: dict[str, int] = field(default_factory=dict)


class ContinueAsNew(errors.Interrupt):
    """The run ends here and its successor starts (never caught by workflow code)."""

    code: ClassVar[str] = "continued_as_new"

    def __init__(self, handover: Handover) -> None:
        self.handover = handover
        super().__init__(f"continued as new ({handover.workflow} version {handover.version})")
