"""Every module stays small enough to hold one concept (CONVENTIONS.md: under ~600 lines).

A module that grows past the bound is split by concept (a mixin beside it, a
port section, a typed body of its own), not trimmed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import perdure

SRC = Path(perdure.__file__).parent
BOUND = 600


@pytest.mark.parametrize(
    "path", sorted(SRC.rglob("*.py")), ids=lambda p: str(p.relative_to(SRC.parent))
)
def test_a_module_is_under_the_bound(path: Path) -> None:
    lines = len(path.read_text(encoding="utf-8").splitlines())
    name = str(path.relative_to(SRC.parent))
    assert lines <= BOUND, f"{name} has {lines} lines (bound {BOUND}): split it by concept"
