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
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from perdure.store import port
from perdure.testing.environment import temporary_store

__all__ = ["FaultyStore", "temporary_store"]  # temporary_store: kept here for compatibility


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
            with self._lock:
                self.calls[name] = self.calls.get(name, 0) + 1
            for rule in self._take(name, "before"):
                rule.action(*args, **kwargs)
            for rule in self._take(name, "fail"):
                raise rule.action
            result = target(*args, **kwargs)
            for rule in self._take(name, "after"):
                rule.action(result, *args, **kwargs)
            return result

        return call
