"""One claimed run: the runtime its Context talks to, and the drive to its next resting point.

An :class:`Execution` validates what the claim read, runs the workflow code
from the top (replay returns recorded outcomes until the first unrecorded
position) and settles every way out: parked, ended, released or handed to an
operator. It does all of the run's store I/O, fenced by its claim; the
values workflow code records between two durable writes wait in its
:class:`WriteBuffer`.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

from perdure import (
    appplans,
    chains,
    codec,
    context,
    effects,
    endings,
    errors,
    journal,
    live,
    logs,
    payloads,
    plans,
    replay,
    steps,
    telemetry,
    validation,
    warm,
)
from perdure import registry as registry_api
from perdure.store import chainport, controlport, liveport, planport, port

log = logging.getLogger("perdure.worker")


class Host(Protocol):
    """What an execution needs from the worker that drives it."""

    registry: registry_api.Registry
    store: port.Store
    telemetry: telemetry.Telemetry

    @property
    def stopping(self) -> bool: ...

    def wait_stopping(self, timeout: float) -> bool:
        """Block up to ``timeout`` seconds or until the worker stops; return whether it does."""
        ...

    def invoke(
        self,
        wf: registry_api.WorkflowDef,
        ctx: context.Context,
        args: list[Any],
        kwargs: dict[str, Any],
    ) -> Any:
        """Call the workflow function with ``ctx`` bound."""
        ...


@runtime_checkable
class WarmHost(Host, Protocol):
    """A host that keeps parked runs warm (see :mod:`perdure.warm`)."""

    def warm_slot(self, execution: Execution) -> warm.WarmSlot | None:
        """A slot to keep the run warm in, reserved for it; None: park the ordinary way."""
        ...

    def warm_parked(self, execution: Execution, slot: warm.WarmSlot, wake: datetime | None) -> None:
        """The run is parked in the store: stop renewing it and free its place, keep the slot."""
        ...

    def warm_cooled(self, slot: warm.WarmSlot) -> port.Claimed | None:
        """Give the slot up; return a claim that was handed to it meanwhile, if any."""
        ...

    @property
    def warm_for(self) -> float:
        """How long a warm-parked run waits here to be taken up again, in seconds."""
        ...


class WriteBuffer:
    """Entries recorded since the last durable write, and the receipts to append with them."""

    def __init__(self) -> None:
        self._entries: list[journal.Entry] = []
        self._marks: list[journal.Mark] = []

    def add(self, entry: journal.Entry, mark: journal.Mark | None = None) -> None:
        """Keep ``entry`` (replacing one at its position) and ``mark`` for the next write."""
        self._entries = [e for e in self._entries if e.position != entry.position]
        self._entries.append(entry)
        if mark is not None:
            self._marks.append(mark)

    def take(self) -> tuple[list[journal.Entry], list[journal.Mark]]:
        """Hand the buffered entries and marks to a write, emptying the buffer."""
        entries, marks = self._entries, self._marks
        self._entries, self._marks = [], []
        return entries, marks

    def restore(self, entries: list[journal.Entry], marks: list[journal.Mark]) -> None:
        """Put back entries and marks whose write was refused, ahead of newer ones."""
        newer = self._entries
        self._entries = [e for e in entries if all(n.position != e.position for n in newer)]
        self._entries += newer
        self._marks[:0] = marks


def _error(code: str, message: str, **extra: Any) -> str:
    return codec.encode(steps.error_dict(code, message, **extra))


class Execution:
    """One claimed run being executed: implements the context's Runtime, owns the write buffer."""

    def __init__(self, host: Host, claimed: port.Claimed) -> None:
        self.host = host
        self.store = host.store
        self.claimed = claimed
        self.run_ = claimed.run
        self.lost: errors.LeaseLost | None = None
        self._claim = claimed.claim
        self._lock = threading.Lock()
        self._buffer = WriteBuffer()
        self._cursor: replay.JournalCursor | None = None
        self._outcomes = {o.name: o for o in claimed.outcomes}
        self.ctx: context.Context | None = None
        run = claimed.run
        self.log = logs.RunLog(log, run.run_id, run.app, run.workflow, run.version)
        self.telemetry = host.telemetry
        self.span: telemetry.Span = telemetry.NO_SPAN
        self.ended = "interrupted"  # how the run attempt ended, for its span
        self._deadline_asked = False
        # A park that hold() tried and the store refused: settled as the ordinary park's.
        self._park_error: BaseException | None = None

    # -- the claim, shared with the heartbeat -----------------------------------

    @property
    def claim(self) -> port.Claim:
        with self._lock:
            return self._claim

    def renewed(self, claim: port.Claim) -> None:
        with self._lock:
            self._claim = replace(claim, canceling=self._claim.canceling)

    def acknowledge_cancel(self) -> None:
        with self._lock:
            self._claim = replace(self._claim, canceling=True)

    # -- the Runtime --------------------------------------------------------------

    def check(self) -> None:
        lost = self.lost
        if lost is not None:
            if isinstance(lost, errors.Canceled):
                if self.claim.canceling:
                    self.lost = None
                    return
                self.acknowledge_cancel()
            raise lost
        if self.host.stopping:
            raise steps.Halt("release", {"code": "worker_stopping", "message": "worker stopping"})

    def pause(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            self.host.wait_stopping(min(left, 0.05))
            self.check()
        self.check()

    def _plan(self, workflow: Any) -> plans.Plan | None:
        """The app's plan ``workflow`` names, if it names one (a registry may have none)."""
        plan_of = getattr(self.host.registry, "plan_of", None)
        found = plan_of(workflow) if plan_of is not None else None
        return found if isinstance(found, plans.Plan) else None

    def workflow_ref(self, workflow: Any) -> tuple[str, str, Any]:
        plan = self._plan(workflow)
        if plan is not None:
            return plan.name, plan.version, None
        return self.host.registry.workflow_ref(workflow)

    def child_call(
        self, workflow: Any, key: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[str | None, dict[str, Any]]:
        plan = self._plan(workflow)
        if plan is not None:
            appplans.check_start(plan, args, kwargs)
            return (key if isinstance(key, str) else None), kwargs
        return registry_api.child_call(self.host.registry, workflow, key, args, kwargs)

    def successor(
        self, version: str | None, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> chains.Handover:
        chainport.require(self.store)  # a store without chains fails the run here, clearly
        run = self.run_
        target = run.version if version is None else version
        codec.check_text("a workflow version", target)
        wf = self.host.registry.workflow_def(run.workflow)
        # Another version's code may not be here: its worker checks it when it runs.
        if wf is not None and wf.version == target:
            registry_api.check_arguments(wf, args, kwargs)
        text = self.payloads.seal(
            {"args": list(args), "kwargs": kwargs}, "the successor's input", envelope=2
        )
        return chains.Handover(run.workflow, target, text)

    @property
    def payload_limit(self) -> int:
        return self.host.registry.payload_limit

    @property
    def payloads(self) -> payloads.Payloads:
        return self.host.registry.payloads

    def now(self) -> datetime:
        now: datetime = self._guarded(self.store.now)
        return now

    def buffer(self, entry: journal.Entry, mark: journal.Mark | None = None) -> None:
        self._buffer.add(entry, mark)

    def recorded(self, position: int) -> journal.Entry | None:
        return self._cursor.at(position) if self._cursor is not None else None

    def outcome(self, name: str) -> journal.Outcome | None:
        found = self._outcomes.get(name)
        if found is None:
            fresh = self._guarded(lambda: self.store.outcomes(self.run_.run_id))
            self._outcomes = {o.name: o for o in fresh}
            found = self._outcomes.get(name)
        if (
            found is not None
            and self.telemetry is not telemetry.NONE
            and found.outcome == "signaled"
            and not name.startswith("child:")
        ):
            latency = (self.now() - found.at).total_seconds()
            self.telemetry.signal_applied(self.run_.app, self.run_.workflow, max(0.0, latency))
        return found

    def settle_timeout(self, name: str) -> journal.Outcome:
        run_id = self.run_.run_id

        def settle() -> journal.Outcome:
            timeout = port.Outcome(run_id, name, "timed_out", None, None, None, self.now())
            return self.store.settle_wait(run_id, name, timeout)[0]

        outcome: journal.Outcome = self._guarded(settle)
        return outcome

    def next_message(self, channel: str, after_sequence: int) -> journal.Message | None:
        message: journal.Message | None = self._guarded(
            lambda: self.store.next_message(self.run_.run_id, channel, after_sequence)
        )
        return message

    def _plan_spec(self, workflow: str) -> planport.PlanSpec | None:
        plan = self._plan(workflow)
        return None if plan is None else appplans.plan_spec(plan)

    def _parent_close(self, workflow: str) -> str | None:
        found = self.host.registry.workflow_def(workflow)
        return "cancel" if found is not None and found.parent_close == "cancel" else None

    def create_children(self, children: list[context.NewChild]) -> list[str]:
        new = [
            port.NewRun(
                run_id=uuid.uuid4().hex,
                app=self.run_.app,
                workflow=child.workflow,
                version=child.version,
                input=telemetry.with_trace(child.input, self.span.trace_context()),
                key=child.key,
                parent_id=self.run_.run_id,
                parent_close=self._parent_close(child.workflow),
                plan=self._plan_spec(child.workflow),
            )
            for child in children
        ]
        created: list[port.Run] = self._guarded(lambda: self.store.create_children(self.claim, new))
        by_key = {run.key: run for run in created}
        for asked in new:
            found = by_key.get(asked.key)
            # A key names one start: a replayed call finds its own child, but a
            # caller's key that names another child is a conflict, not a match.
            if (
                found is not None
                and found.run_id != asked.run_id
                and not port.same_start(found, asked, self.payloads.open_text)
            ):
                raise errors.KeyConflict(str(asked.key), found, asked.workflow)
        return [by_key[run.key].run_id if run.key in by_key else run.run_id for run in new]

    # -- talking to the outside world (updates, events, streams) ------------------

    def next_update(self, name: str, after_sequence: int) -> live.UpdateReceived | None:
        store = liveport.require(self.store)
        found: liveport.UpdateRecord | None = self._guarded(
            lambda: store.next_update(self.run_.run_id, name, after_sequence)
        )
        if found is None:
            return None
        try:
            payload = codec.decode(found.payload)
        except errors.InvalidPayload as exc:
            raise errors.CorruptState(self.run_.run_id, "update_payload", str(exc)) from exc
        return live.UpdateReceived(found.update_id, payload, found.sequence)

    def answer_update(self, entry: journal.Entry, update_id: str, response: str) -> None:
        store = liveport.require(self.store)

        def answer(
            claim: port.Claim, entries: Sequence[journal.Entry], marks: Sequence[journal.Mark]
        ) -> None:
            store.answer_update(claim, entries, update_id, response, marks)

        self._write(answer, entry, [])

    def record_live(self, entry: journal.Entry) -> None:
        self._write(liveport.require(self.store).record_live, entry, [])

    def step_attempt(self, key: str, effect: str, attempt: int) -> telemetry.Span:
        span = telemetry.NO_SPAN
        if self.telemetry is not telemetry.NONE:
            run = self.run_
            observed = telemetry.StepAttempt(
                run.run_id, run.app, run.workflow, run.version, key, attempt, effect
            )
            span = self.telemetry.step_attempt(self.span, observed)
        return _StepWatch(self.log, key, attempt, span)

    def begin_effect(self, entry: journal.Entry, marks: list[journal.Mark]) -> None:
        self._write(self.store.begin_effect, entry, marks)

    def finish_step(self, entry: journal.Entry, marks: list[journal.Mark]) -> None:
        self._write(self.store.finish_step, entry, marks)

    def transaction_step(
        self, body: Callable[[Any], journal.Entry], marks: list[journal.Mark]
    ) -> journal.Entry:
        self._enforce_deadline()
        entries, buffered = self._buffer.take()
        try:
            recorded: journal.Entry = self._guarded(
                lambda: self.store.transaction_step(self.claim, entries, body, [*buffered, *marks])
            )
        except BaseException:
            self._buffer.restore(entries, buffered)
            raise
        self._written([*entries, recorded])
        return recorded

    # -- writing ------------------------------------------------------------------

    def _write(
        self,
        op: Callable[[port.Claim, Sequence[journal.Entry], Sequence[journal.Mark]], None],
        entry: journal.Entry,
        marks: list[journal.Mark],
    ) -> None:
        """Write buffered entries plus ``entry`` through a fenced store operation.

        When the run's cancel refuses the write, an outcome that already
        happened (``entry`` is not a ``started`` one) is still recorded before
        the workflow is told; an effect that was about to start is not.
        """
        self._enforce_deadline()
        self._buffer.add(entry)
        entries, buffered = self._buffer.take()
        try:
            try:
                self._guarded(lambda: op(self.claim, entries, [*buffered, *marks]))
            except errors.Suspended:
                if isinstance(self.lost, errors.Suspended):
                    raise  # already let go: nothing more is ours to write
                self._suspend_write(op, entry, entries, buffered, marks)
                return
        except errors.Canceled:
            if self.claim.canceling:
                raise
            self.acknowledge_cancel()
            if entry.status == "started" and not journal.retry_due(entry):
                # The effect was about to start: it did not, so nothing is recorded.
                kept = [e for e in entries if e.position != entry.position]
                self._buffer.restore(kept, buffered)
                raise
            self._guarded(lambda: op(self.claim, entries, [*buffered, *marks]))
            self._written(entries)
            raise
        self._written(entries)

    def _suspend_write(
        self,
        op: Callable[[port.Claim, Sequence[journal.Entry], Sequence[journal.Mark]], None],
        entry: journal.Entry,
        entries: list[journal.Entry],
        buffered: list[journal.Mark],
        marks: list[journal.Mark],
    ) -> None:
        """Record a write the run's suspend refused, then let go (raising Suspended).

        As for a cancel, an outcome that already happened is recorded and an
        effect that was about to start is not. If the suspend was withdrawn
        meanwhile, the write is completed and the run goes on.
        """
        starting = entry.status == "started" and not journal.retry_due(entry)
        kept = [e for e in entries if e.position != entry.position] if starting else entries
        if self._let_go(kept, [*buffered, *([] if starting else marks)]):
            raise errors.Suspended(self.run_.run_id)
        if starting:
            self._guarded(lambda: op(self.claim, [entry], marks))
            self._written([entry])

    def _let_go(self, entries: list[journal.Entry], marks: list[journal.Mark]) -> bool:
        """Record ``entries`` and hand the run back suspended; False if it was withdrawn."""
        store = controlport.require(self.store)
        suspended: bool = self._guarded(
            lambda: store.let_go(self.claim, entries, marks, reset=bool(entries))
        )
        self._written(entries)
        if suspended:
            self.lost = errors.Suspended(self.run_.run_id)
            self.ended = "suspended"
            self.log.info("suspended")
        return suspended

    def _settle_suspend(self) -> None:
        """Let go of a run whose suspend stopped it (unless that is done already)."""
        if isinstance(self.lost, errors.Suspended):
            return
        entries, marks = self._buffer.take()
        try:
            if not self._let_go(entries, marks):
                # Withdrawn after the workflow unwound: it runs again from its journal.
                self._release(failed=False, why="suspend withdrawn")
        except errors.Canceled:
            self.acknowledge_cancel()
            self._settle_cancel()

    def _enforce_deadline(self) -> None:
        """Have the run canceled before this write if it is past its deadline.

        The write that follows is then refused as canceled, and the run ends
        by the ordinary cancel path. Only runs with a deadline pay the clock read.
        """
        deadline = self.run_.deadline
        if deadline is None or self._deadline_asked or self.claim.canceling:
            return
        if self.now() >= deadline:
            self._deadline_asked = True
            store = controlport.require(self.store)
            self._guarded(lambda: store.expire_deadlines(run_id=self.run_.run_id))

    def hold(self, waits: list[journal.WaitSpec], wake_at: datetime | None) -> bool:
        # A run with a deadline parks the ordinary way: its deadline is enforced there.
        if self.run_.deadline is not None or self.lost is not None:
            return False
        host = self.host
        if not isinstance(host, WarmHost):
            return False
        slot = host.warm_slot(self)
        if slot is None:
            return False
        entries, marks = self._buffer.take()
        try:
            done = self.store.park(self.claim, entries, waits, wake_at=wake_at, marks=marks)
        except BaseException as exc:
            # The ordinary path settles what refused the park, as if it had tried.
            self._buffer.restore(entries, marks)
            host.warm_cooled(slot)
            self._park_error = exc
            return False
        self._written(entries)
        if not done:
            # A wait was met meanwhile: the run still holds its claim; look again.
            host.warm_cooled(slot)
            self._outcomes = {o.name: o for o in self._guarded(self._all_outcomes)}
            return True
        deadlines = [w.deadline for w in waits if w.deadline] + ([wake_at] if wake_at else [])
        wake = min(deadlines) if deadlines else None
        self.log.log(logging.DEBUG, "parked warm (%s)", ", ".join(w.name for w in waits) or wake)
        host.warm_parked(self, slot, wake)
        # This claim's span ends here, as an ordinary park's would.
        self.span.end("parked")
        self.span = telemetry.NO_SPAN
        claimed = slot.taken() if slot.wait(host.warm_for) else host.warm_cooled(slot)
        if claimed is None:
            self.ended = "parked"
            raise warm.Cooled(wake)
        self._resume(claimed)
        return True

    def _all_outcomes(self) -> list[port.Outcome]:
        return self.store.outcomes(self.run_.run_id)

    def matches(self, claimed: port.Claimed) -> bool:
        """Whether a claim of this run finds the journal exactly as this execution left it.

        What the claim read is checked as an ordinary execution checks it; a
        claim that fails the check is left to one, which sets the run aside.
        """
        if self._cursor is None or not warm.same_journal(self._cursor.entries(), claimed):
            return False
        run = claimed.run
        try:
            validation.run(run, max_failures=self.host.registry.max_failures)
            validation.outcomes(run.run_id, claimed.outcomes, claimed.journal, [])
        except errors.CorruptState:
            return False
        return True

    def _resume(self, claimed: port.Claimed) -> None:
        """Go on under a new claim of the run, from where its code waits."""
        self.claimed = claimed
        self.run_ = claimed.run
        with self._lock:
            self._claim = claimed.claim
        self._outcomes = {o.name: o for o in claimed.outcomes}
        run = claimed.run
        self.lost = (
            errors.Canceled(run.run_id)
            if run.cancel_requested
            else errors.Suspended(run.run_id)
            if run.suspend_requested
            else None
        )
        self.log.log(logging.DEBUG, "taken up warm (generation %d)", claimed.claim.generation)
        self._begin_span()

    def _written(self, entries: list[journal.Entry]) -> None:
        """Note entries the store now holds, so a later pass replays them."""
        if self._cursor is not None:
            for entry in entries:
                self._cursor.record(entry)

    def _guarded(self, fn: Callable[[], Any]) -> Any:
        """Call the store; a failure of the store (not a fence) releases the run."""
        try:
            return fn()
        except (errors.Interrupt, errors.CorruptState, errors.NonDeterminism):
            raise
        except errors.PerdureError as exc:
            if isinstance(exc, errors.StoreError):
                raise steps.Halt("fault", steps.error_dict(exc.code, str(exc))) from exc
            raise
        except Exception as exc:
            error = steps.error_dict("store_error", f"{type(exc).__name__}: {exc}")
            raise steps.Halt("fault", error) from exc

    # -- the drive ----------------------------------------------------------------

    @property
    def key(self) -> str:
        """What the worker files this execution under: its run id."""
        return self.claim.run_id

    def run(self) -> datetime | None:
        """Execute the run to its next resting point (parked, ended or released).

        Returns the earliest instant the run parked until, for the worker to
        look for it again then.
        """
        self.log.info(
            "claimed by %s (generation %d%s)",
            self.claim.worker,
            self.claim.generation,
            ", recovered" if self.claimed.recovered else "",
        )
        self._begin_span()
        try:
            return self._drive()
        except errors.StaleClaim:
            self.ended = "stale"
            raise
        finally:
            self.span.end(self.ended)

    def _begin_span(self) -> None:
        """Open the span of this claim of the run (one per claim, warm or not)."""
        run = self.run_
        self.span = self.telemetry.run_attempt(
            telemetry.RunAttempt(
                run.run_id,
                run.app,
                run.workflow,
                run.version,
                self.claim.generation,
                self.claimed.recovered,
                None if self.telemetry is telemetry.NONE else telemetry.trace_of(run.input),
            )
        )

    def _drive(self) -> datetime | None:
        run = self.run_
        try:
            validation.run(run, max_failures=self.host.registry.max_failures)
            validation.journal(run.run_id, self.claimed.journal)
            # Only the store can vouch for a child the journal lost to a crash.
            unjournaled = [
                child_id
                for child_id in validation.unjournaled_children(
                    self.claimed.outcomes, self.claimed.journal
                )
                if (child := self.store.get_run(child_id)) is not None
                and child.parent_id == run.run_id
            ]
            validation.outcomes(
                run.run_id, self.claimed.outcomes, self.claimed.journal, unjournaled
            )
        except errors.CorruptState as exc:
            self.log.error("%s", exc)
            self._finish(
                "needs_attention", error=_error(exc.code, str(exc), invariant=exc.invariant)
            )
            return None
        if run.cancel_requested:
            self.acknowledge_cancel()
            self._settle_cancel()
            return None
        if run.suspend_requested:
            # Asked while its last owner held it (a lapsed lease, a resolve).
            self._settle_suspend()
            return None
        if run.failures >= self.host.registry.max_failures:
            self._finish(
                "needs_attention",
                error=_error(
                    "poison_run", f"{run.failures} consecutive attempts failed; not retrying"
                ),
            )
            return None
        wf = self.host.registry.workflow_def(run.workflow)
        if wf is None or wf.version != run.version:
            self._finish(
                "needs_attention",
                error=_error(
                    "workflow_not_found", f"this worker has no {run.workflow} version {run.version}"
                ),
            )
            return None
        try:
            self._cursor = replay.JournalCursor(run.run_id, self.claimed.journal)
            self.ctx = context.Context(
                run_id=run.run_id,
                workflow=run.workflow,
                runtime=self,
                cursor=self._cursor,
                asynchronous=wf.is_async,
                dry_run=run.dry_run,
            )
            args, kwargs = self._inputs(wf)
        except errors.CorruptState as exc:
            self._finish(
                "needs_attention", error=_error(exc.code, str(exc), invariant=exc.invariant)
            )
            return None
        except errors.PayloadUnreadable as exc:
            # Sealed by a codec (or a key) this worker lacks: fixable, not failed.
            self._finish("needs_attention", error=_error(exc.code, f"the run's input: {exc}"))
            return None
        except errors.InvalidPayload as exc:
            # Well-formed input that this version's type hints do not accept.
            self._finish("failed", error=_error(exc.code, f"the run's input: {exc}"))
            return None
        return self._loop(wf, self.ctx, args, kwargs)

    def _inputs(self, wf: registry_api.WorkflowDef) -> tuple[list[Any], dict[str, Any]]:
        try:
            data = self.payloads.open_text(self.run_.input)
        except errors.PayloadUnreadable:
            raise
        except errors.InvalidPayload as exc:
            raise errors.CorruptState(self.run_.run_id, "run_input_json", str(exc)) from exc
        if not isinstance(data, dict) or not isinstance(data.get("args"), list):
            raise errors.CorruptState(
                self.run_.run_id, "run_input_shape", "expected {args, kwargs}"
            )
        names = list(wf.params)
        args = [
            codec.convert(v, wf.params[names[i]]) if i < len(names) else v
            for i, v in enumerate(data["args"])
        ]
        kwargs = {k: codec.convert(v, wf.params.get(k)) for k, v in data.get("kwargs", {}).items()}
        return args, kwargs

    def _loop(
        self,
        wf: registry_api.WorkflowDef,
        ctx: context.Context,
        args: list[Any],
        kwargs: dict[str, Any],
    ) -> datetime | None:
        while True:
            try:
                result = self.host.invoke(wf, ctx, args, kwargs)
            except warm.Cooled as cooled:
                # Parked by hold() and not taken up again here: nothing to write.
                return cooled.wake_at
            except context.Parked as parked:
                try:
                    self._enforce_deadline()
                except BaseException as exc:
                    self._settle(exc)
                    return None
                entries, marks = self._buffer.take()
                try:
                    if self._park_error is not None:
                        refused, self._park_error = self._park_error, None
                        raise refused
                    done = self.store.park(
                        self.claim, entries, parked.waits, wake_at=parked.wake_at, marks=marks
                    )
                except errors.Suspended:
                    try:
                        if self._let_go(entries, marks):
                            return None
                    except errors.Canceled:
                        self.acknowledge_cancel()
                        self._settle_cancel()
                        return None
                    # The suspend was withdrawn: the entries are recorded; park again.
                    ctx.restart()
                    continue
                except errors.Canceled:
                    self._buffer.restore(entries, marks)
                    self.acknowledge_cancel()
                    self._settle_cancel()
                    return None
                except errors.LeaseLost:
                    raise
                except Exception as exc:
                    # The park did not happen: give the run back (with backoff)
                    # rather than leave it running until its lease lapses.
                    self._release(failed=True, why=f"could not park: {exc}")
                    return None
                self._written(entries)
                if done:
                    self.ended = "parked"
                    self.log.info(
                        "parked (%s)",
                        ", ".join(w.name for w in parked.waits) or f"until {parked.wake_at}",
                    )
                    deadlines = [w.deadline for w in parked.waits if w.deadline] + (
                        [parked.wake_at] if parked.wake_at else []
                    )
                    return min(deadlines) if deadlines else None
                self._outcomes = {o.name: o for o in self.store.outcomes(self.run_.run_id)}
                ctx.restart()
                continue
            except BaseException as exc:  # every exit is settled below
                self._settle(exc)
                return None
            try:
                text = self.payloads.seal(result, "the workflow's result")
            except errors.InvalidPayload as exc:
                self._finish("failed", error=_error(exc.code, str(exc)))
                return None
            self._finish("succeeded", result=text)
            return None

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
            self._finish("needs_attention", error=_error(exc.code, str(exc)))
        elif isinstance(exc, errors.StepFailed):
            self._finish("failed", error=_error(exc.code, str(exc), step=exc.step))
        elif isinstance(exc, errors.WaitTimedOut | errors.ChildFailed | errors.InvalidPayload):
            self._finish("failed", error=_error(exc.code, str(exc)))
        elif isinstance(exc, Exception):
            self._finish(
                "failed",
                error=_error(
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
                error=_error(
                    "effect_outcome_unknown",
                    f"the run was canceled while the effect of step {unsettled} was unsettled",
                    step=unsettled,
                ),
            )
        else:
            # As when the store cancels a queued or waiting run: no error,
            # unless the run passed its deadline.
            self._finish("canceled", error=self._deadline_error())

    def _deadline_error(self) -> str | None:
        """Return the error of a run canceled past its deadline, or None."""
        deadline = self.run_.deadline
        if deadline is None:
            return None
        try:
            passed = self.store.now() >= deadline
        except Exception:
            passed = False
        if not passed:
            return None
        return _error(
            controlport.DEADLINE_EXCEEDED,
            f"the run did not end by its deadline {deadline.isoformat()}",
        )

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
        endings.of(self.store).ended(self.claim.run_id)
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
                error=_error("poison_run", f"{failures} consecutive attempts failed; last: {why}"),
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


class _StepWatch:
    """One step attempt's observer: its telemetry span, and a log line when it fails."""

    __slots__ = ("_attempt", "_done", "_log", "_span", "_step")

    def __init__(self, run_log: logs.RunLog, step: str, attempt: int, span: telemetry.Span) -> None:
        self._log = run_log
        self._step = step
        self._attempt = attempt
        self._span = span
        self._done = False

    def end(self, outcome: str, error: BaseException | None = None) -> None:
        if self._done:
            return
        self._done = True
        if error is not None:
            level = logging.ERROR if outcome == "ambiguous" else logging.WARNING
            self._log.log(
                level,
                "%s (%s: %s)",
                {"retrying": "failed; retrying", "failed": "failed for good"}.get(outcome, outcome),
                type(error).__name__,
                error,
                step=self._step,
                attempt=self._attempt,
            )
        self._span.end(outcome, error)

    def trace_context(self) -> telemetry.Carrier | None:
        return self._span.trace_context()
