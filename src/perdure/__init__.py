"""perdure: durable execution for plain Python, embedded on SQLite or shared on PostgreSQL."""

from perdure.app import App
from perdure.client import Client, RunHandle
from perdure.context import ChildHandle, Context, idempotency_key
from perdure.effects import Retry
from perdure.errors import (
    Canceled,
    ChildFailed,
    CorruptState,
    EffectFailed,
    InvalidInput,
    InvalidPayload,
    InvalidStoreURL,
    LeaseLost,
    LeaseTimingInvalid,
    NonDeterminism,
    NotResolvable,
    PerdureError,
    ResultTimeout,
    RunFailed,
    RunFinished,
    RunNotFound,
    SchemaTooNew,
    StaleClaim,
    StepFailed,
    StoreError,
    StoreUnavailable,
    WaitExpired,
    WaitSettled,
    WaitStillOpen,
    WaitTimedOut,
    WorkflowNotFound,
)
from perdure.records import Message, Provenance, Receipt, RunInfo, Wait
from perdure.registry import Workflow
from perdure.worker import Worker

__version__ = "0.1.0"

__all__ = [
    "App",
    "Canceled",
    "ChildFailed",
    "ChildHandle",
    "Client",
    "Context",
    "CorruptState",
    "EffectFailed",
    "InvalidInput",
    "InvalidPayload",
    "InvalidStoreURL",
    "LeaseLost",
    "LeaseTimingInvalid",
    "Message",
    "NonDeterminism",
    "NotResolvable",
    "PerdureError",
    "Provenance",
    "Receipt",
    "ResultTimeout",
    "Retry",
    "RunFailed",
    "RunFinished",
    "RunHandle",
    "RunInfo",
    "RunNotFound",
    "SchemaTooNew",
    "StaleClaim",
    "StepFailed",
    "StoreError",
    "StoreUnavailable",
    "Wait",
    "WaitExpired",
    "WaitSettled",
    "WaitStillOpen",
    "WaitTimedOut",
    "Worker",
    "Workflow",
    "WorkflowNotFound",
    "idempotency_key",
]
