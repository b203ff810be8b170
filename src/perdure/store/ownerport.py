"""Port section: which ownership posture serves an app (OwnerStore).

One record per app names the posture of the workers serving it
(``run-lease``, ``store-lease`` or ``none``), the worker that renewed it last
(its holder), until when it holds, and a generation that grows at every
takeover. Workers of different postures never serve one app at once: the
record of one refuses the other while it is live. A worker that takes the app
over from an expired holder makes that holder's running runs lapse under a new
generation, so its late writes are fenced off and the ordinary claim recovers
them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal, Protocol, runtime_checkable

from perdure import errors
from perdure.store import port

Posture = Literal["run-lease", "store-lease", "none"]
POSTURES: tuple[Posture, ...] = ("run-lease", "store-lease", "none")
"""``run-lease``: many workers, each run leased (shared by any number of
workers of that posture); ``store-lease`` and ``none``: one holder at a time."""


@dataclass(frozen=True)
class Ownership:
    """The record a worker holds: its posture, generation and the runs it fenced off."""

    app: str
    posture: Posture
    holder: str
    generation: int
    # The worker the app was taken from (its record had expired), if any.
    taken_from: str | None = None
    # Runs that worker left running, now lapsed for the ordinary claim.
    lapsed: tuple[str, ...] = ()


@runtime_checkable
class OwnerStore(Protocol):
    """The store operations of app ownership."""

    def own(self, app: str, posture: Posture, holder: str, *, ttl: float) -> Ownership:
        """Take or renew the app's record for ``holder`` until ``ttl`` seconds from now.

        The record is taken when there is none, renewed when ``holder``
        holds it with ``posture``, shared when both postures are
        ``run-lease`` (``holder`` becomes the one that renewed last), and taken
        over when it has expired: then the generation grows by one and the
        runs the previous holder left ``running`` lapse now under a new run
        generation.

        Raises:
            errors.OwnershipConflict: a live record names another holder that
                this one may not share the app with.
        """
        ...

    def disown(self, app: str, holder: str) -> None:
        """Delete the app's record if ``holder`` holds it (a clean stop)."""
        ...


def require(store: object) -> OwnerStore:
    """Return ``store`` as an OwnerStore, or refuse with a clear error."""
    if not isinstance(store, OwnerStore):
        raise errors.InvalidInput(
            f"the store {type(store).__name__} keeps no app owners, so only the "
            "run-lease posture can serve on it"
        )
    return store


@runtime_checkable
class OwnedClaims(Protocol):
    """Claims fenced by the app's owner record (the ``store-lease`` posture)."""

    def claim_owned(
        self,
        owned: Ownership,
        workflows: Sequence[tuple[str, str]],
        *,
        lease_ttl: float,
        limit: int = 1,
        recover_until: datetime | None = port.RECOVER_ANY,
        dry_run: bool = False,
        known: Mapping[str, port.KnownJournal] | None = None,
    ) -> list[port.Claimed]:
        """Claim as :meth:`port.Store.claim` does, only while ``owned`` is the live record.

        The record is checked in the claim's own transaction: a worker whose
        record expired or was taken over claims nothing.

        Raises:
            errors.OwnershipConflict: the record is another holder's, of
                another generation, or expired.
        """
        ...
