"""The error tree drawn in ``perdure.errors``' docstring is the tree of its classes."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import perdure
from perdure import errors

# "    │   ├── InvalidPayload        invalid_payload   (note)"
DRAWN = re.compile(r"^(?P<indent>[\s│├└─]*?)(?P<name>[A-Z]\w+)(?: \([^)]*\))?\s+(?P<code>\S+)")
CLI = Path(perdure.__file__).parent / "cli"


def _drawn() -> dict[str, tuple[str | None, str]]:
    """Return {class name: (drawn parent, drawn code)} from the docstring's tree."""
    doc = errors.__doc__ or ""
    drawing = doc.split("::", 1)[1].splitlines()[1:]
    found: dict[str, tuple[str | None, str]] = {}
    parents: list[tuple[int, str]] = []
    for line in drawing:
        if line and not line[0].isspace():
            break  # the paragraph after the drawing
        if not line.strip():
            continue
        match = DRAWN.match(line)
        assert match, line
        depth = len(match["indent"])
        while parents and parents[-1][0] >= depth:
            parents.pop()
        found[match["name"]] = (parents[-1][1] if parents else None, match["code"])
        parents.append((depth, match["name"]))
    return found


def test_the_docstring_draws_every_error_with_its_parent_and_code() -> None:
    drawn = _drawn()
    assert set(drawn) == set(errors.__all__)
    for name, (parent, code) in drawn.items():
        cls = getattr(errors, name)
        public = [b.__name__ for b in cls.__mro__[1:] if b.__name__ in errors.__all__]
        assert (public[0] if public else None) == parent, name
        if name != "RunFailed":  # drawn with the run's own code
            assert code == cls.code, name


def test_every_code_the_command_line_prints_is_an_error_class() -> None:
    """The CLI reports failures only through errors; it spells no code of its own."""
    for path in CLI.glob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "Fail":
                first = node.args[0] if node.args else None
                assert not isinstance(first, ast.Constant), f"{path.name}:{node.lineno}"
