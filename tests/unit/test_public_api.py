"""The public surface: ``perdure.__all__``, the error tree and its codes, worker timing."""

from __future__ import annotations

import ast
import inspect
import re
import types
from pathlib import Path

import pytest

import perdure
from perdure import errors

SNAKE = re.compile(r"^[a-z][a-z0-9]*(_[a-z0-9]+)*$")


def _names_defined_in_init() -> set[str]:
    """Names bound at the top level of ``perdure/__init__.py``, read from its source."""
    tree = ast.parse(Path(perdure.__file__).read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom | ast.Import):
            for alias in node.names:
                found.add((alias.asname or alias.name).split(".")[0])
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    found.add(target.id)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            found.add(node.target.id)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            found.add(node.name)
    return {n for n in found if not n.startswith("_")}


def test_all_is_a_list_of_unique_strings() -> None:
    assert isinstance(perdure.__all__, list)
    assert all(isinstance(n, str) for n in perdure.__all__)
    assert len(perdure.__all__) == len(set(perdure.__all__))


def test_all_is_sorted() -> None:
    assert perdure.__all__ == sorted(perdure.__all__)


def test_every_name_in_all_exists() -> None:
    missing = [n for n in perdure.__all__ if not hasattr(perdure, n)]
    assert missing == []


def test_all_equals_the_public_names_of_the_package() -> None:
    defined = _names_defined_in_init()
    assert set(perdure.__all__) == defined

    # The same, seen from the imported module: every public non-module attribute.
    public = {
        name
        for name, value in vars(perdure).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert set(perdure.__all__) == public


def test_star_import_gives_exactly_all() -> None:
    namespace: dict[str, object] = {}
    exec("from perdure import *", namespace)
    namespace.pop("__builtins__")
    assert set(namespace) == set(perdure.__all__)


def test_version() -> None:
    assert isinstance(perdure.__version__, str)
    assert re.match(r"^\d+\.\d+\.\d+", perdure.__version__)


def test_errors_all_is_sorted_and_complete() -> None:
    assert errors.__all__ == sorted(errors.__all__)
    classes = {
        name
        for name, value in vars(errors).items()
        if inspect.isclass(value)
        and value.__module__ == errors.__name__
        and not name.startswith("_")
    }
    assert set(errors.__all__) == classes


def _error_classes() -> list[type[BaseException]]:
    return [getattr(errors, n) for n in errors.__all__]


def test_every_error_declares_its_own_distinct_snake_case_code() -> None:
    codes: dict[str, str] = {}
    for cls in _error_classes():
        assert "code" in vars(cls), f"{cls.__name__} inherits its code"
        code = vars(cls)["code"]
        assert isinstance(code, str)
        assert SNAKE.match(code), f"{cls.__name__}.code {code!r} is not snake_case"
        assert code not in codes, f"{cls.__name__} and {codes[code]} share code {code!r}"
        codes[code] = cls.__name__


@pytest.mark.parametrize(
    ("cls", "code"),
    [
        (perdure.WaitTimedOut, "wait_timeout"),
        (perdure.NonDeterminism, "non_determinism"),
        (perdure.LeaseLost, "lease_lost"),
        (perdure.CorruptState, "corrupt_state"),
        (perdure.StepFailed, "step_failed"),
        (perdure.EffectFailed, "effect_failed"),
        (perdure.StoreUnavailable, "store_unavailable"),
        (perdure.NotResolvable, "not_resolvable"),
        (perdure.LeaseTimingInvalid, "lease_timing_invalid"),
        (perdure.InvalidPayload, "invalid_payload"),
    ],
)
def test_design_codes(cls: type[BaseException], code: str) -> None:
    assert cls.code == code  # type: ignore[attr-defined]


def test_errors_exported_from_perdure_are_the_same_classes() -> None:
    for name in perdure.__all__:
        if hasattr(errors, name):
            assert getattr(perdure, name) is getattr(errors, name)


def test_every_exported_error_is_a_perdure_error_or_a_control_signal() -> None:
    for cls in _error_classes():
        assert issubclass(cls, errors.PerdureError | errors.Interrupt), cls


@pytest.mark.parametrize(
    "cls",
    [errors.Suspend, perdure.LeaseLost, perdure.StaleClaim, perdure.Canceled, errors.Interrupt],
)
def test_control_signals_are_not_exceptions(cls: type[BaseException]) -> None:
    assert issubclass(cls, BaseException)
    assert not issubclass(cls, Exception)
    signal = cls("run-1") if issubclass(cls, errors.LeaseLost) else cls()
    caught_by_except_exception = False
    try:
        try:
            raise signal
        except Exception:
            caught_by_except_exception = True
    except BaseException as exc:
        assert exc is signal
    assert not caught_by_except_exception


def test_stale_claim_and_canceled_are_lease_lost() -> None:
    assert issubclass(perdure.StaleClaim, perdure.LeaseLost)
    assert issubclass(perdure.Canceled, perdure.LeaseLost)
    lost = perdure.StaleClaim("run-1")
    assert lost.run_id == "run-1"
    assert "run-1" in str(lost)


def test_user_facing_errors_are_exceptions() -> None:
    for cls in (
        perdure.PerdureError,
        perdure.WaitTimedOut,
        perdure.StepFailed,
        perdure.EffectFailed,
        perdure.NonDeterminism,
        perdure.CorruptState,
    ):
        assert issubclass(cls, Exception)
    assert issubclass(perdure.InvalidInput, ValueError)
    assert issubclass(perdure.LeaseTimingInvalid, ValueError)
    assert issubclass(perdure.ResultTimeout, TimeoutError)


def test_default_message_is_the_docstring_summary() -> None:
    assert (
        str(perdure.EffectFailed())
        == "The step's author states that its effect certainly did not happen."
    )
    assert perdure.WaitStillOpen().message == "The run still has a wait with no outcome."


def test_run_failed_carries_the_runs_own_code() -> None:
    exc = perdure.RunFailed("r1", "failed", {"code": "step_failed", "message": "boom", "step": "s"})
    assert exc.error["code"] == "step_failed"
    assert "step_failed" in str(exc)
    assert exc.state == "failed"
    assert exc.error["step"] == "s"
    assert "r1" in str(exc) and "boom" in str(exc)


# -- worker timing ------------------------------------------------------------------


@pytest.fixture
def app(tmp_path: Path) -> perdure.App:
    made = perdure.App(f"sqlite:///{tmp_path / 'api.db'}", name="api")
    yield made
    made.close()


@pytest.mark.parametrize(
    ("lease_ttl", "heartbeat"), [(10, 5), (10, 10), (10, 12), (10, 0), (10, -1), (0, 1), (3, 1.5)]
)
def test_worker_refuses_a_heartbeat_that_could_let_the_lease_lapse(
    app: perdure.App, lease_ttl: float, heartbeat: float
) -> None:
    with pytest.raises(ValueError) as caught:
        app.worker(lease_ttl=lease_ttl, heartbeat=heartbeat)
    assert isinstance(caught.value, perdure.LeaseTimingInvalid)
    message = str(caught.value)
    assert re.search(rf"lease_ttl={lease_ttl}(\.0)?\b", message), message
    assert re.search(rf"heartbeat={heartbeat}(\.0)?\b", message), message


def test_worker_accepts_a_heartbeat_of_a_third(app: perdure.App) -> None:
    worker = app.worker(lease_ttl=10, heartbeat=3)
    assert isinstance(worker, perdure.Worker)
    assert worker.lease_ttl == 10
    assert worker.heartbeat == 3
    exact = app.worker(lease_ttl=3, heartbeat=1)
    assert exact.heartbeat == 1


def test_worker_accepts_timedeltas(app: perdure.App) -> None:
    from datetime import timedelta

    worker = app.worker(lease_ttl=timedelta(seconds=30), heartbeat=timedelta(seconds=5))
    assert (worker.lease_ttl, worker.heartbeat) == (30.0, 5.0)
    with pytest.raises(perdure.LeaseTimingInvalid):
        app.worker(lease_ttl=timedelta(seconds=30), heartbeat=timedelta(seconds=20))
