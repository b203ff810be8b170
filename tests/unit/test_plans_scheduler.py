"""The scheduling rule against a brute-force reading of it, on random plans and states."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from perdure import effects, plans


@dataclass(frozen=True)
class Graph:
    """A random DAG: ``parents[i]`` lists task indices below ``i``; ``order`` is declaration."""

    parents: tuple[tuple[int, ...], ...]
    order: tuple[int, ...]
    effects: tuple[effects.Effect, ...]

    def name(self, i: int) -> str:
        return f"t{i}"

    @property
    def names(self) -> list[str]:
        return [self.name(i) for i in range(len(self.parents))]

    def ancestors(self, i: int) -> set[int]:
        """Every task ``i`` runs after, directly or not (indices are topological)."""
        found: set[int] = set()
        for p in self.parents[i]:
            found |= {p} | self.ancestors(p)
        return found

    def plan(self) -> plans.Plan:
        """Declare the tasks in ``order``: a task may name parents declared later."""
        plan = plans.Plan("random", "1")
        for i in self.order:
            after = [self.name(p) for p in self.parents[i]]
            plan.task(name=self.name(i), after=after, effect=self.effects[i])(_any_task)
        return plan


def _any_task(**outputs: Any) -> None:
    return None


@st.composite
def graphs(draw: st.DrawFn, max_tasks: int = 8) -> Graph:
    n = draw(st.integers(min_value=1, max_value=max_tasks))
    parents = tuple(
        tuple(sorted(draw(st.sets(st.integers(0, i - 1), max_size=3)))) if i else ()
        for i in range(n)
    )
    order = tuple(draw(st.permutations(range(n))))
    kinds = tuple(draw(st.lists(st.sampled_from(effects.EFFECTS), min_size=n, max_size=n)))
    return Graph(parents, order, kinds)


@st.composite
def graphs_and_states(draw: st.DrawFn) -> tuple[Graph, dict[str, str]]:
    graph = draw(graphs())
    states = {n: draw(st.sampled_from(plans.TASK_STATES)) for n in graph.names}
    return graph, states


# -- the brute-force reading, written from DESIGN §3b, not from plans.py ----------------


def expected_runnable(graph: Graph, states: dict[str, str]) -> list[str]:
    ready = [
        i
        for i in graph.order
        if states[graph.name(i)] == "pending"
        and all(states[graph.name(p)] == "succeeded" for p in graph.parents[i])
    ]
    return [graph.name(i) for i in ready]


def expected_blocked(graph: Graph, states: dict[str, str], failed: int) -> list[str]:
    below = [i for i in graph.order if failed in graph.ancestors(i)]
    return [graph.name(i) for i in below if states[graph.name(i)] == "pending"]


def expected_outcome(states: dict[str, str], canceling: bool) -> str | None:
    values = list(states.values())
    if "pending" in values or "running" in values:
        return None
    if set(values) == {"succeeded"}:
        return "succeeded"
    if "needs_attention" in values:
        return "needs_attention"
    return "canceled" if canceling else "failed"


# -- the pure functions ------------------------------------------------------------------


def test_the_states_and_the_policy() -> None:
    assert plans.SCHEDULER_POLICY == 1
    assert set(plans.TASK_ENDED) == set(plans.TASK_STATES) - {"pending", "running"}


@given(graph=graphs())
def test_random_plans_declare_and_digest(graph: Graph) -> None:
    plan = graph.plan()
    plan.check()
    assert [t.name for t in plan.tasks] == [graph.name(i) for i in graph.order]
    assert plan.digest() == graph.plan().digest()
    for i in range(len(graph.parents)):
        below = {graph.name(j) for j in range(len(graph.parents)) if i in graph.ancestors(j)}
        assert set(plan.descendants(graph.name(i))) == below


@given(case=graphs_and_states())
def test_runnable_matches_the_brute_force(case: tuple[Graph, dict[str, str]]) -> None:
    graph, states = case
    assert plans.runnable(graph.plan(), states) == expected_runnable(graph, states)


@given(graph=graphs())
def test_a_fresh_run_offers_its_roots(graph: Graph) -> None:
    plan = graph.plan()
    assert plans.runnable(plan, {}) == list(plan.roots())
    assert plans.outcome(plan, {}) is None


@given(case=graphs_and_states(), data=st.data())
def test_blocked_by_failure_matches_the_brute_force(
    case: tuple[Graph, dict[str, str]], data: st.DataObject
) -> None:
    graph, states = case
    failed = data.draw(st.integers(0, len(graph.parents) - 1))
    got = plans.blocked_by_failure(graph.plan(), states, graph.name(failed))
    assert got == expected_blocked(graph, states, failed)


@given(case=graphs_and_states(), canceling=st.booleans())
def test_outcome_matches_the_brute_force(
    case: tuple[Graph, dict[str, str]], canceling: bool
) -> None:
    graph, states = case
    got = plans.outcome(graph.plan(), states, canceling=canceling)
    assert got == expected_outcome(states, canceling)


# -- a random walk of a run ----------------------------------------------------------------


# Success twice as likely as either other ending, so walks reach deep tasks.
ENDINGS = ["succeeded", "succeeded", "failed", "needs_attention"]


def check_invariants(graph: Graph, states: dict[str, str]) -> None:
    for i, parents in enumerate(graph.parents):
        state = states[graph.name(i)]
        if state in ("running", "succeeded"):
            assert all(states[graph.name(p)] == "succeeded" for p in parents), (i, states)
        if state == "blocked":
            assert any(
                states[graph.name(a)] in ("failed", "needs_attention") for a in graph.ancestors(i)
            ), (i, states)


@settings(max_examples=200)
@given(graph=graphs(max_tasks=10), data=st.data())
def test_a_random_walk_always_ends_and_never_runs_past_a_parent(
    graph: Graph, data: st.DataObject
) -> None:
    plan = graph.plan()
    states = dict.fromkeys(graph.names, "pending")
    canceling = False
    for _ in range(4 * len(graph.names) + 2):
        offered = [] if canceling else plans.runnable(plan, states)
        running = [n for n, s in states.items() if s == "running"]
        if not offered and not running:
            break
        assert plans.outcome(plan, states, canceling=canceling) is None
        moves = [("claim", n) for n in offered] + [("finish", n) for n in running]
        if not canceling:
            moves.append(("cancel", ""))
        move, name = data.draw(st.sampled_from(moves))
        if move == "claim":
            # The scheduler offers in declaration order; a claim may take any of them.
            states[name] = "running"
        elif move == "cancel":
            canceling = True
            for n, s in states.items():
                if s == "pending":
                    states[n] = "canceled"
        else:
            end = data.draw(
                st.sampled_from(["succeeded", "succeeded", "failed", "needs_attention"])
            )
            states[name] = end
            if end != "succeeded":
                for blocked in plans.blocked_by_failure(plan, states, name):
                    states[blocked] = "blocked"
        check_invariants(graph, states)
    else:
        raise AssertionError(f"the walk did not end: {states}")
    assert "pending" not in states.values() and "running" not in states.values()
    ended = plans.outcome(plan, states, canceling=canceling)
    assert ended is not None
    assert ended == expected_outcome(states, canceling)
    if not canceling and "failed" not in states.values():
        assert ended in ("succeeded", "needs_attention")
