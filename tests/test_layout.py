"""The package layout stays acyclic: no module of `analyzers` or `flightrec` imports (even lazily,
inside a function) one that imports it back, directly or through others."""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[1]


def _imports(package: Path) -> nx.DiGraph:
    graph = nx.DiGraph()
    for path in package.glob("*.py"):
        graph.add_node(path.stem)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                targets = [node.module.split(".")[0]] if node.module else [a.name for a in node.names]
                graph.add_edges_from((path.stem, t) for t in targets if (package / f"{t}.py").exists())
    return graph


@pytest.mark.parametrize("package", ["analyzers", "flightrec"])
def test_no_import_cycles(package: str) -> None:
    cycles = list(nx.simple_cycles(_imports(ROOT / package)))
    assert not cycles, f"{package}: import cycles {cycles}"
