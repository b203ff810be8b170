"""The app-owner section's store operations, written once over named queries.

:class:`OwnerTransitions` adds :mod:`perdure.store.ownerport` to an SQL
adapter; ``own`` is one transaction over the queries ``docs/store.md`` lists
under "App owners".
"""

from __future__ import annotations

from typing import TypeVar

from perdure import errors
from perdure.store import ownerport, transitions

C = TypeVar("C")


class OwnerTransitions(transitions.Transitions[C]):
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
