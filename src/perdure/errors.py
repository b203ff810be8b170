"""Every error perdure raises, each with a stable ``code``.

The tree::

    PerdureError (Exception)                 perdure_error
    ├── InvalidInput (+ ValueError)          invalid_input
    │   ├── LeaseTimingInvalid               lease_timing_invalid
    │   ├── InvalidPayload                   invalid_payload
    │   │   ├── PayloadTooLarge              payload_too_large
    │   │   └── PayloadUnreadable            payload_unreadable (this app cannot open it)
    │   │       ├── PayloadMissing           payload_missing   (not in the payload store)
    │   │       └── PayloadDigestMismatch    payload_digest_mismatch
    │   ├── InvalidStoreURL                  invalid_store_url
    │   ├── InvalidPlan                      invalid_plan      (a plan's task or shape is refused)
    │   ├── InvalidQueue                     invalid_queue     (bad limits, priority or queue key)
    │   ├── UnknownQueue                     unknown_queue     (a start names no declared queue)
    │   ├── ImportFailed                     import_failed     (MODULE:APP does not import)
    │   ├── AppNotFound                      app_not_found     (MODULE:APP names no App)
    │   └── ScheduleNotFound                 schedule_not_found
    ├── StoreError                           store_error
    │   ├── StoreUnavailable                 store_unavailable
    │   ├── StoreDamaged                     store_damaged     (the store's file is not sound)
    │   ├── SchemaTooNew                     schema_too_new
    │   └── CorruptState                     corrupt_state
    ├── RunNotFound                          run_not_found
    ├── WorkflowNotFound                     workflow_not_found
    ├── RunFinished                          run_finished
    ├── RunNotFinished                       run_not_finished
    ├── KeyConflict                          key_conflict
    ├── OwnershipConflict                    ownership_conflict (another worker serves the app)
    ├── EffectUnsettled                      effect_unsettled
    ├── RunFailed                            (the run's own error code)
    ├── ResultTimeout                        result_timeout
    ├── WaitSettled                          wait_settled
    ├── WaitExpired                          wait_expired
    ├── WaitStillOpen                        wait_still_open
    ├── NotResolvable                        not_resolvable
    ├── NotCanceled                          not_canceled
    ├── DemoFailed                           demo_failed
    ├── Unauthorized                         unauthorized      (no token, or a bad or old one)
    ├── Forbidden                            forbidden         (the token's app or scope forbids it)
    ├── TokenNotFound                        token_not_found
    ├── WaitTimedOut                         wait_timeout      (raised in workflow code)
    ├── StepFailed                           step_failed       (raised in workflow code)
    ├── StepTimedOut                         step_timed_out    (an attempt past its timeout)
    ├── EffectFailed                         effect_failed     (raised by a step's author)
    ├── ChildFailed                          child_failed      (raised in workflow code)
    ├── NonDeterminism                       non_determinism
    ├── UpdateRejected                       update_rejected   (a validator refused it)
    ├── UpdateAbandoned                      update_abandoned  (the run ended without answering)
    ├── UpdateTimedOut (+ TimeoutError)      update_timeout    (no answer in the time given)
    ├── RunEventMissing                      run_event_missing
    ├── UnknownQuery                         unknown_query
    └── QueryFailed                          query_failed

    Interrupt (BaseException)                interrupt
    ├── Suspend                              suspend
    └── LeaseLost                            lease_lost
        ├── StaleClaim                       stale_claim
        ├── Canceled                         canceled
        └── Suspended                        suspended

``Interrupt`` and its children are control signals: they unwind workflow code
(running its ``finally`` blocks) and must not be swallowed by a bare
``except Exception``, so they derive from ``BaseException``.

Every code the command line prints is one of these; a usage error prints
``invalid_input``. Codes that appear only in a run's recorded error (never raised as a class
here): ``effect_outcome_unknown``, ``poison_run``, ``workflow_failed``,
``resolved_failed``.
"""

from __future__ import annotations

from typing import Any, ClassVar


