"""The plans section's transitions written once, over named queries, for every SQL adapter.

:class:`PlanTransitions` adds the operations of :mod:`perdure.store.planport`
to :class:`perdure.store.transitions.Transitions`. Every task transition locks
its run's row first and then writes the task, so two tasks of one run ending
at once see each other, and the last one ends the run in its own transaction.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Literal, TypeVar, cast

from perdure import errors
from perdure.store import claiming, ledger, planport, port, rows, transitions

C = TypeVar("C")
Row = rows.Row

_RECOVERABLE = "needs_attention"


def read_task(reader: rows.Reader, row: Row) -> planport.Task:
    """Return the :class:`planport.Task` of a ``tasks`` row, refusing a broken one."""
    c = reader.columns("task", row)
    run_id = c.text("run_id")
    state = cast(planport.TaskState, c.choice("state", planport.TASK_STATES))
    raw = row["parents"]
    try:
        parents = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        parents = None
    if not isinstance(parents, list) or not all(isinstance(p, str) for p in parents):
        raise rows.corrupt(run_id, "task_parents", f"parents {str(raw)[:60]!r}")
    worker = c.opt_text("worker")
    lease = c.opt_instant("lease_expires_at")
    generation = c.count("generation")
    if state == "running" and (worker is None or lease is None or generation < 1):
        raise rows.corrupt(run_id, "task_claim", f"task {row['name']!r} is running unclaimed")
    return planport.Task(
        run_id=run_id,
        name=c.text("name"),
        position=c.count("position"),
        parents=tuple(parents),
        effect=c.choice("effect", ("pure", "idempotent", "once")),
        state=state,
        generation=generation,
        attempt=c.count("attempt"),
        recoveries=c.count("recoveries"),
        max_recoveries=c.count("max_recoveries"),
        worker=worker,
        lease_expires_at=lease,
        ready_at=c.opt_instant("ready_at"),
        effect_started=c.flag("effect_started"),
        output=c.opt_text("output"),
        error=c.opt_text("error"),
        blocked_by=c.opt_text("blocked_by"),
        created_at=c.instant("created_at"),
        updated_at=c.instant("updated_at"),
        started_at=c.opt_instant("started_at"),
        ended_at=c.opt_instant("ended_at"),
    )


def check_tasks(run: port.Run, tasks: Sequence[planport.Task]) -> None:
    """Refuse task rows that break the plan's invariants (read before they are trusted).

    Raises:
        errors.CorruptState: a task of a run that is no plan run, a parent the
            run does not have, a task that ran while a parent had not
            succeeded, or a running task in a run that ended.
    """
    if tasks and run.plan_digest is None:
        raise rows.corrupt(run.run_id, "task_run", "tasks stored for a workflow run")
    states = {t.name: t.state for t in tasks}
    for task in tasks:
        for parent in task.parents:
            if parent not in states:
                raise rows.corrupt(
                    run.run_id, "task_unknown_parent", f"task {task.name!r} names {parent!r}"
                )
        ran = task.state in ("running", "succeeded")
        if ran and any(states[p] != "succeeded" for p in task.parents):
            raise rows.corrupt(
                run.run_id,
                "task_parents",
                f"task {task.name!r} is {task.state} while a parent has not succeeded",
            )
        if task.state == "running" and run.state in port.TERMINAL_STATES:
            raise rows.corrupt(
                run.run_id, "task_run", f"task {task.name!r} runs in a {run.state} run"
            )


def _noted(generation: int, note: str | None) -> str:
    return f"task generation {generation}" + (f", {note}" if note else "")


def _error(code: str, message: str, **extra: Any) -> str:
    return json.dumps({"code": code, "message": message, **extra})


class PlanTransitions(claiming.ClaimTransitions[C]):
    """The task operations shared by the SQL adapters; ``C`` is the adapter's cursor."""

    # -- hooks of the run transitions ---------------------------------------------

    def _admit_plan(self, cur: C, run_id: str, plan: planport.PlanSpec) -> None:
        """Store a just-created run's tasks and make it a running plan run."""
        self._exec(cur, "plan_admit", run_id=run_id, digest=plan.digest, policy=plan.policy)
        for task in plan.tasks:
            self._exec(
                cur,
                "task_insert",
                run_id=run_id,
                name=task.name,
                position=task.position,
                parents=json.dumps(list(task.parents)),
                effect=task.effect,
                output=task.output,
                max_recoveries=plan.max_recoveries,
            )
        self._settle(cur, run_id)

    def _cancel_plans(self, cur: C, rows_: Sequence[Row]) -> list[Row]:
        """Cancel the pending tasks of plan runs just asked to cancel; end those with none running.

        Returns the rows of the runs this ended, for the end-of-run rules.
        """
        ended: list[Row] = []
        for row in rows_:
            if self._exec(cur, "run_by_id", run_id=row["run_id"]).fetchone()["plan_digest"]:
                self._exec(cur, "task_cancel_pending", run_id=row["run_id"])
                ended += self._settle(cur, row["run_id"], end_rules=False)
        return ended

    # -- reads ------------------------------------------------------------------------

    def tasks(self, run_id: str) -> list[planport.Task]:
        """Return the run's tasks in declaration order, checked against each other."""

        def work(cur: C) -> tuple[Row | None, list[Row]]:
            run = self._exec(cur, "run_by_id", run_id=run_id).fetchone()
            return run, list(self._exec(cur, "tasks_of_run", run_id=run_id).fetchall())

        found, task_rows = self._transact(work)
        if found is None:
            return []
        tasks = [read_task(self.read, r) for r in task_rows]
        check_tasks(self.read.run(found), tasks)
        return tasks

    # -- claims ---------------------------------------------------------------------

    def claim_tasks(
        self,
        app: str,
        worker: str,
        plans: Sequence[tuple[str, str, str]],
        *,
        lease_ttl: float,
        limit: int = 1,
        recover_until: datetime | None = None,
    ) -> list[planport.TaskClaim]:
        """Claim runnable tasks; settle lapsed ones that may not run again (see the port)."""
        if not port.WORKER_ID.match(worker):
            raise errors.InvalidInput(f"worker id {worker[:40]!r} is not 1-128 printable ASCII")
        ttl = transitions.seconds(lease_ttl, "lease_ttl", positive=True)
        digests = {(name, version): digest for name, version, digest in plans}
        wanted = json.dumps([[name, version] for name, version in digests])
        params = {"app": app, "recover_until": recover_until}

        def work(cur: C) -> list[planport.TaskClaim]:
            # A run whose rows cannot be trusted is set aside (needs_attention),
            # as a claim of runs does, so that it stops starving the others.
            aside: set[str] = set()
            for lapsed in self._exec(cur, "task_lapsed_canceling", **params).fetchall():
                try:
                    self._settle_lapsed_cancel(cur, lapsed["run_id"], lapsed["name"])
                except errors.CorruptState as exc:
                    self._set_aside(cur, lapsed["run_id"], exc, aside)
            found = self._exec(cur, "task_candidates", plans=wanted, limit=limit, **params)
            claims: list[planport.TaskClaim] = []
            checked: set[str] = set()
            for cand in found.fetchall():
                run_id, name = cand["run_id"], cand["name"]
                if run_id in aside:
                    continue
                # Every task row of the run is read and checked before any is
                # trusted, once per claim (as a run's claim reads its journal).
                if run_id not in checked:
                    try:
                        self._checked_tasks(cur, self._locked(cur, run_id))
                    except errors.CorruptState as exc:
                        self._set_aside(cur, run_id, exc, aside)
                        continue
                    checked.add(run_id)
                if cand["plan_digest"] != digests.get((cand["workflow"], cand["version"])):
                    self._mismatch(cur, run_id, cand["workflow"], cand["version"])
                    continue
                claim = self._claim_task(cur, run_id, name, worker, ttl)
                if claim is not None:
                    claims.append(claim)
            return claims

        return self._transact(work)

    def _set_aside(self, cur: C, run_id: str, exc: errors.CorruptState, aside: set[str]) -> None:
        """Nothing of the run was written in this transaction yet: only its state changes."""
        if run_id not in aside:
            aside.add(run_id)
            self._quarantine(cur, run_id, exc)

    def _locked(self, cur: C, run_id: str) -> port.Run:
        row = self._exec(cur, "lock_run", run_id=run_id).fetchone()
        if row is None:
            raise errors.RunNotFound(run_id)
        return self.read.run(row)

    def _checked_tasks(self, cur: C, run: port.Run) -> list[planport.Task]:
        tasks = [
            read_task(self.read, r) for r in self._exec(cur, "tasks_of_run", run_id=run.run_id)
        ]
        check_tasks(run, tasks)
        return tasks

    def _task_row(self, cur: C, run_id: str, name: str) -> planport.Task | None:
        row = self._exec(cur, "task_row", run_id=run_id, name=name).fetchone()
        return None if row is None else read_task(self.read, row)

    def _claim_task(
        self, cur: C, run_id: str, name: str, worker: str, ttl: float
    ) -> planport.TaskClaim | None:
        run = self._locked(cur, run_id)
        if run.state != "running" or run.cancel_requested:
            return None
        before = self._task_row(cur, run_id, name)
        if before is None:
            return None
        lapsed = before.state == "running"
        if lapsed and before.effect == "once" and before.effect_started:
            message = (
                f"task {name!r} is once and its worker was lost after its effect started: "
                "its outcome is unknown, so it is not run again"
            )
            self._end_lapsed(cur, before, planport.EFFECT_OUTCOME_UNKNOWN, message)
            return None
        if lapsed and before.recoveries >= before.max_recoveries:
            message = (
                f"task {name!r} lost its worker {before.recoveries + 1} times "
                f"(max_recoveries={before.max_recoveries}); it is not run again"
            )
            self._end_lapsed(cur, before, planport.POISON_TASK, message)
            return None
        row = self._exec(
            cur, "task_claim", run_id=run_id, name=name, worker=worker, lease_ttl=ttl
        ).fetchone()
        if row is None:  # another claim took it, or a parent is no longer succeeded
            return None
        task = read_task(self.read, row)
        marks = [port.Mark("task_recovered", step=name)] if lapsed else []
        marks.append(port.Mark("task_claimed", step=name, note=f"attempt {task.attempt}"))
        self._task_receipts(cur, run_id, task.generation, worker, marks)
        outputs = {
            r["name"]: r["output"]
            for r in self._exec(cur, "task_parent_outputs", run_id=run_id, name=name)
        }
        assert task.lease_expires_at is not None  # read_task refuses a running task without
        return planport.TaskClaim(
            run_id=run_id,
            task=name,
            worker=worker,
            generation=task.generation,
            lease_expires_at=task.lease_expires_at,
            attempt=task.attempt,
            effect=task.effect,
            app=run.app,
            workflow=run.workflow,
            version=run.version,
            input=run.input,
            parents=outputs,
            recovered=lapsed,
        )

    def _mismatch(self, cur: C, run_id: str, workflow: str, version: str) -> None:
        run = self._locked(cur, run_id)
        message = (
            f"plan {workflow!r} version {version!r} has another shape than the one this run "
            "was started with; nothing of it runs until the code that started it is served"
        )
        row = self._exec(
            cur, "plan_mismatch", run_id=run_id, error=_error(planport.PLAN_MISMATCH, message)
        ).fetchone()
        if row is not None:
            self._append(
                cur,
                [ledger.Receipt(run_id, row["ledger_sequence"], "finished", run.generation, None)],
            )

    def _task_receipts(
        self, cur: C, run_id: str, generation: int, worker: str | None, marks: list[port.Mark]
    ) -> None:
        row = self._exec(cur, "plan_touch", run_id=run_id, receipts=len(marks)).fetchone()
        # A run's receipts never go back a generation: they carry the run's (a plan
        # run is never claimed whole), and each note names the task's own.
        noted = [port.Mark(m.kind, m.step, m.digest, _noted(generation, m.note)) for m in marks]
        last = row["ledger_sequence"]
        self._append(cur, ledger.numbered(run_id, last, row["generation"], worker, noted))

    # -- a claimed task's writes ------------------------------------------------------

    def _fence_task(self, cur: C, claim: planport.TaskClaim, query: str, **params: Any) -> None:
        row = self._exec(
            cur, query, run_id=claim.run_id, name=claim.task, generation=claim.generation, **params
        ).fetchone()
        if row is None:
            raise errors.StaleClaim(claim.run_id)

    def renew_task(self, claim: planport.TaskClaim, *, lease_ttl: float) -> planport.TaskClaim:
        """Extend the task's lease (fenced)."""
        ttl = transitions.seconds(lease_ttl, "lease_ttl", positive=True)

        def work(cur: C) -> datetime:
            row = self._exec(
                cur,
                "task_renew",
                run_id=claim.run_id,
                name=claim.task,
                generation=claim.generation,
                lease_ttl=ttl,
            ).fetchone()
            if row is None:
                raise errors.StaleClaim(claim.run_id)
            return self.read.instant(row, "lease_expires_at", "task")

        until = self._transact(work, single=True)
        return planport.TaskClaim(**{**vars(claim), "lease_expires_at": until})

    def begin_task_effect(self, claim: planport.TaskClaim, attempt: int) -> None:
        """Record that a once task's effect starts (fenced)."""

        def work(cur: C) -> None:
            self._locked(cur, claim.run_id)
            self._fence_task(cur, claim, "task_effect", attempt=attempt)
            mark = port.Mark("effect_started", step=claim.task, note=f"attempt {attempt}")
            self._task_receipts(cur, claim.run_id, claim.generation, claim.worker, [mark])

        self._transact(work)

    def retry_task(self, claim: planport.TaskClaim, attempt: int, error: str) -> None:
        """Record a failed attempt that will be tried again (fenced)."""
        self._transact(
            lambda cur: self._fence_task(cur, claim, "task_retry", attempt=attempt, error=error),
            single=True,
        )

    def complete_task(self, claim: planport.TaskClaim, output: str) -> planport.TaskEnd:
        """Record the task's output (fenced); end the run if nothing is left."""

        def work(cur: C) -> planport.TaskEnd:
            self._locked(cur, claim.run_id)
            end = {"state": "succeeded", "output": output, "error": None, "delay": None}
            self._fence_task(cur, claim, "task_end", **end)
            mark = port.Mark("task_completed", step=claim.task)
            self._task_receipts(cur, claim.run_id, claim.generation, claim.worker, [mark])
            # Its children may be claimable now, by a worker of any process.
            self._notify(cur, [claim.app])
            return self._ended(cur, claim.run_id, ())

        return self._transact(work)

    def fail_task(
        self,
        claim: planport.TaskClaim,
        error: str,
        *,
        state: Literal["failed", "needs_attention"] = "failed",
    ) -> planport.TaskEnd:
        """Record the task's final failure (fenced), block its descendants, maybe end the run."""
        if state not in ("failed", "needs_attention"):
            raise errors.InvalidInput(f"a task fails as failed or needs_attention, not {state!r}")

        def work(cur: C) -> planport.TaskEnd:
            self._locked(cur, claim.run_id)
            end = {"state": state, "output": None, "error": error, "delay": None}
            self._fence_task(cur, claim, "task_end", **end)
            blocked = self._block(cur, claim.run_id, claim.task, claim.generation, claim.worker)
            return self._ended(cur, claim.run_id, blocked)

        return self._transact(work)

    def release_task(self, claim: planport.TaskClaim, *, delay: float = 0.0) -> None:
        """Give the task back unstarted, claimable again after ``delay`` seconds."""
        wait = transitions.seconds(delay, "delay")

        def work(cur: C) -> None:
            self._locked(cur, claim.run_id)
            end = {"state": "pending", "output": None, "error": None, "delay": wait}
            self._fence_task(cur, claim, "task_end", **end)
            self._notify(cur, [claim.app])

        self._transact(work)

    # -- operators --------------------------------------------------------------------

    def resolve_task(self, run_id: str, task: str, output: str) -> planport.TaskEnd:
        """Settle a task that needs attention as succeeded; unblock and go on."""

        def work(cur: C) -> planport.TaskEnd:
            run = self._locked(cur, run_id)
            if run.plan_digest is None:
                raise errors.NotResolvable(f"run {run_id} is not a plan run")
            found = self._task_row(cur, run_id, task)
            if found is None:
                raise errors.NotResolvable(f"run {run_id} has no task {task!r}")
            if found.state != "needs_attention":
                raise errors.NotResolvable(
                    f"task {task!r} of run {run_id} is {found.state}, not needs_attention"
                )
            self._exec(cur, "task_resolve", run_id=run_id, name=task, output=output)
            reopened = self._exec(cur, "plan_reopen", run_id=run_id).fetchone()
            if reopened is not None:
                receipt = ledger.Receipt(
                    run_id, reopened["ledger_sequence"], "resolved", run.generation, None
                )
                self._append(cur, [receipt])
            self._exec(cur, "task_unblock", run_id=run_id, name=task)
            # A descendant also below another failed task stays blocked by it.
            for other in self._exec(cur, "tasks_of_run", run_id=run_id).fetchall():
                if other["state"] in ("failed", "needs_attention"):
                    self._exec(cur, "task_block", run_id=run_id, name=other["name"])
            if run.cancel_requested:
                self._exec(cur, "task_cancel_pending", run_id=run_id)
            self._notify(cur, [run.app])
            return self._ended(cur, run_id, ())

        return self._transact(work)

    # -- settling -----------------------------------------------------------------------

    def _end_lapsed(self, cur: C, task: planport.Task, code: str, message: str) -> None:
        """A lapsed task that may not run again needs attention; its descendants are blocked."""
        error = _error(code, message, task=task.name)
        end = {"state": _RECOVERABLE, "output": None, "error": error, "delay": None}
        params = {"run_id": task.run_id, "name": task.name, "generation": task.generation}
        self._exec(cur, "task_end", **params, **end)
        self._block(cur, task.run_id, task.name, task.generation, None)
        self._settle(cur, task.run_id)

    def _settle_lapsed_cancel(self, cur: C, run_id: str, name: str) -> None:
        self._locked(cur, run_id)
        task = self._task_row(cur, run_id, name)
        if task is None or task.state != "running":
            return
        if task.effect == "pure":
            params = {"run_id": run_id, "name": name, "generation": task.generation}
            end = {"state": "canceled", "output": None, "error": None, "delay": None}
            self._exec(cur, "task_end", **params, **end)
            self._settle(cur, run_id)
            return
        message = (
            f"task {name!r} ({task.effect}) lost its worker while the run was being canceled: "
            "whether its effect happened is unknown"
        )
        self._end_lapsed(cur, task, planport.EFFECT_OUTCOME_UNKNOWN, message)

    def _block(
        self, cur: C, run_id: str, name: str, generation: int, worker: str | None
    ) -> tuple[str, ...]:
        blocked = tuple(
            r["name"] for r in self._exec(cur, "task_block", run_id=run_id, name=name).fetchall()
        )
        marks = [port.Mark("task_failed", step=name)]
        marks += [port.Mark("task_blocked", step=b, note=f"blocked by {name}") for b in blocked]
        self._task_receipts(cur, run_id, generation, worker, marks)
        return blocked

    def _ended(self, cur: C, run_id: str, blocked: tuple[str, ...]) -> planport.TaskEnd:
        self._settle(cur, run_id)
        state = self._exec(cur, "run_by_id", run_id=run_id).fetchone()["state"]
        return planport.TaskEnd(run_state=state, blocked=blocked)

    def _settle(self, cur: C, run_id: str, *, end_rules: bool = True) -> list[Row]:
        """End the plan run if no task is pending or running; return its row if it ended."""
        found = self._exec(cur, "run_by_id", run_id=run_id).fetchone()
        run = self.read.run(found)
        if run.state != "running":
            return []
        # One indexed probe per transition: reading every task each time would
        # make a run of n tasks cost O(n^2). The rows are read, and checked
        # against each other, once: when the run ends.
        if self._exec(cur, "task_open", run_id=run_id).fetchone() is not None:
            return []
        tasks = [read_task(self.read, r) for r in self._exec(cur, "tasks_of_run", run_id=run_id)]
        check_tasks(run, tasks)
        if any(t.state in planport.TASK_OPEN for t in tasks):
            return []
        state, result, error = _outcome(run, tasks)
        row = self._exec(
            cur, "plan_end", run_id=run_id, state=state, result=result, error=error
        ).fetchone()
        kind = "canceled" if state == "canceled" else "finished"
        receipt = ledger.Receipt(run_id, row["ledger_sequence"], kind, run.generation, None)
        self._append(cur, [receipt])
        if state == "needs_attention":
            return []
        if end_rules:
            self._end_runs(cur, [row])
        return [row]


