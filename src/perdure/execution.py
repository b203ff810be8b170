"""One claimed run: the runtime its Context talks to, and the drive to its next resting point.

An :class:`Execution` validates what the claim read, runs the workflow code
from the top (replay returns recorded outcomes until the first unrecorded
position) and settles every way out: parked, ended, released or handed to an
operator. It does all of the run's store I/O, fenced by its claim; the
values workflow code records between two durable writes wait in its
:class:`~perdure.writebuffer.WriteBuffer`.

Its parts are base classes of it, each in a module of its own: the child runs
it starts (:mod:`perdure.childruns`), warm parking (:mod:`perdure.warmrun`),
suspend and run deadlines (:mod:`perdure.runcontrol`) and the ends of its
claim (:mod:`perdure.settlement`). What it needs from the worker that drives
it is :class:`~perdure.host.Host`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from perdure import (
    chains,
    childruns,
    codec,
    context,
    errors,
    journal,
    live,
    logs,
    payloads,
    replay,
    runcontrol,
    settlement,
    steps,
    telemetry,
    validation,
    warm,
    warmrun,
    writebuffer,
)
from perdure import host as host_api
from perdure import registry as registry_api
from perdure.store import chainport, liveport, port, warmport

log = logging.getLogger("perdure.worker")


class Execution(
    childruns.ChildRuns, warmrun.WarmExecution, runcontrol.RunControl, settlement.Settlement
):
    """One claimed run being executed: implements the context's Runtime, owns the write buffer."""

    def __init__(self, host: host_api.Host, claimed: port.Claimed) -> None:
        self.host = host
        self.store = host.store
        self.claimed = claimed
        self.run_ = claimed.run
        self.lost: errors.LeaseLost | None = None
        self._claim = claimed.claim
        self._lock = threading.Lock()
        self._buffer = writebuffer.WriteBuffer()
        self._cursor: replay.JournalCursor | None = None
        self._outcomes = {o.name: o for o in claimed.outcomes}
        # Updates the claim read ahead, by the (name, after) next_update asks with.
        self._ahead = dict(claimed.updates)
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
            # A warm run may have gone on under a newer claim meanwhile.
            if claim.generation == self._claim.generation:
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

    # -- talking to the outside world (updates, events, streams) ------------------

    def next_update(self, name: str, after_sequence: int) -> live.UpdateReceived | None:
        store = liveport.require(self.store)
        # Read ahead by this claim: what the store would return now, as the
        # first update after a sequence never changes once it exists.
        found: liveport.UpdateRecord | None = self._ahead.get((name, after_sequence))
        if found is None:
            found = self._guarded(lambda: store.next_update(self.run_.run_id, name, after_sequence))
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

        # Taken up before its claim is back: the answer may go ahead of it.
        if (
            self._pending is not None
            and isinstance(store, warmport.AnswersAhead)
            and self._answered_ahead(store, entry, update_id, response)
        ):
            return
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

    def _written(self, entries: list[journal.Entry]) -> None:
        """Note entries the store now holds, so a later pass replays them."""
        if self._cursor is not None:
            for entry in entries:
                self._cursor.record(entry)

    def _guarded(self, fn: Callable[[], Any]) -> Any:
        """Call the store; a failure of the store (not a fence) releases the run."""
        self._taken_up()
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
                "needs_attention",
                error=settlement.error_text(exc.code, str(exc), invariant=exc.invariant),
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
                error=settlement.error_text(
                    "poison_run", f"{run.failures} consecutive attempts failed; not retrying"
                ),
            )
            return None
        wf = self.host.registry.workflow_def(run.workflow)
        if wf is None or wf.version != run.version:
            self._finish(
                "needs_attention",
                error=settlement.error_text(
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
                "needs_attention",
                error=settlement.error_text(exc.code, str(exc), invariant=exc.invariant),
            )
            return None
        except errors.PayloadUnreadable as exc:
            # Sealed by a codec (or a key) this worker lacks: fixable, not failed.
            self._finish(
                "needs_attention", error=settlement.error_text(exc.code, f"the run's input: {exc}")
            )
            return None
        except errors.InvalidPayload as exc:
            # Well-formed input that this version's type hints do not accept.
            self._finish("failed", error=settlement.error_text(exc.code, f"the run's input: {exc}"))
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
                self._taken_up()
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
                self._taken_up()
                self._settle(exc)
                return None
            self._taken_up()
            try:
                text = self.payloads.seal(result, "the workflow's result")
            except errors.InvalidPayload as exc:
                self._finish("failed", error=settlement.error_text(exc.code, str(exc)))
                return None
            self._finish("succeeded", result=text)
            return None


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