class PerdureError(Exception):
    """Something perdure refused or could not do."""

    code: ClassVar[str] = "perdure_error"

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or _first_line(type(self).__doc__))

    @property
    def message(self) -> str:
        return str(self)


def _first_line(doc: str | None) -> str:
    return (doc or "").strip().splitlines()[0] if doc else ""


class InvalidInput(PerdureError, ValueError):
    """The input is malformed."""

    code = "invalid_input"


class InvalidPlan(InvalidInput):
    """A plan's declaration is refused; the message names the task at fault."""

    code = "invalid_plan"

    def __init__(self, task: str, message: str) -> None:
        self.task = task
        # Callers may write the name into their sentence; otherwise it leads.
        named = not task or repr(task) in message
        super().__init__(message if named else f"task {task!r}: {message}")


class InvalidQueue(InvalidInput):
    """A queue's limits, or a start's queue, key or priority, are not ones perdure takes."""

    code = "invalid_queue"


class UnknownQueue(InvalidInput):
    """The start names a queue the app has not declared."""

    code = "unknown_queue"


class LeaseTimingInvalid(InvalidInput):
    """The heartbeat must be below the lease and at most a third of it."""

    code = "lease_timing_invalid"


class InvalidPayload(InvalidInput):
    """A payload is not a JSON value or does not match its declared type."""

    code = "invalid_payload"


class PayloadTooLarge(InvalidPayload):
    """A payload is larger than its app's limit; nothing was stored."""

    code = "payload_too_large"

    def __init__(self, what: str, size: int, limit: int) -> None:
        self.size = size
        self.limit = limit
        super().__init__(
            f"{what} is {size:,} bytes of JSON, over the limit of {limit:,} bytes "
            "(App(payload_limit=...))"
        )


class PayloadUnreadable(InvalidPayload):
    """A stored payload is sealed by a codec this app does not have, or cannot be decoded."""

    code = "payload_unreadable"


class PayloadMissing(PayloadUnreadable):
    """An offloaded payload is not in the payload store."""

    code = "payload_missing"


class PayloadDigestMismatch(PayloadUnreadable):
    """An offloaded payload's bytes in the payload store are not the ones its reference names."""

    code = "payload_digest_mismatch"


class InvalidStoreURL(InvalidInput):
    """The store URL cannot be used."""

    code = "invalid_store_url"


class ImportFailed(InvalidInput):
    """The module named by MODULE:APP does not import."""

    code = "import_failed"


class AppNotFound(InvalidInput):
    """MODULE:APP does not name a perdure.App."""

    code = "app_not_found"


class ScheduleNotFound(InvalidInput):
    """The app has no schedule of this name in the store."""

    code = "schedule_not_found"


class StoreError(PerdureError):
    """The store failed or holds something it should not."""

    code = "store_error"


class StoreUnavailable(StoreError):
    """The store cannot be reached."""

    code = "store_unavailable"


class StoreDamaged(StoreError):
    """The store's file is damaged (not a database, or corrupt); nothing was written."""

    code = "store_damaged"


class SchemaTooNew(StoreError):
    """The store's schema is newer than this version of perdure."""

    code = "schema_too_new"


class CorruptState(StoreError):
    """State read from the store breaks an invariant; the run is not advanced."""

    code = "corrupt_state"

    def __init__(self, run_id: str | None, invariant: str, detail: str = "") -> None:
        self.run_id = run_id
        self.invariant = invariant
        where = f"run {run_id}" if run_id else "store"
        tail = f": {detail}" if detail else ""
        super().__init__(f"corrupt state in {where} (invariant {invariant}){tail}")


class RunNotFound(PerdureError):
    """No run has this id."""

    code = "run_not_found"

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(f"no run with id {run_id!r}")


class WorkflowNotFound(PerdureError):
    """No workflow is registered under this name."""

    code = "workflow_not_found"

    def __init__(self, name: str, known: list[str] | None = None) -> None:
        self.name = name
        hint = f" (known: {', '.join(sorted(known))})" if known else ""
        super().__init__(f"no workflow named {name!r} is registered{hint}")


