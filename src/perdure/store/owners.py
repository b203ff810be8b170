"""The app-owner section's store operations, written once over named queries.

:class:`OwnerTransitions` adds :mod:`perdure.store.ownerport` to an SQL
adapter; ``own`` is one transaction over the queries ``docs/store.md`` lists
under "App owners".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TypeVar

from perdure import errors
from perdure.store import claiming, ownerport, port, transitions

C = TypeVar("C")


class OwnerTransitions(claiming.ClaimTransitions[C]):
    """App owners, shared by the SQL adapters."""

    def own(
        self, app: str, posture: ownerport.Posture, holder: str, *, ttl: float
    ) -> ownerport.Ownership:
        """Take or renew the app's record (see :class:`ownerport.OwnerStore`)."""
        if posture not in ownerport.POSTURES:
            raise errors.InvalidInput(
                f"ownership must be one of {', '.join(ownerport.POSTURES)}, got {posture!r}"
            )
        seconds = transitions.seconds(ttl, "ttl", positive=True)
        params = {"app": app, "posture": posture, "holder": holder, "ttl": seconds}

        def work(cur: C) -> ownerport.Ownership:
            found = self._exec(cur, "owner_lock", app=app).fetchone()
            if found is None:
                row = self._exec(cur, "owner_insert", **params).fetchone()
                if row is None:  # another process inserted it first: judge its record
                    return work(cur)
                return ownerport.Ownership(app, posture, holder, int(row["generation"]))
            shared = found["posture"] == posture == "run-lease"
            mine = found["holder"] == holder and found["posture"] == posture
            if not (mine or shared or found["expired"]):
                raise errors.OwnershipConflict(
                    app,
                    holder,
                    posture,
                    found["holder"],
                    found["posture"],
                    float(found["expires_in"]),
                )
            takeover = not (mine or shared)
            row = self._exec(cur, "owner_update", takeover=int(takeover), **params).fetchone()
            lapsed: tuple[str, ...] = ()
            if takeover:
                done = self._exec(cur, "owner_lapse", app=app, holder=found["holder"])
                lapsed = tuple(r["run_id"] for r in done.fetchall())
                tasks = self._exec(cur, "owner_lapse_tasks", app=app, holder=found["holder"])
                lapsed += tuple(sorted({r["run_id"] for r in tasks.fetchall()} - set(lapsed)))
                if lapsed:
                    self._notify(cur, [app])
            return ownerport.Ownership(
                app,
                posture,
                holder,
                int(row["generation"]),
                taken_from=found["holder"] if takeover else None,
                lapsed=lapsed,
            )

        return self._transact(work)

    def disown(self, app: str, holder: str) -> None:
        """Delete the app's record if ``holder`` holds it."""
        self._transact(lambda cur: self._exec(cur, "owner_drop", app=app, holder=holder))

    def claim_owned(
        self,
        owned: ownerport.Ownership,
        workflows: Sequence[tuple[str, str]],
        *,
        lease_ttl: float,
        limit: int = 1,
        recover_until: datetime | None = port.RECOVER_ANY,
        dry_run: bool = False,
        known: Mapping[str, port.KnownJournal] | None = None,
    ) -> list[port.Claimed]:
        """Claim only while ``owned`` is the app's live record (see ownerport.OwnedClaims)."""
        ttl = transitions.seconds(lease_ttl, "lease_ttl", positive=True)
        if limit < 1 or not workflows:
            return []
        app, holder = owned.app, owned.holder

        def work(cur: C) -> list[port.Claimed]:
            found = self._exec(cur, "owner_lock", app=app).fetchone()
            if (
                found is None
                or found["holder"] != holder
                or int(found["generation"]) != owned.generation
                or found["expired"]
            ):
                raise errors.OwnershipConflict(
                    app,
                    holder,
                    owned.posture,
                    "nobody" if found is None else found["holder"],
                    "none" if found is None else found["posture"],
                    0.0 if found is None else float(found["expires_in"]),
                )
            return self._claim_all(
                cur, app, holder, workflows, ttl, limit, recover_until, dry_run, known or {}
            )

        return self._transact(work)
