"""The invariants every trial is held to, whatever its scenario (DESIGN.md §2).

Each returns one sentence per violation, naming the run, the step or the
signal:

* a step whose outcome was recorded never runs again (guarantee 1), and a
  recorded outcome is never rewritten;
* a ``once`` effect runs at most once (guarantee 3);
* a signal the drive holds a receipt for is applied exactly once, unless its
  run stopped before reaching it (guarantee 4);
* every run rests: it ends or waits; ``needs_attention`` only for an effect
  whose outcome is unknown, with that effect's start in the journal.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator

from perdure.store import port
from perdure.testing.chaos import scenario as scenario_api

RESTING = port.TERMINAL_STATES | {"waiting"}


def invariants(view: scenario_api.TrialView) -> list[str]:
    """Return every violation of the explorer's own invariants in ``view``."""
    return [*reruns(view), *rewrites(view), *repeated_once(view), *signals(view), *rest(view)]


def reruns(view: scenario_api.TrialView) -> Iterator[str]:
    """A step body that ran after its outcome was recorded."""
    recorded: dict[str, str] = {}
    for event in view.events:
        if event.kind == "recorded":
            recorded.setdefault(event.key, event.phase)
        elif event.kind == "effect" and event.key in recorded:
            yield (
                f"step {event.key} ran again ({event.phase}) after its outcome was recorded "
                f"({recorded[event.key]})"
            )


def rewrites(view: scenario_api.TrialView) -> Iterator[str]:
    """A journal entry with an outcome at the crash that the recovery changed or lost."""
    for run_id, entries in view.at_crash.items():
        final = {e.position: e for e in view.journals.get(run_id, [])}
        for entry in entries:
            if entry.status == "started":
                continue
            if final.get(entry.position) != entry:
                yield f"run {run_id}: journal entry {entry.position} ({entry.name}) was rewritten"


def repeated_once(view: scenario_api.TrialView) -> Iterator[str]:
    """A ``once`` effect that happened more than once."""
    counts = Counter(e.key for e in view.events if e.kind == "effect" and e.once)
    for key, count in sorted(counts.items()):
        if count > 1:
            yield f"once effect {key} ran {count} times"


def signals(view: scenario_api.TrialView) -> Iterator[str]:
    """A delivered signal that was never applied, or applied more than once."""
    applied: Counter[str] = Counter()
    for entries in view.journals.values():
        for entry in entries:
            signal_id = _signal_of(entry)
            if signal_id is not None:
                applied[signal_id] += 1
    states = {r.run_id: r.state for r in view.runs}
    delivered = {e.key: e.label for e in view.events if e.kind == "signal"}
    for signal_id, count in sorted(applied.items()):
        if count > 1:
            yield f"signal {signal_id} was applied {count} times"
    for signal_id, run_id in sorted(delivered.items()):
        if applied[signal_id] == 0 and states.get(run_id) != "needs_attention":
            yield (
                f"signal {signal_id} was delivered (a receipt names it) but never applied; "
                f"run {run_id} is {states.get(run_id, 'gone')}"
            )


def _signal_of(entry: port.JournalEntry) -> str | None:
    if entry.status != "ok" or not entry.output or '"signal_id"' not in entry.output:
        return None
    try:
        body = json.loads(entry.output)
    except ValueError:
        return None
    found = body.get("signal_id") if isinstance(body, dict) else None
    return found if isinstance(found, str) else None


def rest(view: scenario_api.TrialView) -> Iterator[str]:
    """A run that did not end or park, or that needs attention for no unsettled effect."""
    for run in view.runs:
        if run.state not in RESTING:
            yield f"run {run.run_id} ({run.workflow}) is still {run.state} after the recovery"
            continue
        if run.state != "needs_attention":
            continue
        error = view.error(run)
        code = error.get("code")
        if code != "effect_outcome_unknown":
            message = error.get("message")
            yield f"run {run.run_id} ({run.workflow}) needs attention: {code}: {message}"
            continue
        step = error.get("step") or error.get("task")
        started = [e for e in view.journals.get(run.run_id, []) if e.status == "started"]
        if not any(e.name == step for e in started):
            yield f"run {run.run_id} needs attention for {step}, with no effect start journaled"