class RunFinished(PerdureError):
    """The run has already ended."""

    code = "run_finished"

    def __init__(self, run_id: str, state: str) -> None:
        self.run_id = run_id
        self.state = state
        super().__init__(f"run {run_id} has already ended ({state})")


class RunNotFinished(PerdureError):
    """The run is still live (queued, running or waiting)."""

    code = "run_not_finished"

    def __init__(self, run_id: str, state: str, message: str | None = None) -> None:
        self.run_id = run_id
        self.state = state
        super().__init__(message or f"run {run_id} is still {state}")


class KeyConflict(PerdureError):
    """The key already names a run of another workflow or with other inputs."""

    code = "key_conflict"

    def __init__(self, key: str, found: Any, workflow: str, dry_run: bool | None = None) -> None:
        self.key = key
        self.run_id: str = found.run_id
        found_dry = bool(getattr(found, "dry_run", False))
        if found.workflow != workflow:
            differs = f"workflow {found.workflow!r}, not {workflow!r}"
        elif dry_run is not None and found_dry != dry_run:
            differs = f"workflow {workflow!r} as a {'dry' if found_dry else 'real'} run"
        else:
            differs = f"workflow {workflow!r} with other inputs"
        super().__init__(
            f"key {key!r} already names run {found.run_id} of {differs}; a key names one "
            "start (the same workflow with the same inputs), so this start needs another key"
        )


class OwnershipConflict(PerdureError):
    """Another worker serves the app with a posture this worker may not share it with."""

    code = "ownership_conflict"

    def __init__(
        self,
        app: str,
        worker: str,
        posture: str,
        holder: str,
        held_posture: str,
        expires_in: float,
    ) -> None:
        self.app = app
        self.worker = worker
        self.posture = posture
        self.holder = holder
        self.held_posture = held_posture
        self.expires_in = expires_in
        super().__init__(
            f"worker {worker} (ownership {posture}) cannot serve app {app}: worker {holder} "
            f"serves it with ownership {held_posture}, and its record holds for another "
            f"{max(0.0, expires_in):.1f}s; stop that worker, or wait for its record to "
            "expire if it is gone"
        )


class EffectUnsettled(PerdureError):
    """A once step started its effect and its outcome is unknown; resolve it first."""

    code = "effect_unsettled"

    def __init__(self, run_id: str, step: str, message: str) -> None:
        self.run_id = run_id
        self.step = step
        super().__init__(message)


class RunFailed(PerdureError):
    """The run ended without a result."""

    code = "run_failed"

    def __init__(self, run_id: str, state: str, error: dict[str, Any] | None) -> None:
        self.run_id = run_id
        self.state = state
        self.error = error or {}
        # The class code stays stable; the run's own error code is kept apart.
        self.error_code = str(self.error.get("code", state))
        msg = self.error.get("message", "")
        super().__init__(f"run {run_id} ended {state} ({self.error_code}): {msg}")


class ResultTimeout(PerdureError, TimeoutError):
    """The run did not end within the time given."""

    code = "result_timeout"


class _ReceiptError(PerdureError):
    def __init__(self, message: str, receipt: Any) -> None:
        self.receipt = receipt
        super().__init__(message)


class WaitSettled(_ReceiptError):
    """The wait was already settled; the stored receipt is attached."""

    code = "wait_settled"


class WaitExpired(_ReceiptError):
    """The wait's deadline has passed; it is now settled as timed out."""

    code = "wait_expired"


class WaitStillOpen(PerdureError):
    """The run still has a wait with no outcome."""

    code = "wait_still_open"


class NotResolvable(PerdureError):
    """The run is not stopped on this step."""

    code = "not_resolvable"


class NotCanceled(PerdureError):
    """The cancel took no effect: the run had already ended."""

    code = "not_canceled"


class DemoFailed(PerdureError):
    """The embedded example did not end as it should."""

    code = "demo_failed"


class Unauthorized(PerdureError):
    """A valid access token is needed: none was given, or it is unknown, revoked or expired."""

    code = "unauthorized"


