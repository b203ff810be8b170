"""Ownership postures: which workers may serve an app on a store at once.

``run-lease`` (the default) is many workers, each run claimed under a lease
the worker keeps renewing. ``none`` is one worker process and no run leases
to renew: it claims runs under a lease far in the future and keeps only its
app's owner record alive, from the heartbeat thread. A worker of one posture
is refused at start while a live record of another posture (or, for ``none``,
of another worker) serves the app (:class:`errors.OwnershipConflict`).

``store-lease`` is one active worker per app and store, and standbys: the
active one renews the app's record every heartbeat and claims only while the
record is its own (checked in each claim's transaction); a standby tries to
take the record every :data:`STANDBY_POLL` seconds and, once the active one
has been gone for ``lease_ttl``, takes it over.

After a ``none`` or ``store-lease`` worker dies its record expires
``lease_ttl`` seconds after its last renewal; the next worker takes the app
over, and the runs the dead worker left running lapse under a new generation
(so a worker that was only frozen writes nothing more to them) and are
recovered by the ordinary claim.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime

from perdure import errors
from perdure.store import ownerport, port

log = logging.getLogger("perdure.worker")

# The run lease of a ``none`` worker: nobody else may claim its runs, and it
# never renews them; a takeover makes them lapse (see ownerport).
UNRENEWED_LEASE = 10 * 365 * 24 * 3600.0

# How often a store-lease standby tries to take the app's record.
STANDBY_POLL = 0.2


def posture(value: str) -> ownerport.Posture:
    """Return ``value`` as a posture, or refuse it with a clear error."""
    for known in ownerport.POSTURES:
        if value == known:
            return known
    raise errors.InvalidInput(
        f"ownership must be one of {', '.join(ownerport.POSTURES)}, got {value!r}"
    )


class AppOwner:
    """A worker's hold on its app's owner record."""

    def __init__(
        self,
        store: port.Store,
        app: str,
        kind: ownerport.Posture,
        worker_id: str,
        ttl: float,
        *,
        lease_wait: float = 60.0,
        standby: bool = True,
    ) -> None:
        if lease_wait < 0:
            raise errors.InvalidInput(f"lease_wait must be at least 0 seconds, got {lease_wait}")
        self.lease_wait = lease_wait
        self.standby = standby
        self.app = app
        self.posture = kind
        self.worker_id = worker_id
        self.ttl = ttl
        # A store without owner records can only serve run-lease workers, as
        # it always has; the others need the record to exclude each other.
        self.store: ownerport.OwnerStore | None = (
            ownerport.require(store)
            if kind != "run-lease"
            else (store if isinstance(store, ownerport.OwnerStore) else None)
        )
        self.held: ownerport.Ownership | None = None

    def acquire(self) -> None:
        """Take the record at start.

        Raises:
            errors.OwnershipConflict: another posture (or another ``none``
                worker) serves the app.
        """
        if self.store is None or self.held is not None:
            return
        try:
            self.held = self.store.own(self.app, self.posture, self.worker_id, ttl=self.ttl)
        except errors.OwnershipConflict:
            if self.posture != "store-lease" or not self.standby:
                raise
            return  # a standby: stand_by() waits for the app
        self._took()

    def stand_by(self, stopping: threading.Event, watch: Callable[[], None]) -> bool:
        """Wait until this store-lease worker holds the app; False if it stopped first.

        After ``lease_wait`` seconds it logs which worker holds the app, once,
        and keeps standing by. ``watch`` is called at every try, so that the
        store's clock is trusted to recover the runs at once on a takeover.
        """
        assert self.store is not None
        started = time.monotonic()
        reported = False
        while self.held is None:
            try:
                watch()
                self.held = self.store.own(self.app, self.posture, self.worker_id, ttl=self.ttl)
            except errors.OwnershipConflict as exc:
                if not reported and time.monotonic() - started >= self.lease_wait:
                    reported = True
                    log.warning(
                        "worker %s stands by after %.0fs: worker %s holds app %s (ownership "
                        "%s); it takes over within %.0fs of that worker's end",
                        self.worker_id,
                        self.lease_wait,
                        exc.holder,
                        self.app,
                        exc.held_posture,
                        self.ttl,
                    )
            except Exception as exc:
                log.warning("worker %s: cannot read the app's owner: %s", self.worker_id, exc)
            if self.held is None and stopping.wait(STANDBY_POLL):
                return False
        self._took()
        return True

    def claim(
        self,
        store: port.Store,
        workflows: Sequence[tuple[str, str]],
        *,
        lease_ttl: float,
        limit: int,
        recover_until: datetime | None,
        dry_run: bool,
        known: Mapping[str, port.KnownJournal] | None = None,
    ) -> list[port.Claimed]:
        """Claim runs, fenced by the app's record under store-lease."""
        if self.posture != "store-lease" or self.held is None:
            return store.claim(
                self.app,
                self.worker_id,
                workflows,
                lease_ttl=lease_ttl,
                limit=limit,
                recover_until=recover_until,
                dry_run=dry_run,
                known=known,
            )
        owned = store
        assert isinstance(owned, ownerport.OwnedClaims)
        return owned.claim_owned(
            self.held,
            workflows,
            lease_ttl=lease_ttl,
            limit=limit,
            recover_until=recover_until,
            dry_run=dry_run,
            known=known,
        )

    def _took(self) -> None:
        assert self.held is not None
        if self.held.taken_from is not None and self.held.taken_from != self.worker_id:
            log.warning(
                "worker %s (ownership %s) took app %s over from worker %s, whose record "
                "had expired; %d run(s) it left running are recovered",
                self.worker_id,
                self.posture,
                self.app,
                self.held.taken_from,
                len(self.held.lapsed),
            )

    def renew(self) -> bool:
        """Renew the record; False if another worker holds the app now (stop serving it)."""
        if self.store is None or self.held is None:
            return True  # nothing held yet (a standby)
        try:
            self.held = self.store.own(self.app, self.posture, self.worker_id, ttl=self.ttl)
        except errors.OwnershipConflict as exc:
            log.error("worker %s lost app %s: %s", self.worker_id, self.app, exc)
            return False
        except Exception as exc:
            # An outage: the claim loop meets it too; the record may lapse meanwhile.
            log.warning("worker %s: cannot renew its owner record: %s", self.worker_id, exc)
        return True

    def release(self) -> None:
        """Give the record up at a clean stop, so that the next worker need not wait."""
        if self.store is None or self.posture == "run-lease":
            # Other run-lease workers may share it; it expires when the last one stops.
            return
        try:
            self.store.disown(self.app, self.worker_id)
        except Exception as exc:
            log.warning("worker %s: cannot give up its owner record: %s", self.worker_id, exc)
