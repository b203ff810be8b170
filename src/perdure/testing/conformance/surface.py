"""Conformance: the operating surface's sections: access tokens and keyset run pages."""

from __future__ import annotations

from datetime import timedelta
from typing import Any, cast

import pytest

from perdure import errors
from perdure.store import pages, port, tokens
from perdure.testing import clock as clocks
from perdure.testing.conformance.harness import (
    APP,
    OTHER_APP,
    Suite,
    claim_run,
    new_run,
    start,
)


def _tokens(store: port.Store) -> tokens.TokenStore:
    assert isinstance(store, tokens.TokenStore), "the store has no token operations"
    return store


def _paged(store: port.Store) -> pages.PagedStore:
    assert isinstance(store, pages.PagedStore), "the store has no paged reads"
    return store


def _new(token_id: str, app: str = APP, **kwargs: object) -> tokens.NewToken:
    return tokens.NewToken(
        token_id=token_id,
        app=app,
        scope=cast(tokens.Scope, kwargs.get("scope", "read")),
        digest=f"digest-of-{token_id}",
        expires_at=kwargs.get("expires_at"),  # type: ignore[arg-type]
    )


class TokenTests(Suite):
    """The conformance tests of create_token, get_token, list_tokens, revoke_token, has_tokens."""

    def test_create_token_stores_it_at_the_store_clock(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        held = _tokens(store)
        expires = clock.now() + timedelta(hours=1)
        made = held.create_token(_new("t1", scope="operate", expires_at=expires))
        assert made == tokens.Token(
            "t1", APP, "operate", "digest-of-t1", clock.now(), expires, None
        )
        assert held.get_token("t1") == made
        assert held.get_token("missing") is None

    def test_create_token_refuses_a_taken_id_and_keeps_the_first(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        held = _tokens(store)
        first = held.create_token(_new("t1"))
        with pytest.raises(errors.InvalidInput):
            held.create_token(_new("t1", app=OTHER_APP, scope="operate"))
        assert held.get_token("t1") == first

    def test_create_token_refuses_an_unknown_scope(self, store: port.Store) -> None:
        held = _tokens(store)
        with pytest.raises(errors.InvalidInput):
            held.create_token(_new("t1", scope="admin"))
        assert held.list_tokens() == []

    def test_list_tokens_by_app_oldest_first(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        held = _tokens(store)
        held.create_token(_new("b"))
        clock.advance(1)
        held.create_token(_new("a", app=OTHER_APP))
        clock.advance(1)
        held.create_token(_new("c"))
        assert [t.token_id for t in held.list_tokens()] == ["b", "a", "c"]
        assert [t.token_id for t in held.list_tokens(APP)] == ["b", "c"]
        assert [t.token_id for t in held.list_tokens(OTHER_APP)] == ["a"]
        assert held.list_tokens("nobody") == []

    def test_revoke_token_keeps_the_first_instant(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        held = _tokens(store)
        held.create_token(_new("t1"))
        held.create_token(_new("t2"))
        clock.advance(5)
        revoked = held.revoke_token("t1")
        assert revoked is not None and revoked.revoked_at == clock.now()
        first = clock.now()
        clock.advance(5)
        again = held.revoke_token("t1")
        assert again is not None and again.revoked_at == first
        assert held.revoke_token("missing") is None
        other = held.get_token("t2")
        assert other is not None and other.revoked_at is None

    def test_has_tokens_counts_only_usable_ones(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        held = _tokens(store)
        assert held.has_tokens(APP) is False
        held.create_token(_new("short", expires_at=clock.now() + timedelta(seconds=10)))
        assert held.has_tokens(APP) is True
        assert held.has_tokens(OTHER_APP) is False
        clock.advance(10)
        assert held.has_tokens(APP) is False
        held.create_token(_new("long"))
        assert held.has_tokens(APP) is True
        held.revoke_token("long")
        assert held.has_tokens(APP) is False
        token = held.get_token("short")
        assert token is not None and not token.usable(clock.now())


class PageTests(Suite):
    """The conformance tests of page_runs, page_children and run_by_key."""

    def test_pages_walk_every_run_once_newest_first(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        paged = _paged(store)
        made = []
        for i in range(7):
            made.append(start(store, workflow="wf-page"))
            if i % 3 == 2:
                clock.advance(1)  # several runs share an instant: run_id breaks the tie
        start(store, app=OTHER_APP, workflow="wf-page")
        expected = sorted(made, key=lambda r: (r.created_at, r.run_id), reverse=True)
        seen: list[str] = []
        after = None
        while True:
            page = paged.page_runs(APP, after=after, limit=3)
            seen += [r.run_id for r in page]
            if len(page) < 3:
                break
            after = pages.After(page[-1].created_at, page[-1].run_id)
        assert seen == [r.run_id for r in expected]

    def test_a_page_is_stable_when_runs_are_created_meanwhile(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        paged = _paged(store)
        runs = [start(store, workflow="wf-stable") for _ in range(4)]
        first = paged.page_runs(APP, limit=2)
        clock.advance(1)
        start(store, workflow="wf-stable")
        after = pages.After(first[-1].created_at, first[-1].run_id)
        second = paged.page_runs(APP, after=after, limit=2)
        assert {r.run_id for r in first + second} == {r.run_id for r in runs}

    def test_pages_filter_by_state_and_workflow(self, store: port.Store) -> None:
        paged = _paged(store)
        a = start(store, workflow="wf-a")
        b = start(store, workflow="wf-b")
        assert [r.run_id for r in paged.page_runs(APP, workflow="wf-a")] == [a.run_id]
        assert {r.run_id for r in paged.page_runs(APP, state="queued")} == {a.run_id, b.run_id}
        assert paged.page_runs(APP, state="failed") == []
        both = paged.page_runs(APP, state="queued", workflow="wf-b")
        assert [r.run_id for r in both] == [b.run_id]
        assert paged.page_runs(APP, state="failed", workflow="wf-b") == []
        first = paged.page_runs(APP, state="queued", limit=1)
        rest = paged.page_runs(
            APP, state="queued", after=pages.After(first[0].created_at, first[0].run_id)
        )
        assert {r.run_id for r in first + rest} == {a.run_id, b.run_id} and len(rest) == 1
        only_a = paged.page_runs(APP, workflow="wf-a", after=pages.After(a.created_at, a.run_id))
        assert only_a == []
        assert paged.page_runs(APP, limit=0) == []

    def test_pages_keep_a_time_window_with_every_filter(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        paged = _paged(store)
        made = []
        for i in range(6):
            made.append(start(store, workflow="wf-window" if i % 2 else "wf-other"))
            clock.advance(10)
        start(store, app=OTHER_APP, workflow="wf-window")
        at = [r.created_at for r in made]

        def ids(**kwargs: Any) -> list[str]:
            return [r.run_id for r in paged.page_runs(APP, **kwargs)]

        def expect(*picked: int) -> list[str]:
            return [made[i].run_id for i in picked]

        assert ids(created_after=at[1]) == expect(5, 4, 3, 2)
        assert ids(created_before=at[2]) == expect(1, 0)
        assert ids(created_after=at[0], created_before=at[4]) == expect(3, 2, 1)
        assert ids(created_after=at[0], created_before=at[4], workflow="wf-window") == expect(3, 1)
        assert ids(created_after=at[0], state="queued") == expect(5, 4, 3, 2, 1)
        assert ids(created_before=at[3], state="queued", workflow="wf-other") == expect(2, 0)
        assert ids(created_after=at[5]) == [] and ids(created_before=at[0]) == []
        assert ids(created_after=at[3], created_before=at[2]) == []
        # A cursor inside the window pages on; one past its end is bounded by it.
        first = paged.page_runs(APP, created_before=at[5], limit=2)
        after = pages.After(first[-1].created_at, first[-1].run_id)
        assert ids(created_before=at[5], after=after) == expect(2, 1, 0)
        newest = pages.After(made[5].created_at, made[5].run_id)
        assert ids(created_before=at[2], after=newest) == expect(1, 0)
        with pytest.raises(errors.InvalidInput):
            paged.page_runs(APP, created_after=at[0].replace(tzinfo=None))
        with pytest.raises(errors.InvalidInput):
            paged.page_runs(APP, created_before=at[0].replace(tzinfo=None))

    def test_page_children_walks_one_runs_children_oldest_first(
        self, store: port.Store, clock: clocks.FakeClock
    ) -> None:
        paged = _paged(store)
        parent, other = start(store), start(store)
        claim = claim_run(store, parent).claim
        made = []
        for i in range(3):
            batch = [new_run(parent_id=parent.run_id, key=f"child-{i}-{j}") for j in range(2)]
            made += store.create_children(claim, batch)
            clock.advance(1)
        grandchild_parent = made[0]
        store.create_run(new_run(parent_id=grandchild_parent.run_id))
        store.create_run(new_run(parent_id=other.run_id))
        expected = [r.run_id for r in sorted(made, key=lambda r: (r.created_at, r.run_id))]
        seen: list[str] = []
        after = None
        while page := paged.page_children(parent.run_id, after=after, limit=4):
            seen += [r.run_id for r in page]
            after = pages.After(page[-1].created_at, page[-1].run_id)
        assert seen == expected
        assert all(r.parent_id == parent.run_id for r in paged.page_children(parent.run_id))
        assert paged.page_children("no-such-run") == []
        assert paged.page_children(parent.run_id, limit=0) == []
        assert len(paged.page_children(grandchild_parent.run_id)) == 1

    def test_run_by_key_finds_only_the_apps_run(self, store: port.Store) -> None:
        paged = _paged(store)
        run = start(store, key="order-7")
        start(store, app=OTHER_APP, key="order-8")
        found = paged.run_by_key(APP, "order-7")
        assert found is not None and found.run_id == run.run_id
        assert paged.run_by_key(APP, "order-8") is None
        assert paged.run_by_key(APP, "nothing") is None
