"""The ends of one claim of a run: ended, continued as new, or released.

:class:`Settlement` is a part of :class:`~perdure.execution.Execution` (a base
class of it): every way the workflow code stops (a result, an exception, a
cancel, a suspend, a halt) is settled here with one fenced write, which ends
the run (succeeded, failed, canceled, or set aside for an operator), ends it
and starts its successor, or releases it to be claimed again.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from perdure import (
    chains,
    codec,
    effects,
    endings,
    errors,
    journal,
    logs,
    replay,
    steps,
    writebuffer,
)
from perdure import host as host_api
from perdure.store import chainport, port


def error_text(code: str, message: str, **extra: Any) -> str:
    """Encode the error a run ends with (or is released after)."""
    return codec.encode(steps.error_dict(code, message, **extra))


class Settlement:
    """How an Execution ends its claim of the run."""

    # What the Execution supplies.
    host: host_api.Host
    store: port.Store
    claimed: port.Claimed
    run_: port.Run
    log: logs.RunLog
    ended: str
    _buffer: writebuffer.WriteBuffer
    _cursor: replay.JournalCursor | None

    if TYPE_CHECKING:

        @property
        def claim(self) -> port.Claim: ...

        def acknowledge_cancel(self) -> None: ...

        def _settle_suspend(self) -> None: ...

        def _enforce_deadline(self) -> None: ...

        def _deadline_error(self) -> str | None: ...

    def _settle(self, exc: BaseException) -> None:
        if isinstance(exc, errors.StaleClaim):
            raise exc
        if isinstance(exc, errors.Suspended):
            self._settle_suspend()
            return
        if isinstance(exc, errors.Canceled):
            self.acknowledge_cancel()
            self._settle_cancel()
        elif isinstance(exc, chains.ContinueAsNew):
            self._continue(exc.handover)
        elif isinstance(exc, steps.Halt):
            if exc.reason == "needs_attention":
                self._finish("needs_attention", error=codec.encode(exc.error))
            elif exc.reason == "release":
                self._release(failed=False, why="worker stopping")
            else:
                self._release(failed=True, why=exc.error.get("message", ""))
        elif isinstance(exc, errors.CorruptState):
            self._finish("needs_attention", error=error_text(exc.code, str(exc)))
        elif isinstance(exc, errors.StepFailed):
            self._finish("failed", error=error_text(exc.code, str(exc), step=exc.step))
        elif isinstance(exc, errors.WaitTimedOut | errors.ChildFailed | errors.InvalidPayload):
            self._finish("failed", error=error_text(exc.code, str(exc)))
        elif isinstance(exc, Exception):
            self._finish(
                "failed",
                error=error_text(
                    "workflow_failed", f"{type(exc).__name__}: {exc}", type=type(exc).__name__
                ),
            )
        else:
            raise exc

    def unsettled_effect(self) -> str | None:
        """Return the ``once`` step whose effect started with no recorded outcome, if any."""
        known = self._cursor.entries() if self._cursor is not None else self.claimed.journal
        return next((e.name for e in known if journal.unsettled(e)), None)

    def _settle_cancel(self) -> None:
        unsettled = self.unsettled_effect()
        if unsettled is not None:
            self._finish(
                "needs_attention",
                error=error_text(
                    "effect_outcome_unknown",
                    f"the run was canceled while the effect of step {unsettled} was unsettled",
                    step=unsettled,
                ),
            )
        else:
            # As when the store cancels a queued or waiting run: no error,
            # unless the run passed its deadline.
            self._finish("canceled", error=self._deadline_error())

    def _finish(
        self, state: port.RunState, *, result: str | None = None, error: str | None = None
    ) -> None:
        if state in ("succeeded", "failed"):
            try:
                self._enforce_deadline()
            except (Exception, steps.Halt) as exc:
                self.log.warning("could not check the run's deadline: %s", exc)
        entries, marks = self._buffer.take()
        try:
            self.store.finish(
                self.claim, entries, state=state, result=result, error=error, marks=marks
            )
        except errors.Canceled:
            if state in ("canceled", "needs_attention"):
                raise
            self._buffer.restore(entries, marks)
            self.acknowledge_cancel()
            self._settle_cancel()
            return
        except errors.StaleClaim:
            raise
        except Exception as exc:
            self.log.warning("could not record %s: %s", state, exc)
            return
        self.ended = state
        # A plan run's result is its tasks' outputs, each sealed on its own:
        # its caller reads that back rather than be handed it.
        handed = state == "succeeded" and self.run_.plan_digest is None
        report = endings.Ended(result) if handed else None
        endings.of(self.store).ended(self.claim.run_id, report)
        detail = f": {codec.decode(error).get('message')}" if error else ""
        self.log.info("%s%s", state, detail)

    def _continue(self, handover: chains.Handover) -> None:
        """End the run and create its successor, in one store transaction."""
        entries, marks = self._buffer.take()
        run = self.run_
        successor = port.NewRun(
            uuid.uuid4().hex, run.app, handover.workflow, handover.version, handover.input
        )
        try:
            store = chainport.require(self.store)
            store.continue_run(
                self.claim, entries, successor, consumed=handover.consumed, marks=marks
            )
        except errors.Canceled:
            self._buffer.restore(entries, marks)
            self.acknowledge_cancel()
            self._settle_cancel()
            return
        except errors.LeaseLost:
            raise
        except Exception as exc:
            self._release(failed=True, why=f"could not continue as new: {exc}")
            return
        self.ended = "continued"
        endings.of(self.store).ended(self.claim.run_id)
        self.log.info("continued as new: %s", successor.run_id)

    def _release(self, *, failed: bool, why: str) -> None:
        failures = self.run_.failures + (1 if failed else 0)
        if failed and failures >= self.host.registry.max_failures:
            self._finish(
                "needs_attention",
                error=error_text(
                    "poison_run", f"{failures} consecutive attempts failed; last: {why}"
                ),
            )
            return
        delay = effects.release_backoff(failures) if failed else 0.0
        try:
            self.store.release(self.claim, delay=delay, failed=failed)
        except errors.LeaseLost:
            raise
        except Exception as exc:
            self.log.warning("release failed (%s); its lease will lapse", exc)
            return
        self.ended = "released"
        self.log.info("released%s", f" after failure: {why}" if failed else "")