class Forbidden(PerdureError):
    """The access token does not allow this: another app's run, or a call beyond its scope."""

    code = "forbidden"


class TokenNotFound(PerdureError):
    """No access token has this id."""

    code = "token_not_found"


class WaitTimedOut(PerdureError):
    """A wait or receive reached its deadline before it was settled."""

    code = "wait_timeout"


class StepFailed(PerdureError):
    """A step raised after its retries; replay raises the same error."""

    code = "step_failed"

    def __init__(self, step: str, error_type: str, message: str) -> None:
        self.step = step
        self.error_type = error_type
        self.error_message = message
        super().__init__(f"step {step} failed: {error_type}: {message}")


class StepTimedOut(PerdureError):
    """A step attempt ran past the step's ``timeout``.

    The retry policy applies to it as to any failure; for a ``once`` step the
    effect may have happened, so the run needs attention. The attempt's
    thread (a sync step) runs on until the function returns, and what it
    returns then is discarded.
    """

    code = "step_timed_out"


class EffectFailed(PerdureError):
    """The step's author states that its effect certainly did not happen."""

    code = "effect_failed"


class ChildFailed(PerdureError):
    """A child run failed or was canceled."""

    code = "child_failed"

    def __init__(self, run_id: str, state: str, error: dict[str, Any] | None) -> None:
        self.run_id = run_id
        self.state = state
        self.error = error or {}
        super().__init__(f"child run {run_id} ended {state}: {self.error.get('message', '')}")


class NonDeterminism(PerdureError):
    """The workflow's code no longer matches its journal."""

    code = "non_determinism"


class Interrupt(BaseException):
    """Control flow that unwinds workflow code; never caught by user code."""

    code: ClassVar[str] = "interrupt"


class Suspend(Interrupt):
    """The run parks until a deadline or an outcome."""

    code = "suspend"


class LeaseLost(Interrupt):
    """This worker no longer holds the run."""

    code = "lease_lost"

    def __init__(self, run_id: str, message: str = "") -> None:
        self.run_id = run_id
        super().__init__(message or f"lost the claim on run {run_id}")


class StaleClaim(LeaseLost):
    """Another claim owns the run now; stop without writing anything."""

    code = "stale_claim"


class Canceled(LeaseLost):
    """The run was canceled; stop at this step boundary."""

    code = "canceled"


class Suspended(LeaseLost):
    """The run was suspended; record this step's outcome, then let go of the run."""

    code = "suspended"


# -- talking to live runs ---------------------------------------------------------


class UpdateRejected(PerdureError):
    """The update's validator refused it; nothing was stored."""

    code = "update_rejected"

    def __init__(self, run_id: str, name: str, reason: str) -> None:
        self.run_id = run_id
        self.name = name
        self.reason = reason
        super().__init__(f"update {name!r} to run {run_id} was rejected: {reason}")


class UpdateAbandoned(PerdureError):
    """The run ended without answering the update."""

    code = "update_abandoned"

    def __init__(self, run_id: str, update_id: str, state: str | None = None) -> None:
        self.run_id = run_id
        self.update_id = update_id
        self.state = state
        ended = f" ({state})" if state else ""
        super().__init__(f"run {run_id} ended{ended} without answering update {update_id!r}")


class UpdateTimedOut(PerdureError, TimeoutError):
    """The run did not answer the update within the time given; it may still."""

    code = "update_timeout"


class RunEventMissing(PerdureError):
    """The run has not set this event (yet)."""

    code = "run_event_missing"


class UnknownQuery(PerdureError):
    """The run's workflow has no query of this name."""

    code = "unknown_query"


class QueryFailed(PerdureError):
    """The query function raised; the message says what it raised."""

    code = "query_failed"


# The public errors by name, taken from the classes above so that no second
# list is kept by hand: the docstring's drawing is the list to read, and a
# test keeps it and these classes the same.
__all__ = sorted(
    name
    for name, value in list(globals().items())
    if isinstance(value, type)
    and issubclass(value, PerdureError | Interrupt)
    and not name.startswith("_")
)
