"""Waits, their outcomes and channel messages, written once over named queries.

:class:`WaitTransitions` adds the port's deliveries to
:class:`perdure.store.transitions.Transitions`, for every SQL adapter:
``settle_wait`` (a signal, a timeout or a cancel settling a registered wait),
``send`` (a channel message) and ``wake``, each of which wakes a waiting run
it concerns, and the reads of outcomes, open waits and messages.
``settle_wait`` and ``send`` lock the run's row before they write, as
``park`` does, so that a run that parks concurrently either sees the
delivery or is woken by it. Registering
waits is part of ``park``, and removing a run's records part of the
end-of-run rules, both in :mod:`perdure.store.transitions`.
"""

from __future__ import annotations

from typing import TypeVar

from perdure.store import port, rows, transitions

C = TypeVar("C")


class WaitTransitions(transitions.Transitions[C]):
    """Deliveries to waiting runs and the reads of what they wait for; ``C`` is the cursor."""

    def settle_wait(
        self, run_id: str, name: str, outcome: port.Outcome
    ) -> tuple[port.Outcome, bool]:
        """Create the wait's outcome record if none exists, and wake the run if it waits."""
        rows.check_outcome_kind(outcome.outcome)
        params = {
            "run_id": run_id,
            "name": name,
            "outcome": outcome.outcome,
            "signal_id": outcome.signal_id,
            "payload": outcome.payload,
            "payload_digest": outcome.payload_digest,
        }

        def work(cur: C) -> tuple[port.Outcome, bool]:
            run = self._lock_live(cur, run_id)  # orders this delivery with a concurrent park
            created = self._exec(cur, "outcome_put", **params).fetchone()
            if created is None:
                stored = self._exec(cur, "outcome_get", run_id=run_id, name=name).fetchone()
                if stored is None:
                    raise rows.corrupt(run_id, "outcome_missing", f"wait {name!r}")
                return self.read.outcome(stored), False
            if run.state == "waiting":
                self._wake(cur, [run_id])
            return self.read.outcome(created), True

        return self._transact(work)

    def outcomes(self, run_id: str) -> list[port.Outcome]:
        """Return every outcome record of the run."""
        found = self._transact(
            lambda cur: self._exec(cur, "outcomes", run_id=run_id).fetchall(), single=True
        )
        return [self.read.outcome(r) for r in found]

    def waits(self, app: str, run_id: str | None = None) -> list[port.WaitRecord]:
        """Return the registered waits that have no outcome, oldest first."""
        query = "waits_of_app" if run_id is None else "waits_of_run"
        found = self._transact(
            lambda cur: self._exec(cur, query, app=app, run_id=run_id).fetchall(), single=True
        )
        return [self.read.wait(r) for r in found]

    def wake(self, run_id: str) -> bool:
        """Make a waiting run queued; False if it was not waiting."""
        return bool(self._transact(lambda cur: self._wake(cur, [run_id])))

    def send(self, message: port.NewMessage) -> bool:
        """Store a channel message unless its key exists; wake the run if it waits on it."""
        params = vars(message)

        def work(cur: C) -> bool:
            run = self._lock_live(cur, message.run_id)
            if self._exec(cur, "message_put", **params).fetchone() is None:
                return False
            self._exec(cur, "message_counted", run_id=message.run_id)
            if run.state == "waiting":
                parked = {"run_id": message.run_id, "kind": "channel", "name": message.channel}
                self._woken(cur, self._exec(cur, "wake_on_wait", **parked).fetchall())
            return True

        return self._transact(work)

    def next_message(self, run_id: str, channel: str, after_sequence: int) -> port.Message | None:
        """Return the run's first message on ``channel`` after ``after_sequence``."""
        params = {"run_id": run_id, "channel": channel, "after_sequence": after_sequence}
        row = self._transact(
            lambda cur: self._exec(cur, "next_message", **params).fetchone(), single=True
        )
        return None if row is None else self.read.message(row)
