"""The operating surface's store operations, written once over named queries.

:class:`SurfaceTransitions` adds to an SQL adapter the port sections the
console and the HTTP API need: access tokens (:mod:`perdure.store.tokens`)
and keyset pages of runs (:mod:`perdure.store.pages`);
:class:`RetentionTransitions` the pruning of :mod:`perdure.store.retention`. Each operation is one
transaction (or one statement) over the adapter's named queries, listed in
``docs/store.md``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, TypeVar, cast

from perdure import errors
from perdure.store import pages, port, retention, rows, tokens, transitions

C = TypeVar("C")

# Past every run: the keyset bound of a first page.
_END = datetime.max.replace(tzinfo=UTC)
# Before every run: the lower bound of a listing with no time window, and
# the keyset bound of a first page of children.
_BEGIN = datetime.min.replace(tzinfo=UTC)


def _aware(name: str, when: datetime | None) -> None:
    if when is not None and (when.tzinfo is None or when.utcoffset() is None):
        raise errors.InvalidInput(f"{name} must be an aware datetime")


def _upper(after: pages.After | None, before: datetime | None) -> tuple[datetime, str]:
    """Return the keyset bound of a page: the cursor, or the window's end if it comes first.

    ``(before, "")`` sorts before every run created at ``before``, since a run
    id is never empty: ``(created_at, run_id) < (before, "")`` is
    ``created_at < before``.
    """
    bound = (after.created_at, after.run_id) if after else (_END, "")
    if before is not None and (before, "") < bound:
        return before, ""
    return bound


class SurfaceTransitions(transitions.Transitions[C]):
    """Token and paging operations shared by the SQL adapters."""

    # -- run pages ------------------------------------------------------------

    def page_runs(
        self,
        app: str,
        *,
        state: str | None = None,
        workflow: str | None = None,
        after: pages.After | None = None,
        limit: int = 50,
        created_after: datetime | None = None,
        created_before: datetime | None = None,
        queue: str | None = None,
    ) -> list[port.Run]:
        """Return up to ``limit`` of the app's runs, newest first, strictly after ``after``."""
        _aware("created_after", created_after)
        _aware("created_before", created_before)
        after_at, after_id = _upper(after, created_before)
        params: dict[str, Any] = {
            "app": app,
            "state": state,
            "workflow": workflow,
            "queue": queue,
            "after_at": after_at,
            "after_id": after_id,
            "since": created_after or _BEGIN,
            "limit": max(0, limit),
        }
        query = (
            "page_runs_by_queue"
            if queue is not None
            else "page_runs_by_state"
            if state is not None
            else "page_runs_by_workflow"
            if workflow is not None
            else "page_runs"
        )
        found = self._transact(lambda cur: self._exec(cur, query, **params).fetchall(), single=True)
        return [self.read.run(r) for r in found]

    def page_children(
        self, run_id: str, *, after: pages.After | None = None, limit: int = 50
    ) -> list[port.Run]:
        """Return up to ``limit`` of the run's children, oldest first, strictly after ``after``."""
        params: dict[str, Any] = {
            "run_id": run_id,
            "after_at": after.created_at if after else _BEGIN,
            "after_id": after.run_id if after else "",
            "limit": max(0, limit),
        }
        found = self._transact(
            lambda cur: self._exec(cur, "page_children", **params).fetchall(), single=True
        )
        return [self.read.run(r) for r in found]

    def run_by_key(self, app: str, key: str) -> port.Run | None:
        """Return the app's run started under ``key``, or None."""
        row = self._transact(
            lambda cur: self._exec(cur, "run_by_key", app=app, key=key).fetchone(), single=True
        )
        return None if row is None else self.read.run(row)

    # -- access tokens --------------------------------------------------------

    def _token(self, row: rows.Row) -> tokens.Token:
        token_id = row["token_id"]
        scope = row["scope"]
        if scope not in tokens.SCOPES:
            raise rows.corrupt(None, "token_scope", f"token {token_id!r} has scope {scope!r}")
        for column in ("token_id", "app", "digest"):
            if not isinstance(row[column], str) or not row[column]:
                raise rows.corrupt(None, f"token_{column}", f"token {token_id!r}")

        def instant(column: str) -> datetime | None:
            if row[column] is None:
                return None
            return self.read.instant(row, column, "token")

        created = instant("created_at")
        if created is None:
            raise rows.corrupt(None, "token_created_at", f"token {token_id!r}")
        return tokens.Token(
            token_id=token_id,
            app=row["app"],
            scope=cast(tokens.Scope, scope),
            digest=row["digest"],
            created_at=created,
            expires_at=instant("expires_at"),
            revoked_at=instant("revoked_at"),
        )

    def create_token(self, new: tokens.NewToken) -> tokens.Token:
        """Store a new token; its ``created_at`` is the store's clock.

        Raises:
            errors.InvalidInput: a token with this id exists, or its scope is unknown.
        """
        if new.scope not in tokens.SCOPES:
            raise errors.InvalidInput(
                f"unknown scope {new.scope!r}; one of {', '.join(tokens.SCOPES)}"
            )
        params = {
            "token_id": new.token_id,
            "app": new.app,
            "scope": new.scope,
            "digest": new.digest,
            "expires_at": new.expires_at,
        }
        row = self._transact(lambda cur: self._exec(cur, "create_token", **params).fetchone())
        if row is None:
            raise errors.InvalidInput(f"a token with id {new.token_id!r} exists")
        return self._token(row)

    def get_token(self, token_id: str) -> tokens.Token | None:
        """Return the token (revoked and expired ones too), or None."""
        row = self._transact(
            lambda cur: self._exec(cur, "get_token", token_id=token_id).fetchone(), single=True
        )
        return None if row is None else self._token(row)

    def list_tokens(self, app: str | None = None) -> list[tokens.Token]:
        """Return the tokens (of ``app``, or of every app), oldest first."""
        found = self._transact(
            lambda cur: self._exec(cur, "list_tokens", app=app).fetchall(), single=True
        )
        return [self._token(r) for r in found]

    def revoke_token(self, token_id: str) -> tokens.Token | None:
        """Mark the token revoked (a second revoke keeps the first instant); None if unknown."""
        row = self._transact(
            lambda cur: self._exec(cur, "revoke_token", token_id=token_id).fetchone()
        )
        return None if row is None else self._token(row)

    def has_tokens(self, app: str) -> bool:
        """Whether ``app`` has a token that is neither revoked nor expired."""
        row = self._transact(
            lambda cur: self._exec(cur, "has_tokens", app=app).fetchone(), single=True
        )
        return bool(row is not None and row["found"])


class RetentionTransitions(transitions.Transitions[C]):
    """Pruning, written once over the adapters' named queries."""

    def prune(self, app: str, ended_before: datetime, limit: int = 500) -> int:
        """Delete up to ``limit`` of the app's runs that ended before ``ended_before``.

        Raises:
            errors.InvalidInput: ``limit`` below 1, or a naive ``ended_before``.
        """
        if limit < 1:
            raise errors.InvalidInput(f"limit must be at least 1, got {limit}")
        if ended_before.tzinfo is None or ended_before.utcoffset() is None:
            raise errors.InvalidInput("ended_before must be an aware datetime")

        def work(cur: C) -> int:
            picked: list[str] = []
            for state in retention.PRUNABLE_STATES:
                left = limit - len(picked)
                if left <= 0:
                    break
                params = {"app": app, "state": state, "before": ended_before, "limit": left}
                picked += [r["run_id"] for r in self._exec(cur, "prune_pick", **params)]
            if not picked:
                return 0
            gone = self._exec(cur, "prune_runs", run_ids=picked).fetchall()
            return len(gone)

        return self._transact(work)
