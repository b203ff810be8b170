"""A store wrapper that injects faults (``temporary_store`` now lives in ``perdure.testing``).

Wrap the real store rather than faking one, so that every operation keeps the
real adapter's guarantees and only the injected moment differs::

    from perdure.testing import faults

    store = faults.FaultyStore(perdure.store.open_store("sqlite:///t.db"))
    store.fail("finish_step", perdure.StoreUnavailable("disk gone"), times=2)
    store.before("park", lambda *args, **kwargs: reached.set())
    app = perdure.App(store, name="shop")   # an App takes a store object too

A rule fires on the named operation's next calls (``times`` of them, or every
call with ``times=None``); ``before`` hooks run before the real operation,
``after`` hooks receive its result, and ``fail`` raises instead of calling it.

Writes are counted too: every call of a mutating operation (:data:`WRITES`)
gets the next number from 1, in ``store.writes`` (the names, in order), and
``at_write(k, when, action)`` runs ``action(operation)`` right before the
``k``-th write or right after it committed, whatever the operation is. The
crash-point explorer (``perdure.testing.chaos``) crashes a process there.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from perdure.store import port
from perdure.testing.environment import temporary_store

__all__ = ["WRITES", "FaultyStore", "temporary_store"]  # temporary_store: kept for compatibility

WRITES: frozenset[str] = frozenset(
    {
        # port.Store
        "create_run",
        "create_children",
        "claim",
        "renew",
        "release",
        "begin_effect",
        "finish_step",
        "transaction_step",
        "park",
        "finish",
        "settle_wait",
        "wake",
        "send",
        "request_cancel",
        "resolve",
        "sweep",
        # the live-run, token and retention sections of the port
        "deliver_update",
        "answer_update",
        "record_live",
        "create_token",
        "revoke_token",
        "prune",
        # suspending runs and run deadlines
        "suspend",
        "unsuspend",
        "let_go",
        "expire_deadlines",
        # the chain section
        "continue_run",
    }
)
"""The store operations that may change what is stored (``migrate`` aside)."""

WriteAction = Callable[[str], None]


@dataclass
class _Rule:
    when: str  # "before" | "after" | "fail"
    action: Any
    times: int | None


class FaultyStore:
    """A :class:`port.Store` that delegates to ``inner``, with injected faults."""

    def __init__(self, inner: port.Store) -> None:
        self.inner = inner
        self.url = inner.url
        self.calls: dict[str, int] = {}
        self.writes: list[str] = []
        self._sites: dict[tuple[int, str], WriteAction] = {}
        self._rules: dict[str, list[_Rule]] = {}
        self._lock = threading.Lock()

    def fail(self, operation: str, error: BaseException, *, times: int | None = 1) -> None:
        """Raise ``error`` instead of running ``operation`` (its next ``times`` calls)."""
        self._add(operation, _Rule("fail", error, times))

    def before(self, operation: str, hook: Callable[..., None], *, times: int | None = 1) -> None:
        """Call ``hook(*args, **kwargs)`` before ``operation`` runs."""
        self._add(operation, _Rule("before", hook, times))

    def after(self, operation: str, hook: Callable[..., None], *, times: int | None = 1) -> None:
        """Call ``hook(result, *args, **kwargs)`` after ``operation`` returned."""
        self._add(operation, _Rule("after", hook, times))

    def at_write(self, k: int, when: str, action: WriteAction) -> None:
        """Call ``action(operation)`` right ``before`` the ``k``-th write or right ``after`` it.

        ``after`` runs once the write has returned (committed) and its
        ``after`` hooks ran; an exception that ``action`` raises reaches the
        caller in place of the result.
        """
        if k < 1 or when not in ("before", "after"):
            raise ValueError(f"a write site is k >= 1 and before|after, got {k} {when!r}")
        with self._lock:
            self._sites[(k, when)] = action

    def clear(self) -> None:
        """Drop every rule that has not fired yet."""
        with self._lock:
            self._rules.clear()

    def _add(self, operation: str, rule: _Rule) -> None:
        if not callable(getattr(self.inner, operation, None)):
            raise ValueError(f"the store has no operation {operation!r}")
        with self._lock:
            self._rules.setdefault(operation, []).append(rule)

    def _take(self, operation: str, when: str) -> list[_Rule]:
        with self._lock:
            taken = []
            for rule in self._rules.get(operation, []):
                if rule.when != when:
                    continue
                taken.append(rule)
                if rule.times is not None:
                    rule.times -= 1
            self._rules[operation] = [
                r for r in self._rules.get(operation, []) if r.times is None or r.times > 0
            ]
            return taken

    def __getattr__(self, name: str) -> Any:
        target = getattr(self.inner, name)
        if not callable(target) or name.startswith("_"):
            return target

        def call(*args: Any, **kwargs: Any) -> Any:
            before = after = None
            with self._lock:
                self.calls[name] = self.calls.get(name, 0) + 1
                if name in WRITES:
                    self.writes.append(name)
                    k = len(self.writes)
                    before, after = self._sites.get((k, "before")), self._sites.get((k, "after"))
            if before is not None:
                before(name)
            for rule in self._take(name, "before"):
                rule.action(*args, **kwargs)
            for rule in self._take(name, "fail"):
                raise rule.action
            result = target(*args, **kwargs)
            for rule in self._take(name, "after"):
                rule.action(result, *args, **kwargs)
            if after is not None:
                after(name)
            return result

        return call
