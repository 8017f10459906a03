"""notebooks/postmortem.ipynb runs top to bottom against fixture dumps (nbclient, a real kernel)."""

from __future__ import annotations

import nbformat
import pytest
from nbclient import NotebookClient

import analyzers

from .conftest import GOLDEN, ROOT

NOTEBOOK = ROOT / "notebooks" / "postmortem.ipynb"


def _load() -> nbformat.NotebookNode:
    return nbformat.read(NOTEBOOK, as_version=4)


def test_committed_without_outputs():
    nb = _load()
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.outputs and c.execution_count is None for c in code)
    params = [c for c in code if "parameters" in c.metadata.get("tags", [])]
    assert len(params) == 1 and params[0].source.startswith("DUMP_DIR = ")


@pytest.mark.parametrize("fixture", [None, "torch_fr_gloo_json", "straggler_20"])
def test_runs_against_fixture_dumps(fixture):
    nb = _load()
    if fixture is not None:  # None: the folder the parameter cell names by default
        cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
        cell.source = f"DUMP_DIR = {str(GOLDEN / fixture)!r}"
    NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    summary = analyzers.load(GOLDEN / (fixture or "compute_hang")).summary()
    assert summary in text
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) == 5  # wait graph, timeline, lateness, step times, slow links
