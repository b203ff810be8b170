"""``retention.prune_paced``: batch after batch, resting in proportion to each batch's time."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from perdure import errors
from perdure.store import retention

CUTOFF = datetime(2026, 1, 1, tzinfo=UTC)


class Backlog:
    """A store whose prune deletes from a count, each batch taking ``took`` fake seconds."""

    def __init__(self, runs: int, took: list[float]) -> None:
        self.runs = runs
        self.took = took
        self.now = 0.0
        self.limits: list[int] = []

    def prune(self, app: str, ended_before: datetime, limit: int = 500) -> int:
        self.limits.append(limit)
        n = min(limit, self.runs)
        self.runs -= n
        self.now += self.took[min(len(self.limits), len(self.took)) - 1]
        return n


def run(store: Backlog, **kwargs: float) -> tuple[int, list[float]]:
    rests: list[float] = []

    def sleep(seconds: float) -> None:
        rests.append(seconds)
        store.now += seconds

    pruned = retention.prune_paced(
        store, "app", CUTOFF, sleep=sleep, clock=lambda: store.now, **kwargs
    )
    return pruned, rests


def test_each_rest_is_the_factor_times_the_batch_just_done() -> None:
    store = Backlog(1050, took=[0.1, 0.4, 0.2, 0.0])
    pruned, rests = run(store, batch=500, pause_factor=3)
    assert pruned == 1050 and store.runs == 0
    # 500, 500, 50, then an empty batch ends it; no rest after the empty one.
    assert store.limits == [500, 500, 500, 500]
    assert rests == pytest.approx([0.3, 1.2, 0.6])


def test_a_rest_is_capped_and_factor_zero_never_rests() -> None:
    store = Backlog(20, took=[60.0])
    assert run(store, batch=10, pause_factor=3) == (20, [retention.MAX_PAUSE] * 2)
    store = Backlog(20, took=[1.0])
    assert run(store, batch=10, pause_factor=0) == (20, [])


def test_an_empty_backlog_is_one_batch() -> None:
    store = Backlog(0, took=[0.1])
    assert run(store) == (0, [])
    assert store.limits == [retention.DEFAULT_BATCH]


@pytest.mark.parametrize(
    "kwargs", [{"batch": 0}, {"pause_factor": -1}, {"pause_factor": float("nan")}]
)
def test_bad_settings_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(errors.InvalidInput):
        run(Backlog(1, took=[0.0]), **kwargs)
