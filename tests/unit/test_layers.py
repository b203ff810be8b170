"""The import arrows of CONVENTIONS.md: no module imports one from a higher layer.

Every module under ``src/perdure`` is parsed (imports inside functions and
under ``TYPE_CHECKING`` count too) and each ``perdure`` import is checked
against the table below. A module belongs to a group by its name; the
engine's groups are stacked in layers, and a module may import its own group
or a group of a lower layer, never a sibling group of its own layer nor
anything above. The store adapters stand to the side: ``perdure.store.*``
other than ``port`` and ``rows`` (with ``batches``) is adapter code, which
only ``perdure.store`` (``open_store``) and the test kit may import, and
which imports nothing of the engine.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

import perdure

SRC = Path(perdure.__file__).parent

# Engine and interfaces, lowest layer first; each layer maps group -> modules.
LAYERS: list[dict[str, set[str]]] = [
    {
        "base": {
            "perdure.errors",
            "perdure.records",
            "perdure.telemetry",
            "perdure.logs",
            "perdure.endings",
            "perdure.ready",
        }
    },
    {
        "port": {
            "perdure.store.port",
            "perdure.store.records",
            "perdure.store.tokens",
            "perdure.store.pages",
            "perdure.store.retention",
            "perdure.store.liveport",
            "perdure.store.scheduleport",
            "perdure.store.chainport",
            "perdure.store.controlport",
            "perdure.store.queueport",
            "perdure.store.ownerport",
            "perdure.store.planport",
            "perdure.store.warmport",
            "perdure.store.eagerport",
        }
    },
    {
        "values": {
            "perdure.codec",
            "perdure.payloads",
            "perdure.fernet",
            "perdure.effects",
            "perdure.journal",
            "perdure.bodyshape",
            "perdure.attempts",
            "perdure.live",
            "perdure.validation",
            "perdure.replay",
            "perdure.plans",
            "perdure.appplans",
            "perdure.clockwatch",
            "perdure.otel",
            "perdure.signals",
            "perdure.schedules",
            "perdure.chains",
        }
    },
    {
        "steps": {"perdure.steps", "perdure.dryrun"},
        "client": {
            "perdure.client",
            "perdure.reads",
            "perdure.liveclient",
            "perdure.planclient",
            "perdure.lineage",
            "perdure.handles",
            "perdure.repairs",
            "perdure.placement",
            "perdure.starts",
            "perdure.twins",
        },
    },
    {
        "context": {
            "perdure.context",
            "perdure.runtime",
            "perdure.children",
            "perdure.livecontext",
            "perdure.select",
        }
    },
    {"registry": {"perdure.registry"}},
    {
        "execution": {
            "perdure.execution",
            "perdure.host",
            "perdure.writebuffer",
            "perdure.childruns",
            "perdure.warmrun",
            "perdure.runcontrol",
            "perdure.settlement",
            "perdure.tasks",
            "perdure.warm",
        },
        "keeper": {"perdure.keeper"},
        "ownership": {"perdure.ownership"},
        "check": {"perdure.check"},
    },
    {
        "worker": {
            "perdure.worker",
            "perdure.shutdown",
            "perdure.renewal",
            "perdure.taskclaims",
            "perdure.warmslots",
            "perdure.eagerslots",
        }
    },
    {
        "app": {
            "perdure.app",
            "perdure.timetable",
            "perdure.queues",
            "perdure.appsteps",
            "perdure.appmigrations",
            "perdure.applive",
        }
    },
    {"demo": {"perdure.demo"}, "testing": {"perdure.testing"}},
    # The console command serves the web package: web sits below the command line.
    {"web": {"perdure.web"}},
    {"cli": {"perdure.cli"}},
    {"api": {"perdure", "perdure.__main__"}},
]
# Groups named by a package take its submodules too.
PACKAGES = {"perdure.cli", "perdure.web", "perdure.testing"}

# The store side: what each of its groups may import.
SIDE: dict[str, set[str]] = {
    "rows": {"base", "port"},
    "adapter": {"base", "port", "rows", "adapter"},
    "store": {"base", "port", "rows", "adapter"},  # open_store: the one place naming adapters
}
# Who, besides the store side, may import it: open_store from the app up (and
# the lease keeper, a process of its own that opens its store); the adapters
# themselves only from the test kit.
SIDE_IMPORTERS: dict[str, set[str]] = {
    "store": {"keeper", "app", "demo", "testing", "cli", "web", "api"},
    "rows": {"testing"},
    "adapter": {"testing"},
}

# Rows read into records, and records into query parameters: every adapter's, no adapter's own.
ROWS = {"perdure.store.rows", "perdure.store.batches"}

RANK = {group: rank for rank, layer in enumerate(LAYERS) for group in layer}


def group_of(module: str) -> str:
    """Return the group a module belongs to, by its name."""
    for layer in LAYERS:
        for group, names in layer.items():
            if module in names or any(module.startswith(f"{p}.") for p in names & PACKAGES):
                return group
    if module == "perdure.store":
        return "store"
    if module in ROWS:
        return "rows"
    if module.startswith("perdure.store."):
        return "adapter"
    raise AssertionError(f"{module} has no layer: add it to the table in {Path(__file__).name}")


def allowed(importer: str, imported: str) -> bool:
    """Whether a module of group ``importer`` may import one of group ``imported``."""
    if importer == imported:
        return True
    if importer in SIDE:
        return imported in SIDE[importer]
    if imported in SIDE:
        return importer in SIDE_IMPORTERS[imported]
    # Not above, and not a sibling of the same layer.
    return RANK[imported] < RANK[importer]


@dataclass(frozen=True)
class Arrow:
    module: str
    target: str
    line: int


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_module(name: str) -> bool:
    relative = Path(*name.split("."))
    return (SRC.parent / relative).is_dir() or (SRC.parent / relative).with_suffix(".py").exists()


def _arrows(path: Path) -> list[Arrow]:
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            # "from perdure.store import port" imports the module perdure.store.port;
            # "from perdure.store import open_store" imports from perdure.store.
            targets = [
                f"{base}.{alias.name}" if _is_module(f"{base}.{alias.name}") else base
                for alias in node.names
            ]
        else:
            continue
        found += [Arrow(module, t, node.lineno) for t in targets if t.split(".")[0] == "perdure"]
    return found


MODULES = sorted(SRC.rglob("*.py"))


def test_every_module_has_a_layer() -> None:
    for path in MODULES:
        group_of(_module_name(path))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: _module_name(p))
def test_imports_point_down(path: Path) -> None:
    wrong = [
        f"{a.module} ({group_of(a.module)}) imports {a.target} ({group_of(a.target)}), "
        f"line {a.line}"
        for a in _arrows(path)
        if not allowed(group_of(a.module), group_of(a.target))
    ]
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize(
    ("importer", "imported", "ok"),
    [
        ("app", "client", True),
        ("client", "app", False),
        ("cli", "client", True),
        ("cli", "app", True),
        ("steps", "context", False),
        ("context", "steps", True),
        ("client", "steps", False),
        ("context", "worker", False),
        ("context", "store", False),
        ("context", "adapter", False),
        ("worker", "adapter", False),
        ("worker", "execution", True),
        ("execution", "context", True),
        ("adapter", "port", True),
        ("adapter", "rows", True),
        ("adapter", "values", False),
        ("adapter", "client", False),
        ("port", "base", True),
        ("port", "values", False),
        ("store", "adapter", True),
        ("app", "store", True),
        ("client", "store", False),
        ("keeper", "store", True),
        ("worker", "keeper", True),
        ("keeper", "worker", False),
    ],
)
def test_the_table_draws_the_arrows_of_the_conventions(
    importer: str, imported: str, ok: bool
) -> None:
    assert allowed(importer, imported) is ok


def test_new_modules_land_in_their_layers() -> None:
    assert group_of("perdure.execution") == "execution"
    assert group_of("perdure.steps") == "steps"
    assert group_of("perdure.journal") == "values"
    assert group_of("perdure.plans") == "values"
    assert group_of("perdure.store.sqlite.store") == "adapter"
    assert group_of("perdure.store.postgres.connection") == "adapter"
    assert group_of("perdure.store.rows") == "rows"
    assert group_of("perdure.store.batches") == "rows"
    assert group_of("perdure.testing.conformance.claims") == "testing"
    assert group_of("perdure.cli.runs") == "cli"
