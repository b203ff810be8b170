"""Which update waits an update carried by its delivery's wake-up answers exactly."""

from __future__ import annotations

from datetime import UTC, datetime

from perdure.store import port, warmport


def _update(name: str, sequence: int) -> port.UpdateRecord:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    return port.UpdateRecord("r1", f"u{sequence}", name, sequence, "1", "pending", None, at, None)


def _known(*waits: tuple[str, int]) -> port.KnownJournal:
    return port.KnownJournal(3, (), frozenset(), waits)


def test_an_update_numbered_right_after_the_wait_answers_it() -> None:
    update = _update("ask", 5)
    assert warmport.carried_updates(_known(("ask", 4)), update) == {("ask", 4): update}


def test_an_update_numbered_further_on_may_not_be_the_first_after_the_wait() -> None:
    # Sequence 5 could be another name's, or an "ask" the run has not read yet.
    assert warmport.carried_updates(_known(("ask", 3)), _update("ask", 5)) == {}


def test_an_update_of_another_name_answers_nothing() -> None:
    assert warmport.carried_updates(_known(("ask", 4)), _update("tell", 5)) == {}


def test_only_the_waits_it_answers_are_returned() -> None:
    update = _update("ask", 5)
    known = _known(("tell", 4), ("ask", 4), ("ask", 2))
    assert warmport.carried_updates(known, update) == {("ask", 4): update}


def test_no_carried_update_answers_nothing() -> None:
    assert warmport.carried_updates(_known(("ask", 4)), None) == {}
