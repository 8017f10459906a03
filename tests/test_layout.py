"""The package layout stays acyclic: no module of `analyzers` or `flightrec` imports (even lazily,
inside a function) one that imports it back, directly or through others; and the analyzer's stages
import only stages before them (reading -> diagnosis -> timing -> reporting)."""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[1]
STAGES = ("reading", "diagnosis", "timing", "reporting")


def _imports(package: Path) -> nx.DiGraph:
    """Modules (dotted, relative to `package`) and the relative imports between them."""
    graph = nx.DiGraph()

    def module(parts: tuple[str, ...]) -> str | None:
        if not parts:
            return None
        path = package.joinpath(*parts)
        if path.with_suffix(".py").exists():
            return ".".join(parts)
        return None

    for path in package.rglob("*.py"):
        here = path.relative_to(package).with_suffix("").parts
        name = ".".join(p for p in here if p != "__init__") or "__init__"
        graph.add_node(name)
        pkg = here[:-1]
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom) or node.level == 0:
                continue
            base = pkg[:len(pkg) - (node.level - 1)] if node.level > 1 else pkg
            target = base + tuple(node.module.split(".")) if node.module else base
            found = module(target)
            if found is not None:
                graph.add_edge(name, found)
            else:  # `from . import x`: modules of that package
                for alias in node.names:
                    sub = module((*target, alias.name))
                    if sub is not None:
                        graph.add_edge(name, sub)
    return graph


@pytest.mark.parametrize("package", ["analyzers", "flightrec"])
def test_no_import_cycles(package: str) -> None:
    cycles = list(nx.simple_cycles(_imports(ROOT / package)))
    assert not cycles, f"{package}: import cycles {cycles}"


def test_the_analyzer_stages_import_only_earlier_stages() -> None:
    graph = _imports(ROOT / "analyzers")
    stage = {n: STAGES.index(n.split(".")[0]) for n in graph if n.split(".")[0] in STAGES}
    backwards = [(a, b) for a, b in graph.edges if a in stage and b in stage and stage[b] > stage[a]]
    assert not backwards, f"a stage imports a later one: {backwards}"
    assert {n.split(".")[0] for n in stage} == set(STAGES)
