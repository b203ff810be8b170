"""The built-in scenarios: steps and a ``once`` effect, a signal wait, children.

Each scenario's app is named after it, so that one store could hold them all.
Steps record their effect with :func:`~perdure.testing.chaos.effect`; their
outputs carry a nonce, so a check can tell which execution an outcome came from.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

from perdure import app as app_api
from perdure import context, effects
from perdure.testing.chaos import scenario as scenario_api
from perdure.testing.chaos.scenario import Drive, Scenario, TrialView, effect

# -- steps and a once effect ------------------------------------------------------------

orders = app_api.App(name="chaos_steps")


def _nonce() -> str:
    return uuid.uuid4().hex[:10]


@orders.step()
def reserve(order: str) -> str:
    effect("reserve")
    return f"reserve:{order}:{_nonce()}"


@orders.step(effect="pure")
def price(order: str) -> int:
    return len(order) * 100


@orders.step(effect="once", retry=effects.Retry(max_attempts=1))
def charge(order: str, cents: int) -> str:
    nonce = _nonce()
    effect(f"charge:{nonce}", once=True)
    return f"charge:{order}:{cents}:{nonce}"


@orders.step()
def confirm(order: str) -> str:
    effect("confirm")
    return f"confirm:{order}:{_nonce()}"


@orders.workflow(version="1")
def checkout(ctx: context.Context, order: str) -> list[str]:
    held = reserve(order)
    cents = price(order)
    return [held, charge(order, cents), confirm(order)]


def _drive_checkout(d: Drive) -> None:
    d.start(checkout, "o-1", key="o-1")
    d.run_until_idle()


def _check_checkout(view: TrialView) -> Iterator[str]:
    for run in view.roots():
        if run.state == "needs_attention":
            continue  # the charge may have escaped: the explorer checked the error names it
        if run.state != "succeeded":
            yield f"checkout {run.run_id} ended {run.state}: {view.error(run)}"
            continue
        charged = view.result(run)[1]
        nonces = [e.label.split(":", 1)[1] for e in view.effects() if e.label.startswith("charge:")]
        if nonces != [charged.rsplit(":", 1)[1]]:
            yield f"checkout {run.run_id} recorded {charged!r} but the charges were {nonces}"


steps_once = Scenario(
    "steps_once",
    orders,
    _drive_checkout,
    _check_checkout,
    description="idempotent, pure and once steps in a row",
)


# -- a signal wait ------------------------------------------------------------------------

approvals = app_api.App(name="chaos_signal")


@approvals.step()
def apply_vote(vote: str) -> str:
    effect(f"vote:{vote}")
    return f"applied:{vote}"


@approvals.workflow(version="1")
def ballot(ctx: context.Context, name: str) -> list[str]:
    first = ctx.wait("vote")
    applied = [apply_vote(str(first))]
    second = ctx.wait("vote")  # "vote#2": a second signal settles it
    applied.append(apply_vote(str(second)))
    return applied


def _drive_ballot(d: Drive) -> None:
    run = d.start(ballot, "b-1", key="b-1")
    d.run_until_idle()  # the run parks on its first wait
    d.signal(run.run_id, "vote", "yes", signal_id="vote-1")
    # The second vote arrives before the run has resumed and waits for it.
    d.signal(run.run_id, "vote", "no", signal_id="vote-2")
    d.run_until_idle()


def _check_ballot(view: TrialView) -> Iterator[str]:
    for run in view.roots():
        if run.state != "succeeded" or view.result(run) != ["applied:yes", "applied:no"]:
            yield f"ballot {run.run_id} ended {run.state} with {view.result(run)!r}"


signal_wait = Scenario(
    "signal_wait",
    approvals,
    _drive_ballot,
    _check_ballot,
    description="two waits; one signal sent while the run waits, one before it does",
)


# -- children -------------------------------------------------------------------------------

family = app_api.App(name="chaos_children")


@family.step()
def work(n: int) -> str:
    effect(f"work:{n}")
    return f"work:{n}:{_nonce()}"


@family.workflow(version="1")
def child(ctx: context.Context, n: int) -> str:
    return work(n)


@family.workflow(version="1")
def parent(ctx: context.Context) -> list[str]:
    first = ctx.start_child(child, 1)
    second = ctx.start_child(child, 2)
    return [first.result(), second.result()]


def _drive_family(d: Drive) -> None:
    d.start(parent, key="family-1")
    d.run_until_idle()


def _check_family(view: TrialView) -> Iterator[str]:
    children = [r for r in view.runs if r.parent_id is not None]
    if len(children) != 2:
        yield f"{len(children)} child runs exist, not 2"
    for run in view.roots():
        results = view.result(run)
        if run.state != "succeeded" or [r.split(":")[1] for r in results or []] != ["1", "2"]:
            yield f"parent {run.run_id} ended {run.state} with {results!r}"
            continue
        recorded = {view.result(c) for c in children}
        if set(results) != recorded:
            yield f"parent {run.run_id} joined {results} but its children returned {recorded}"


children = Scenario(
    "children",
    family,
    _drive_family,
    _check_family,
    description="a parent starts two children and joins them",
)

BUILT_IN: tuple[scenario_api.Scenario, ...] = (steps_once, signal_wait, children)
