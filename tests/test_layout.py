"""The package layout stays acyclic: no module of `analyzers` or `flightrec` imports (even lazily,
inside a function) one that imports it back, directly or through others; the analyzer's stages
import only stages before them (reading -> diagnosis -> timing -> reporting); the recorder's rooms
import only floors below them (format -> launch/settings -> record -> watch -> arming and the CLI),
an upward import being allowed only lazily and only where LAZY_UPWARD says why."""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[1]
STAGES = ("reading", "diagnosis", "timing", "reporting")
# The recorder's floors, lowest first: a module imports only its own floor and those below it.
FLOORS = (
    ("format",),  # torch-free: the dump's format and the facts it is read by
    ("launchers", "log", "settings", "identity"),  # what the launcher and the environment say
    ("record",),  # the hot path
    ("watch",),  # the watchdog and what it does
    ("arming", "cli", "_autostart", "__init__", "__main__"),  # what puts it all together
)
# Upward imports done lazily (inside a function), each with why it cannot be at the top of its module.
LAZY_UPWARD: dict[tuple[str, str], str] = {}


def _imports(package: Path) -> nx.DiGraph:
    """Modules (dotted, relative to `package`) and the relative imports between them; an edge's `lazy`
    says whether every import of it sits inside a function."""
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
        tree = ast.parse(path.read_text())
        eager = {id(n) for n in _module_level(tree)}
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom) or node.level == 0:
                continue
            lazy = id(node) not in eager
            base = pkg[:len(pkg) - (node.level - 1)] if node.level > 1 else pkg
            target = base + tuple(node.module.split(".")) if node.module else base
            found = module(target)
            targets = [found] if found is not None else [  # `from . import x`: modules of that package
                sub for alias in node.names if (sub := module((*target, alias.name))) is not None]
            for found in targets:
                was = graph.get_edge_data(name, found, {"lazy": True})["lazy"]
                graph.add_edge(name, found, lazy=was and lazy)
    return graph


def _module_level(tree: ast.Module) -> list[ast.stmt]:
    """The statements that run when the module is imported: its body, into `if`/`try` blocks, not functions."""
    out, todo = [], list(tree.body)
    while todo:
        node = todo.pop()
        out.append(node)
        if isinstance(node, (ast.If, ast.Try, ast.With)):
            todo += node.body + getattr(node, "orelse", []) + getattr(node, "finalbody", [])
            todo += [s for h in getattr(node, "handlers", []) for s in h.body]
    return out


def _floor(module: str) -> int:
    top = module.split(".")[0]
    return next(i for i, names in enumerate(FLOORS) if top in names)


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


def test_the_recorder_imports_only_its_own_floor_and_below() -> None:
    graph = _imports(ROOT / "flightrec")
    unplaced = sorted(n for n in graph if not any(n.split(".")[0] in names for names in FLOORS))
    assert not unplaced, f"modules on no floor (add them to FLOORS): {unplaced}"
    upward = {(a, b): lazy for a, b, lazy in graph.edges(data="lazy") if _floor(b) > _floor(a)}
    eager = sorted(edge for edge, lazy in upward.items() if not lazy)
    assert not eager, f"a module imports one on a higher floor at its top: {eager}"
    unexplained = sorted(edge for edge in upward if edge not in LAZY_UPWARD)
    assert not unexplained, f"a lazy upward import that LAZY_UPWARD does not explain: {unexplained}"
    stale = sorted(edge for edge in LAZY_UPWARD if edge not in upward)
    assert not stale, f"LAZY_UPWARD names imports that are gone: {stale}"


def test_the_format_is_torch_free_and_self_contained() -> None:
    """The analyzer, the fixtures and the tests import flightrec.format without torch or the recorder;
    numpy only inside the functions that the synthetic-job writer calls."""
    for path in sorted((ROOT / "flightrec" / "format").glob("*.py")):
        tree = ast.parse(path.read_text())
        top = {id(n) for n in _module_level(tree)}
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            names += [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
            banned = ("torch", "flightrec") + (("numpy", "pandas") if id(node) in top else ())
            assert not any(n.split(".")[0] in banned for n in names), f"{path.name} imports {names}"
            assert not (isinstance(node, ast.ImportFrom) and node.level > 1), f"{path.name} imports from above format/"
