"""The narrow runtime a :class:`perdure.Context` talks to, and the child runs it asks for.

The worker's execution implements :class:`Runtime` (and ``perdure check``
a read-only one); a test can fake it in memory. Everything a context reads
or writes goes through it: the context itself holds no store.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from perdure import chains, journal, live, steps


@dataclass(frozen=True)
class NewChild:
    """A child run to create; ``key`` (scoped to the parent) makes creation idempotent."""

    workflow: str
    version: str
    input: str
    key: str


class Runtime(steps.Runtime, Protocol):
    """What the worker supplies to a running context (beyond what steps need)."""

    def acknowledge_cancel(self) -> None:
        """Let clean-up writes through now that workflow code was told of the cancel."""

    def hold(self, waits: list[journal.WaitSpec], wake_at: datetime | None) -> bool:
        """Park the run here, in place, instead of unwinding its code.

        Returns True when the caller should look at its wait again: the park
        found the wait already met, or the run was parked and then taken up
        again by this worker (see :mod:`perdure.warm`). Returns False when the
        run must be parked the ordinary way (raise :class:`Parked`). May
        raise to unwind a run that was parked here and not taken up again.
        """

    def workflow_ref(self, workflow: Any) -> tuple[str, str, Any]:
        """Return (name, version, return hint) of a registered workflow or its name."""

    def child_call(
        self, workflow: Any, key: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[str | None, dict[str, Any]]:
        """Check a child's arguments as ``app.start`` does; return its key and keyword arguments.

        ``key=`` goes to a workflow that has a parameter named ``key``; the
        run key then comes from ``workflow.keyed(...)``.
        """

    def successor(
        self, version: str | None, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> chains.Handover:
        """Check a successor's arguments as ``app.start`` does; return what it starts with."""

    def now(self) -> datetime:
        """Return the store's current time."""

    def buffer(self, entry: journal.Entry, mark: journal.Mark | None = None) -> None:
        """Keep ``entry`` (and ``mark``) for the next durable write."""

    def outcome(self, name: str) -> journal.Outcome | None:
        """Return the outcome record of the wait ``name``, if it has one."""

    def settle_timeout(self, name: str) -> journal.Outcome:
        """Settle the wait ``name`` as timed out now; return the outcome that won."""

    def next_message(self, channel: str, after_sequence: int) -> journal.Message | None:
        """Return the first message on ``channel`` after ``after_sequence``."""

    def create_children(self, children: list[NewChild]) -> list[str]:
        """Create the child runs (fenced, in one write); return their run ids in order."""

    def next_update(self, name: str, after_sequence: int) -> live.UpdateReceived | None:
        """Return the first update named ``name`` after ``after_sequence``."""

    def answer_update(self, entry: journal.Entry, update_id: str, response: str) -> None:
        """Write ``entry`` (with what is buffered) and the update's answer, in one write."""

    def record_live(self, entry: journal.Entry) -> None:
        """Write ``entry`` (with what is buffered) now, for outside readers to see."""
