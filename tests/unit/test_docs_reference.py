"""The API reference pages document every public name (the site build catches the rest)."""

from __future__ import annotations

import re
from pathlib import Path

import perdure
import perdure.testing

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "reference"


def documented(page: str, package: str) -> set[str]:
    text = (REFERENCE / page).read_text(encoding="utf-8")
    return set(re.findall(rf"^::: {re.escape(package)}\.(\w+)$", text, re.M))


def test_every_name_perdure_exports_has_a_reference_entry() -> None:
    shown = documented("api.md", "perdure") | documented("errors.md", "perdure")
    assert shown - {"errors"} == set(perdure.__all__)


def test_every_name_perdure_testing_exports_has_a_reference_entry() -> None:
    assert documented("testing.md", "perdure.testing") == set(perdure.testing.__all__)
