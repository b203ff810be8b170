"""Declaring a plan: the rules @plan.task enforces, check(), the shape digest, arguments."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any

import pytest

import perdure
from perdure import effects, errors, plans


def nightly() -> plans.Plan:
    """The plan of DESIGN §3b: extract -> (transform, audit) -> publish."""
    plan = plans.Plan("nightly", "1")

    @plan.task()
    def extract(day: str) -> list[str]:
        return [day]

    @plan.task(after=[extract])
    def transform(extract: list[str]) -> int:
        return len(extract)

    @plan.task(after=[extract], effect="pure")
    def audit(extract: list[str]) -> bool:
        return True

    @plan.task(after=[transform, audit], effect="once", retry=perdure.Retry(max_attempts=1))
    def publish(transform: int, audit: bool) -> str:
        return "done"

    return plan


def refused(task: str) -> Any:
    return pytest.raises(errors.InvalidPlan, match=task)


# -- the error ----------------------------------------------------------------------


def test_invalid_plan_is_invalid_input_and_names_the_task() -> None:
    exc = errors.InvalidPlan("publish", "something is wrong")
    assert isinstance(exc, errors.InvalidInput)
    assert exc.code == "invalid_plan"
    assert exc.task == "publish"
    assert "'publish'" in str(exc)
    assert perdure.InvalidPlan is errors.InvalidPlan


def test_a_message_that_names_the_task_is_kept_as_written() -> None:
    assert str(errors.InvalidPlan("a", "task 'a' is bad")) == "task 'a' is bad"


# -- the plan itself ------------------------------------------------------------------


def test_plan_attributes() -> None:
    plan = plans.Plan("p", "7", max_recoveries=0)
    assert (plan.name, plan.version, plan.max_recoveries) == ("p", "7", 0)
    assert plans.Plan("p", "1").max_recoveries == 3


@pytest.mark.parametrize("name", ["", "has space", "a/b", "1abc", "x" * 200, None, 3])
def test_a_bad_plan_name_is_refused(name: Any) -> None:
    with pytest.raises(errors.InvalidInput):
        plans.Plan(name, "1")


@pytest.mark.parametrize("version", ["", None, 1])
def test_a_bad_version_is_refused(version: Any) -> None:
    with pytest.raises(errors.InvalidInput):
        plans.Plan("p", version)


@pytest.mark.parametrize("recoveries", [-1, 1.5, True, "3", None])
def test_a_bad_max_recoveries_is_refused(recoveries: Any) -> None:
    with pytest.raises(errors.InvalidInput):
        plans.Plan("p", "1", max_recoveries=recoveries)


# -- declaring tasks ------------------------------------------------------------------


def test_the_design_example_declares_four_tasks_in_order() -> None:
    plan = nightly()
    assert [t.name for t in plan.tasks] == ["extract", "transform", "audit", "publish"]
    assert [t.position for t in plan.tasks] == [0, 1, 2, 3]
    publish = plan.task_def("publish")
    assert publish is not None
    assert publish.parents == ("transform", "audit")
    assert publish.effect == "once"
    assert publish.retry.max_attempts == 1
    assert publish.params == {"transform": int, "audit": bool}
    assert publish.returns is str
    assert not publish.takes_all and not publish.is_async
    assert plan.task_def("nope") is None
    plan.check()


def test_the_decorator_returns_the_function_unchanged() -> None:
    plan = plans.Plan("p", "1")

    def root(x: int) -> int:
        return x + 1

    assert plan.task()(root) is root
    assert root(1) == 2


def test_bare_decorator_and_defaults() -> None:
    plan = plans.Plan("p", "1")

    @plan.task
    async def root(x, *rest, **more):  # type: ignore[no-untyped-def]
        return x

    task = plan.task_def("root")
    assert task is not None
    assert task.is_async and task.takes_all
    assert task.params == {"x": Any}
    assert task.returns is Any
    assert (task.effect, task.retry, task.timeout) == ("idempotent", effects.DEFAULT_RETRY, None)


def test_name_overrides_the_function_name_and_timeouts_take_timedeltas() -> None:
    plan = plans.Plan("p", "1")

    @plan.task(name="first", timeout=timedelta(seconds=90))
    def root() -> None: ...

    @plan.task(name="second", after=["first"], timeout=2)
    def other() -> None: ...

    assert [t.name for t in plan.tasks] == ["first", "second"]
    assert [t.timeout for t in plan.tasks] == [90.0, 2]


def test_a_duplicate_task_name_is_refused() -> None:
    plan = plans.Plan("p", "1")

    @plan.task()
    def a() -> None: ...

    with refused("a"):
        plan.task(name="a")(lambda: None)
    assert len(plan.tasks) == 1


@pytest.mark.parametrize("name", ["", "a/b", "a#2", "nul\x00"])
def test_a_bad_task_name_is_refused(name: str) -> None:
    plan = plans.Plan("p", "1")
    with pytest.raises(errors.InvalidPlan) as info:
        plan.task(name=name)(lambda: None)
    assert info.value.task == name
    assert plan.tasks == ()


def test_a_positional_name_is_refused_with_a_hint() -> None:
    plan = plans.Plan("p", "1")
    with pytest.raises(errors.InvalidPlan, match="name="):
        plan.task("extract")  # type: ignore[call-overload]


def test_after_a_function_that_is_no_task_is_refused() -> None:
    plan = plans.Plan("p", "1")

    def loose() -> None: ...

    with pytest.raises(errors.InvalidPlan, match="not a task of any plan") as info:

        @plan.task(after=[loose])
        def child(loose: None) -> None: ...

    assert info.value.task == "child"


def test_after_a_task_of_another_plan_is_refused() -> None:
    one, two = plans.Plan("one", "1"), plans.Plan("two", "1")

    @one.task()
    def root() -> None: ...

    with pytest.raises(errors.InvalidPlan, match="plan 'one'") as info:

        @two.task(after=[root])
        def child(root: None) -> None: ...

    assert info.value.task == "child"


def test_one_function_may_be_a_task_of_two_plans() -> None:
    one, two = plans.Plan("one", "1"), plans.Plan("two", "1")

    def root() -> int:
        return 1

    one.task()(root)
    two.task()(root)

    @two.task(after=[root])
    def child(root: int) -> None: ...

    assert two.children("root") == ("child",)


def test_a_function_declared_twice_in_one_plan_must_be_named_in_after() -> None:
    plan = plans.Plan("p", "1")

    def root() -> None: ...

    plan.task(name="r1")(root)
    plan.task(name="r2")(root)
    with refused("child"):
        plan.task(name="child", after=[root])(lambda: None)
    plan.task(name="child", after=["r2"])(lambda: None)


@pytest.mark.parametrize("after", ["root", 3, [3], [""], ["a#1"]])
def test_after_takes_a_list_of_tasks_or_names(after: Any) -> None:
    plan = plans.Plan("p", "1")
    with refused("child"):
        plan.task(name="child", after=after)(lambda: None)


def test_a_parent_listed_twice_is_refused() -> None:
    plan = plans.Plan("p", "1")

    @plan.task()
    def root() -> None: ...

    with pytest.raises(errors.InvalidPlan, match="twice"):

        @plan.task(after=[root, "root"])
        def child() -> None: ...


def test_a_self_reference_is_a_cycle() -> None:
    plan = plans.Plan("p", "1")
    with pytest.raises(errors.InvalidPlan, match="cycle") as info:

        @plan.task(after=["me"])
        def me() -> None: ...

    assert info.value.task == "me"
    assert plan.tasks == ()


def test_the_declaration_that_closes_a_cycle_is_refused_and_the_cycle_shown() -> None:
    plan = plans.Plan("p", "1")
    plan.task(name="a", after=["c"])(lambda: None)
    plan.task(name="b", after=["a"])(lambda: None)
    with pytest.raises(errors.InvalidPlan) as info:
        plan.task(name="c", after=["b"])(lambda: None)
    assert info.value.task == "c"
    assert "'c' after 'b' after 'a' after 'c'" in str(info.value)
    assert [t.name for t in plan.tasks] == ["a", "b"]


def test_forward_names_without_a_cycle_are_fine() -> None:
    plan = plans.Plan("p", "1")
    plan.task(name="late_child", after=["early", "late_root"])(lambda **kw: None)
    plan.task(name="early", after=["late_root"])(lambda late_root: None)
    plan.task(name="late_root")(lambda: None)
    plan.check()
    assert plan.roots() == ("late_root",)
    assert plan.descendants("late_root") == ("late_child", "early")


def test_a_parameter_that_names_no_parent_is_refused() -> None:
    plan = plans.Plan("p", "1")

    @plan.task()
    def root() -> None: ...

    with pytest.raises(errors.InvalidPlan, match="'other'") as info:

        @plan.task(after=[root])
        def child(root: None, other: int = 1) -> None: ...

    assert info.value.task == "child"


def test_a_positional_only_parameter_of_a_child_is_refused() -> None:
    plan = plans.Plan("p", "1")
    plan.task(name="root")(lambda: None)
    with refused("child"):

        @plan.task(after=["root"])
        def child(root: None, /) -> None: ...


def test_a_child_may_take_fewer_parents_and_variadics() -> None:
    plan = plans.Plan("p", "1")
    plan.task(name="a")(lambda: None)
    plan.task(name="b")(lambda: None)

    @plan.task(after=["a", "b"])
    def child(a: int, *args: Any, **kwargs: Any) -> None: ...

    @plan.task(after=["a", "b"])
    def ordering_only() -> None: ...

    assert plan.children("a") == ("child", "ordering_only")


def test_a_root_may_take_any_parameters() -> None:
    plan = plans.Plan("p", "1")

    @plan.task()
    def root(day: str, /, limit: int = 3, *, dry: bool = False) -> None: ...

    root_def = plan.task_def("root")
    assert root_def is not None
    assert root_def.params == {"day": str, "limit": int, "dry": bool}


@pytest.mark.parametrize(
    "options",
    [
        {"effect": "sometimes"},
        {"retry": 3},
        {"retry": None},
        {"timeout": 0},
        {"timeout": -1},
        {"timeout": "5"},
        {"timeout": True},
    ],
)
def test_bad_options_are_refused_naming_the_task(options: dict[str, Any]) -> None:
    plan = plans.Plan("p", "1")
    with refused("root"):
        plan.task(name="root", **options)(lambda: None)


def test_something_that_cannot_be_marked_is_refused() -> None:
    plan = plans.Plan("p", "1")

    class Thing:
        def method(self) -> None: ...

    with refused("method"):
        plan.task()(Thing().method)


# -- check --------------------------------------------------------------------------


def test_check_refuses_an_empty_plan_naming_it() -> None:
    plan = plans.Plan("empty", "1")
    with pytest.raises(errors.InvalidPlan, match="declares no task") as info:
        plan.check()
    assert info.value.task == "empty"
    with pytest.raises(errors.InvalidPlan):
        plan.digest()


def test_check_names_the_first_task_after_an_unknown_name() -> None:
    plan = plans.Plan("p", "1")
    plan.task(name="root")(lambda: None)
    plan.task(name="x", after=["root", "ghost"])(lambda: None)
    plan.task(name="y", after=["phantom"])(lambda: None)
    with pytest.raises(errors.InvalidPlan, match="'ghost'") as info:
        plan.check()
    assert info.value.task == "x"
    with pytest.raises(errors.InvalidPlan):
        plan.digest()
    with pytest.raises(errors.InvalidPlan):
        _ = plan.identity


# -- digest ---------------------------------------------------------------------------


def test_the_same_shape_has_the_same_digest() -> None:
    one, two = nightly(), nightly()
    assert one.digest() == two.digest()
    assert len(one.digest()) == 64
    assert one.identity == ("nightly", "1", one.digest())


def test_code_retry_timeout_version_and_parent_order_are_not_the_shape() -> None:
    def build(version: str, swap: bool) -> plans.Plan:
        plan = plans.Plan("p", version)
        plan.task(name="a", retry=effects.NO_RETRY if swap else effects.DEFAULT_RETRY)(lambda: None)
        plan.task(name="b", timeout=3 if swap else None)(lambda: 1)
        parents = ["b", "a"] if swap else ["a", "b"]
        plan.task(name="c", after=parents)(lambda **kw: None)
        return plan

    assert build("1", False).digest() == build("2", True).digest()


Shape = list[tuple[str, list[str], effects.Effect]]


def _shape(tasks: Shape) -> str:
    plan = plans.Plan("p", "1")
    for name, parents, effect in tasks:
        plan.task(name=name, after=parents, effect=effect)(lambda **kw: None)
    return plan.digest()


BASE: Shape = [("a", [], "pure"), ("b", ["a"], "idempotent"), ("c", ["a", "b"], "once")]


@pytest.mark.parametrize(
    "changed",
    [
        [("a", [], "pure"), ("b", ["a"], "idempotent"), ("c", ["a"], "once")],  # an edge less
        [("a", [], "pure"), ("b", ["a"], "once"), ("c", ["a", "b"], "once")],  # an effect
        [("a", [], "pure"), ("b", ["a"], "idempotent"), ("d", ["a", "b"], "once")],  # a name
        [*BASE, ("d", ["c"], "pure")],  # a task more
        BASE[:2],  # a task less
        [("b", ["a"], "idempotent"), ("a", [], "pure"), ("c", ["a", "b"], "once")],  # the order
    ],
)
def test_any_change_of_shape_changes_the_digest(changed: Shape) -> None:
    assert _shape(changed) != _shape(BASE)


def test_the_digest_follows_a_task_added_after_it_was_read() -> None:
    plan = plans.Plan("p", "1")
    plan.task(name="a")(lambda: None)
    first = plan.digest()
    assert plan.digest() is first  # memoized
    plan.task(name="b", after=["a"])(lambda: None)
    assert plan.digest() != first


# -- the graph -------------------------------------------------------------------------


def test_children_descendants_roots() -> None:
    plan = nightly()
    assert plan.roots() == ("extract",)
    assert plan.children("extract") == ("transform", "audit")
    assert plan.children("publish") == ()
    assert plan.descendants("extract") == ("transform", "audit", "publish")
    assert plan.descendants("audit") == ("publish",)
    assert plan.descendants("publish") == ()
    assert plan.descendants("unknown") == ()


# -- arguments -----------------------------------------------------------------------


@dataclasses.dataclass
class Batch:
    rows: list[int]


def test_root_arguments_bind_and_rebuild_by_hint() -> None:
    plan = plans.Plan("p", "1")

    @plan.task()
    def root(batch: Batch, scale: float = 1.0, *extra: Any, tag: str = "") -> None: ...

    task = plan.task_def("root")
    assert task is not None
    args, kwargs = plans.root_arguments(task, [{"rows": [1, 2]}, 2, "x"], {"tag": "t"})
    assert args == [Batch([1, 2]), 2.0, "x"]
    assert isinstance(args[1], float)
    assert kwargs == {"tag": "t"}
    args, kwargs = plans.root_arguments(task, [], {"batch": {"rows": []}})
    assert args == [Batch([])] and kwargs == {}


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [([], {}), ([1, 2, 3], {}), ([{"rows": []}], {"nope": 1})],
)
def test_root_arguments_refuse_input_that_does_not_bind(
    args: list[Any], kwargs: dict[str, Any]
) -> None:
    plan = plans.Plan("p", "1")
    plan.task(name="root")(lambda batch, scale=1.0: None)
    task = plan.task_def("root")
    assert task is not None
    with pytest.raises(errors.InvalidInput, match="'root'"):
        plans.root_arguments(task, args, kwargs)


def test_root_arguments_refuse_a_value_of_the_wrong_type() -> None:
    plan = plans.Plan("p", "1")

    @plan.task()
    def root(day: str) -> None: ...

    task = plan.task_def("root")
    assert task is not None
    with pytest.raises(errors.InvalidPayload, match="'day' of task 'root'"):
        plans.root_arguments(task, [3], {})


def test_parent_arguments_pass_only_the_named_parents() -> None:
    plan = plans.Plan("p", "1")
    plan.task(name="a")(lambda: None)
    plan.task(name="b")(lambda: None)

    @plan.task(after=["a", "b"])
    def child(b: Batch) -> None: ...

    task = plan.task_def("child")
    assert task is not None
    outputs = {"a": 1, "b": {"rows": [3]}, "unrelated": 0}
    assert plans.parent_arguments(task, outputs) == {"b": Batch([3])}


def test_parent_arguments_pass_every_parent_to_kwargs() -> None:
    plan = plans.Plan("p", "1")
    plan.task(name="a")(lambda: None)
    plan.task(name="b")(lambda: None)

    @plan.task(after=["a", "b"])
    def child(a: float, **rest: Any) -> None: ...

    task = plan.task_def("child")
    assert task is not None
    got = plans.parent_arguments(task, {"a": 1, "b": [1], "other": 2})
    assert got == {"a": 1.0, "b": [1]}
    assert isinstance(got["a"], float)


def test_parent_arguments_refuse_a_missing_output() -> None:
    plan = plans.Plan("p", "1")
    plan.task(name="a")(lambda: None)
    plan.task(name="child", after=["a"])(lambda a: None)
    task = plan.task_def("child")
    assert task is not None
    with pytest.raises(errors.InvalidInput, match="'child'"):
        plans.parent_arguments(task, {})


def test_parent_arguments_of_a_root_are_empty() -> None:
    task = nightly().task_def("extract")
    assert task is not None
    assert plans.parent_arguments(task, {"anything": 1}) == {}
