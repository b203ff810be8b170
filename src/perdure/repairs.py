"""Repairs of runs from outside: settling a stopped step (resolve), starting again (fork).

:class:`Repairs` is part of :class:`perdure.client.Client`. ``resolve``
records the outcome of the ambiguous step a ``needs_attention`` run stopped
on; ``fork`` starts a new run that replays a run's journal up to a point and
executes from there, the way to retry after a fix. Neither needs the
workflows' code; a plan run's are its tasks' (:class:`~perdure.planclient.PlanCalls`).
"""

from __future__ import annotations

import getpass
import socket
import uuid
from collections.abc import Callable
from typing import Any

from perdure import codec, errors, handles, journal, payloads, records, telemetry, validation
from perdure.store import port

_MISSING: Any = object()


def _child_id(entry: port.JournalEntry) -> str | None:
    """Return the run id a ``child`` entry recorded, or None if its body is unreadable."""
    try:
        return journal.ChildStarted.decode(entry.output).run_id
    except journal.Unreadable:
        return None


class Repairs:
    """Resolve and fork of an app's runs (a part of the Client)."""

    store: port.Store
    app: str
    payloads: payloads.Payloads
    telemetry: telemetry.Telemetry
    # The Client supplies them: the app's run (or RunNotFound), and what a client sees of it.
    _run: Callable[[str], port.Run]
    get: Callable[[str], records.RunInfo]
    handle: Callable[[str], handles.RunHandle[Any]]
    # A plan run's repairs are its tasks' (PlanCalls, also part of the Client).
    _resolve_task: Callable[[port.Run, str, Any, str | None], records.RunInfo]
    _fork_plan: Callable[[port.Run, str | None], str]

    def resolve(
        self,
        run_id: str,
        step: str,
        *,
        output: Any = _MISSING,
        error: str | None = None,
        note: str | None = None,
    ) -> records.RunInfo:
        """Settle the ambiguous step of a ``needs_attention`` run.

        With ``output`` the step is recorded as succeeded and the run re-queued;
        with ``error`` the step and the run fail.

        Raises:
            errors.NotResolvable: the run is not stopped on this step.
        """
        if (output is _MISSING) == (error is None):
            raise errors.InvalidInput("resolve takes exactly one of output= or error=")
        run = self._run(run_id)
        if run.plan_digest is not None:
            return self._resolve_task(run, step, output, error)
        info = handles.run_info(run)
        if run.state != "needs_attention":
            raise errors.NotResolvable(f"run {run_id} is {run.state}, not needs_attention")
        at_fault = (info.error or {}).get("step")
        if at_fault != step:
            raise errors.NotResolvable(
                f"run {run_id} is not stopped on step {step!r}"
                + (
                    f" (it is stopped on {at_fault!r})"
                    if at_fault
                    else f" ({(info.error or {}).get('code')}: nothing to resolve)"
                )
            )
        entry = next(
            (
                e
                for e in self.store.journal(run_id)
                if e.kind == "step" and e.name == step and e.status == "started"
            ),
            None,
        )
        if entry is None:
            raise errors.NotResolvable(f"step {step!r} of run {run_id} has no unsettled effect")
        try:
            earlier = journal.failed_attempts(entry)
        except ValueError as exc:
            raise errors.CorruptState(
                run_id, "journal_attempts_shape", f"position {entry.position}: {exc}"
            ) from exc
        who = f"{getpass.getuser()}@{socket.gethostname()}"
        why = f"resolved by {who}" + (f": {note}" if note else "")
        if error is None:
            final = port.JournalEntry(
                entry.position,
                "step",
                step,
                "ok",
                self.payloads.seal(output, "the resolved output"),
                journal.Attempts(earlier).encode(),
                attempt=entry.attempt,
            )
            self.store.resolve(
                run_id, run.generation, final, state="queued", error=None, note=why + " (succeeded)"
            )
        else:
            final = port.JournalEntry(
                entry.position,
                "step",
                step,
                "error",
                error=journal.StepError("Resolved", error, attempts=earlier).encode(),
                attempt=entry.attempt,
            )
            run_error = codec.encode({"code": "resolved_failed", "message": error, "step": step})
            self.store.resolve(
                run_id,
                run.generation,
                final,
                state="failed",
                error=run_error,
                note=why + " (failed)",
            )
        return self.get(run_id)

    def fork(
        self, run_id: str, from_step: str | None = None, *, live: bool = False
    ) -> handles.RunHandle[Any]:
        """Start a new run of the same workflow and inputs that reuses the journal.

        The new run replays the old journal up to ``from_step`` (the step's
        key, e.g. ``charge`` or ``charge#2``), or, by default, up to the first
        entry that did not succeed, and executes from there: the way to retry
        a failed run after a fix.

        A fork never runs a ``once`` effect again unless the caller names the
        step to run again from: a run that is still live (queued, running or
        waiting) is forked only from an explicit ``from_step`` before the step
        it is executing, with ``live=True``; a run stopped on an ambiguous
        ``once`` step is forked by default only once that step is resolved.

        Raises:
            errors.InvalidInput: the run's journal has no such step.
            errors.RunNotFinished: the run is live, and ``from_step`` or
                ``live=True`` is missing or the fork point is not before its
                in-flight step.
            errors.EffectUnsettled: the fork would run, or copy, a ``once``
                step whose effect started and whose outcome is unknown.
        """
        run = self._run(run_id)
        if run.plan_digest is not None:
            return self.handle(self._fork_plan(run, from_step))
        recorded = self.store.journal(run_id)
        validation.journal(run_id, recorded)
        # A resolve between the two reads makes the run live again: judge by both.
        state = next(
            (r.state for r in (run, self._run(run_id)) if r.state not in port.TERMINAL_STATES),
            run.state,
        )
        live_now = state not in port.TERMINAL_STATES
        if live_now and (from_step is None or not live):
            raise errors.RunNotFinished(
                run_id,
                state,
                f"run {run_id} is still {state}, so a fork could repeat a step the run is "
                "running or about to run; wait until it ends, or fork from an earlier step "
                "explicitly "
                "(from_step=... with live=True; perdure fork --from-step STEP --live)",
            )
        if from_step is None:
            cut = next((i for i, e in enumerate(recorded) if e.status != "ok"), len(recorded))
            if cut < len(recorded) and journal.unsettled(recorded[cut]):
                step = recorded[cut].name
                raise errors.EffectUnsettled(
                    run_id,
                    step,
                    f"step {step} of run {run_id} started its effect and its outcome is "
                    "unknown, so a fork would run it again; resolve the step first "
                    f"(perdure resolve {run_id} {step} --output JSON or --error MSG), or fork "
                    "from that step or an earlier one explicitly if running it again is right",
                )
        else:
            found = [i for i, e in enumerate(recorded) if e.kind == "step" and e.name == from_step]
            if not found:
                raise errors.InvalidInput(f"run {run_id} has no step {from_step!r} in its journal")
            cut = found[0]
            # The first entry that is not settled: a live run's is the step in
            # flight, which the fork must not run or copy.
            held = next(
                (
                    (i, e)
                    for i, e in enumerate(recorded)
                    if e.kind == "step"
                    and e.status == "started"
                    and (live_now or journal.unsettled(e))
                ),
                None,
            )
            if live_now and held is not None and held[0] <= cut:
                raise errors.RunNotFinished(
                    run_id,
                    state,
                    f"run {run_id} is {state} with step {held[1].name} in flight; fork from "
                    "a step before it",
                )
            if held is not None and held[0] < cut:
                step = held[1].name
                raise errors.EffectUnsettled(
                    run_id,
                    step,
                    f"step {step} of run {run_id} started its effect and its outcome is "
                    f"unknown; fork from {step} or an earlier step, or resolve it first "
                    f"(perdure resolve {run_id} {step} --output JSON or --error MSG)",
                )
        # A child whose result is not copied would report to the old parent, so
        # the fork starts its own child from that position.
        results = {e.name for e in recorded[:cut] if e.kind == "child_result"}
        for i, entry in enumerate(recorded[:cut]):
            if entry.kind == "child" and _child_id(entry) not in results:
                cut = i
                break
        new = port.NewRun(
            run_id=uuid.uuid4().hex,
            app=self.app,
            workflow=run.workflow,
            version=run.version,
            input=telemetry.with_trace(run.input, self.telemetry.trace_context()),
        )
        self.store.create_run(new, recorded[:cut])
        return self.handle(new.run_id)
