"""Imports point down the layers only (docs/design.md, Layers): a module never imports a higher layer.

Why a test: a layer rule kept by review alone erodes one convenient import at a time, and each such
import makes the lower layer untestable without the higher one (a policy that needs a WorkerSet). The walk
reads every module under elastic/ with `ast`, function-level imports included, so a lazy import inside a
function cannot hide a dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "elastic"

# Top to bottom. A unit is a subpackage (or a top-level module) of `elastic`; units on one line share a layer
# and may import each other.
LAYERS: list[set[str]] = [
    {"cli"},  # the command line: parse, call, print
    {"controller"},  # reconcile (pure) and its executors: local and Kubernetes managers, machinery/
    {"agent"},  # `elastic agent`: torchrun's launcher with our agent, restart or in-place
    {"inplace"},  # the in-place agent: torch's agent loop around rendezvous and train
    {"train"},  # what a training script imports: its round, its peers' state, its progress
    {"cluster", "rendezvous"},  # where workers run; the round protocol and torch's rendezvous handler
    {"codec"},  # the one typed decoder of every value read from etcd
    {"policy"},  # pure decisions: exits, budget, success, bounds, deadlines
    {"store"},  # etcd: client, leases, watches, the key layout
    {"spec"},  # the ElasticJob model, its defaults and validation
    {"errors"},  # the error hierarchy every layer raises
]

RANK = {unit: rank for rank, units in enumerate(LAYERS) for unit in units}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def unit_of(module: str) -> str | None:
    """The layer unit of `elastic.x.y` (x), or None for `elastic` itself and for other packages."""
    parts = module.split(".")
    return parts[1] if parts[0] == "elastic" and len(parts) > 1 else None


def imported_modules(path: Path) -> list[str]:
    """Every module `path` imports, at any depth of its code, relative imports resolved."""
    module = module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                found.append(f"{base}.{node.module}" if node.module else base)
            elif node.module:
                found.append(node.module)
    return found


MODULES = sorted(PACKAGE.rglob("*.py"))


def test_every_unit_has_a_layer() -> None:
    units = {unit_of(module_name(path)) for path in MODULES} - {None}
    assert units <= set(RANK), f"add {sorted(units - set(RANK))} to LAYERS"


@pytest.mark.parametrize("path", MODULES, ids=lambda path: module_name(path))
def test_module_imports_point_down(path: Path) -> None:
    module = module_name(path)
    unit = unit_of(module)
    if unit is None:
        return
    upward = [
        target
        for target in imported_modules(path)
        if (target_unit := unit_of(target)) in RANK
        and RANK[target_unit] < RANK[unit]
    ]
    assert not upward, f"{module} ({unit}) imports a higher layer: {upward}"
