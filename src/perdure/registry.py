"""What a worker needs to know about an app's workflows: their definitions and lookup."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class WorkflowDef:
    """A registered workflow."""

    name: str
    version: str
    fn: Callable[..., Any]
    is_async: bool
    params: dict[str, Any]
    returns: Any


class Registry(Protocol):
    """What the worker needs from the app."""

    name: str
    max_failures: int

    def workflow_def(self, name: str) -> WorkflowDef | None: ...

    def workflow_versions(self) -> list[tuple[str, str]]: ...

    def workflow_ref(self, workflow: Any) -> tuple[str, str, Any]: ...
