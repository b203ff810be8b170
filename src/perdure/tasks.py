"""One claimed task of a plan run: its inputs, its attempts, its outcome.

A worker runs a task it claimed (:meth:`perdure.store.planport.PlanStore.claim_tasks`)
on one of its threads. Before each attempt of a ``once`` task the store
records that its effect starts, so that a worker lost after that point leaves
the task to an operator instead of running it twice. Failed attempts are
retried in place by the task's :class:`perdure.Retry`, the lease kept renewed
meanwhile; the final outcome is one fenced write that may end the run.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import threading
from collections.abc import Callable
from typing import Any, Literal

from perdure import codec, effects, errors, logs, payloads, plans, steps
from perdure.store import planport

log = logging.getLogger("perdure.worker")


def _error(exc: BaseException, attempts: int) -> dict[str, Any]:
    code = exc.code if isinstance(exc, errors.PerdureError) else "task_error"
    return {
        "code": code,
        "type": type(exc).__name__,
        "message": str(exc) or type(exc).__name__,
        "attempts": attempts,
    }


class TaskExecution:
    """A task claimed by this worker, run to its outcome on one of the worker's threads."""

    def __init__(
        self,
        store: planport.PlanStore,
        claim: planport.TaskClaim,
        plan: plans.Plan,
        payload_layer: payloads.Payloads,
        *,
        stopping: threading.Event,
        loop: Callable[[], asyncio.AbstractEventLoop | None],
    ) -> None:
        self.store = store
        self.claim = claim
        self.plan = plan
        self.payloads = payload_layer
        self.key = f"{claim.run_id}/{claim.task}"
        # Set by the lease's renewal when another claim took the task.
        self.lost: errors.LeaseLost | None = None
        # Whether a once attempt may have had its effect: then the task is not handed back.
        self.effect_started = False
        self._stopping = stopping
        self._loop = loop
        self.log = logs.RunLog(log, claim.run_id, claim.app, claim.workflow, claim.version)

    def renewed(self, claim: planport.TaskClaim) -> None:
        self.claim = claim

    def unsettled_effect(self) -> str | None:
        """The task's name, while a once attempt may have had its effect; else None."""
        return self.claim.task if self.effect_started else None

    def run(self) -> None:
        """Run the task's attempts and write its outcome (fenced)."""
        task = self.plan.task_def(self.claim.task)
        if task is None:  # the claim matched this plan's digest, so the shape has the task
            raise errors.CorruptState(
                self.claim.run_id, "task_unknown", f"task {self.claim.task!r} is not in the plan"
            )
        try:
            args, kwargs = self._arguments(task)
        except errors.PayloadUnreadable as exc:
            self._fail(task, exc, 0, "needs_attention")
            return
        except (errors.InvalidInput, ValueError, TypeError) as exc:
            self._fail(task, exc, self.claim.attempt, "failed")
            return
        attempt = self.claim.attempt
        while True:
            if task.effect == "once":
                self.store.begin_task_effect(self.claim, attempt)
                self.effect_started = True
            try:
                value = self._call(task, args, kwargs)
            except Exception as exc:
                self.effect_started = False
                if task.effect == "once" and not isinstance(exc, errors.EffectFailed):
                    # As for a once step: only EffectFailed says the effect did not
                    # happen; anything else leaves its outcome unknown.
                    self._fail(task, exc, attempt, "needs_attention", unknown=True)
                    return
                if not task.retry.should_retry(attempt, exc) or self._stopping.is_set():
                    self._fail(task, exc, attempt, "failed")
                    return
                detail = json.dumps(_error(exc, attempt))
                self.store.retry_task(self.claim, attempt + 1, detail)
                attempt += 1
                if self._stopping.wait(task.retry.delay(attempt - 1)):
                    # A stopping worker hands the task back rather than wait out a backoff.
                    self.store.release_task(self.claim)
                    return
                continue
            try:
                output = self.payloads.seal(value, f"task {task.name!r}'s output")
            except errors.InvalidInput as exc:
                self._fail(task, exc, attempt, "failed")
                return
            end = self.store.complete_task(self.claim, output)
            self.effect_started = False
            log.debug("task %s ended; run %s is %s", self.key, self.claim.run_id, end.run_state)
            return

    def _arguments(self, task: plans.TaskDef) -> tuple[list[Any], dict[str, Any]]:
        if task.parents:
            outputs = {n: self.payloads.open_text(t) for n, t in self.claim.parents.items()}
            return [], plans.parent_arguments(task, outputs)
        data = self.payloads.open_text(self.claim.input)
        if not isinstance(data, dict) or not isinstance(data.get("args"), list):
            raise errors.CorruptState(
                self.claim.run_id, "run_input_shape", "expected {args, kwargs}"
            )
        kwargs = data.get("kwargs") or {}
        return plans.root_arguments(task, list(data["args"]), dict(kwargs))

    def _call(self, task: plans.TaskDef, args: list[Any], kwargs: dict[str, Any]) -> Any:
        key = effects.idempotency_key(self.claim.run_id, task.name)
        with steps.keyed(key):
            if not task.is_async:
                if task.timeout is None:
                    return task.fn(*args, **kwargs)
                return self._within(task, args, kwargs)

            async def call() -> Any:
                with steps.keyed(key):
                    if task.timeout is None:
                        return await task.fn(*args, **kwargs)
                    try:
                        return await asyncio.wait_for(task.fn(*args, **kwargs), task.timeout)
                    except TimeoutError:
                        raise self._timed_out(task) from None

            loop = self._loop()
            if loop is None:
                return asyncio.run(call())
            return asyncio.run_coroutine_threadsafe(call(), loop).result()

    def _within(self, task: plans.TaskDef, args: list[Any], kwargs: dict[str, Any]) -> Any:
        """Run a sync attempt on a thread of its own and give up on it past the timeout.

        A thread cannot be stopped from outside: one that times out runs on
        until its function returns, and its result is dropped.
        """
        done = threading.Event()
        outcome: list[tuple[bool, Any]] = []
        context = contextvars.copy_context()  # the idempotency key goes along

        def attempt() -> None:
            try:
                outcome.append((True, context.run(task.fn, *args, **kwargs)))
            except BaseException as exc:  # handed to the task's thread below
                outcome.append((False, exc))
            finally:
                done.set()

        name = f"perdure-task-{task.name}"
        threading.Thread(target=attempt, name=name, daemon=True).start()
        if not done.wait(task.timeout):
            raise self._timed_out(task)
        ok, value = outcome[0]
        if not ok:
            raise value
        return value

    def _timed_out(self, task: plans.TaskDef) -> errors.StepTimedOut:
        return errors.StepTimedOut(
            f"task {task.name} of run {self.claim.run_id} ran past its timeout of {task.timeout:g}s"
        )

    def _fail(
        self,
        task: plans.TaskDef,
        exc: BaseException,
        attempts: int,
        outcome: Literal["failed", "needs_attention"],
        *,
        unknown: bool = False,
    ) -> None:
        error = _error(exc, attempts)
        if unknown:
            error["code"] = planport.EFFECT_OUTCOME_UNKNOWN
            error["message"] = (
                f"task {task.name!r} started its effect (attempt {attempts}) and then "
                f"{type(exc).__name__}: {exc}; its outcome is not recorded"
            )
        detail = codec.encode(error)
        self.effect_started = False
        end = self.store.fail_task(self.claim, detail, state=outcome)
        log.info(
            "task %s %s (%s); run %s is %s, blocked: %s",
            self.key,
            outcome,
            type(exc).__name__,
            self.claim.run_id,
            end.run_state,
            ", ".join(end.blocked) or "none",
        )