def _outcome(run: port.Run, tasks: Sequence[planport.Task]) -> tuple[str, str | None, str | None]:
    """The state, result and error of a plan run none of whose tasks is pending or running."""
    if all(t.state == "succeeded" for t in tasks):
        parts = [f"{json.dumps(t.name)}:{t.output or 'null'}" for t in tasks]
        return "succeeded", "{" + ",".join(parts) + "}", None
    by_state: dict[str, list[str]] = {}
    for t in tasks:
        by_state.setdefault(t.state, []).append(t.name)
    summary = {k: by_state.get(k, []) for k in ("failed", "needs_attention", "blocked")}
    attention = [t for t in tasks if t.state == "needs_attention"]
    if attention:
        first = attention[0]
        code = _code(first.error) or "task_needs_attention"
        message = f"task {first.name!r} needs attention ({code})"
        return "needs_attention", None, _error(code, message, task=first.name, tasks=summary)
    if run.cancel_requested:
        return "canceled", None, None
    failed = next(t for t in tasks if t.state == "failed")
    reason = _message(failed.error)
    message = f"task {failed.name!r} failed" + (f": {reason}" if reason else "")
    return "failed", None, _error(planport.TASK_FAILED, message, task=failed.name, tasks=summary)


def _code(error: str | None) -> str | None:
    try:
        value = json.loads(error or "null")
    except ValueError:
        return None
    return str(value.get("code")) if isinstance(value, dict) and value.get("code") else None


def _message(error: str | None) -> str | None:
    try:
        value = json.loads(error or "null")
    except ValueError:
        return None
    if isinstance(value, dict):
        return str(value.get("message") or value.get("type") or "") or None
    return None
