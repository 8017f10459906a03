"""notebooks/postmortem.ipynb runs top to bottom against fixture dumps (nbclient, a real kernel), and so
does the copy `flightrec notebook DIR` writes, against DIR."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import nbformat
import pytest
from click.testing import CliRunner
from nbclient import NotebookClient

import analyzers
from flightrec.cli.commands import main

from .conftest import GOLDEN, ROOT

NOTEBOOK = ROOT / "notebooks" / "postmortem.ipynb"


@pytest.fixture(autouse=True)
def _kernel_imports_this_checkout(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel imports flightrec (and through it the analyzer) from this checkout, installed or not."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))


def _execute(nb: nbformat.NotebookNode, cwd: Path) -> tuple[str, int]:
    """Run every cell in a kernel whose working folder is `cwd`; the printed text and the number of images."""
    NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(cwd)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    return text, len([o for o in outputs if "image/png" in o.get("data", {})])


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
    text, images = _execute(nb, NOTEBOOK.parent)
    summary = analyzers.load(GOLDEN / (fixture or "compute_hang")).summary()
    assert summary in text
    assert images == 5  # wait graph, timeline, lateness, step times, slow links


def test_flightrec_notebook_writes_a_copy_that_runs_against_its_folder(tmp_path: Path) -> None:
    dumps = tmp_path / "job 42" / "dumps"  # not the default folder, and a name that needs quoting
    shutil.copytree(GOLDEN / "straggler_20", dumps)
    out = tmp_path / "elsewhere" / "pm.ipynb"
    out.parent.mkdir()
    result = CliRunner().invoke(main, ["notebook", str(dumps), "--out", str(out)])
    assert result.exit_code == 0, result.output
    nb = nbformat.read(out, as_version=4)
    nbformat.validate(nb)
    assert len(nb.cells) == len(_load().cells)
    text, images = _execute(nb, out.parent)  # run from its own folder: the shipped default would not resolve there
    assert analyzers.load(dumps).summary() in text
    assert analyzers.load(GOLDEN / "compute_hang").summary() not in text
    assert images == 5


def test_flightrec_notebook_refuses_bad_input(tmp_path: Path) -> None:
    out = tmp_path / "pm.ipynb"
    result = CliRunner().invoke(main, ["notebook", str(tmp_path / "missing"), "--out", str(out)])
    assert result.exit_code != 0 and str(tmp_path / "missing") in result.output and "not a folder" in result.output
    assert not out.exists()
    out.write_text("mine")
    result = CliRunner().invoke(main, ["notebook", str(GOLDEN / "crash"), "--out", str(out)])
    assert result.exit_code != 0 and str(out) in result.output and "--force" in result.output
    assert out.read_text() == "mine"
    result = CliRunner().invoke(main, ["notebook", str(GOLDEN / "crash"), "--out", str(out), "--force"])
    assert result.exit_code == 0, result.output
    cell = next(c for c in nbformat.read(out, as_version=4).cells if "parameters" in c.metadata.get("tags", []))
    assert cell.source.startswith(f"DUMP_DIR = {str(GOLDEN / 'crash')!r}")
