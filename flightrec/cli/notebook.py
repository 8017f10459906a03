"""`flightrec notebook DIR`: a copy of the post-mortem notebook whose dump folder is DIR.

The notebook (notebooks/postmortem.ipynb; inside the wheel flightrec/notebooks/postmortem.ipynb)
takes its folder from its one code cell tagged `parameters` (`DUMP_DIR = ...`, the papermill
convention: `papermill postmortem.ipynb out.ipynb -p DUMP_DIR DIR` works too). This writes a copy
with that cell set, so nobody edits the shipped file; plain JSON, no Jupyter package needed here.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from . import components

PARAMETER = "DUMP_DIR"
PARAMETERS_TAG = "parameters"


class NotebookError(ValueError):
    """A folder, output file or notebook this command cannot use; the message names it."""


def _parameters_cell(notebook: dict[str, Any], source: Path) -> dict[str, Any]:
    cells = [c for c in notebook.get("cells", []) if c.get("cell_type") == "code"
             and PARAMETERS_TAG in (c.get("metadata", {}).get("tags") or [])]
    if len(cells) != 1:
        raise NotebookError(f"{source} has {len(cells)} code cells tagged {PARAMETERS_TAG!r}, expected one")
    return cells[0]


def folder_value(folder: str) -> str:
    """What DUMP_DIR is set to: an fsspec URL as given, a local folder as an absolute path (the copy
    may be opened from anywhere). Raises NotebookError when a local `folder` is not a folder."""
    if "://" in folder:
        return folder
    local = Path(folder).expanduser()
    if not local.is_dir():
        raise NotebookError(f"{folder} is not a folder: give the folder the job dumped into (its FLIGHTREC_DIR)")
    return str(local.resolve())


def with_folder(notebook: dict[str, Any], folder: str, source: Path) -> dict[str, Any]:
    """`notebook` with its parameters cell set to `folder` and no outputs (changed in place, returned)."""
    cell = _parameters_cell(notebook, source)
    cell["source"] = f"{PARAMETER} = {folder!r}  # parameter: the dump folder to analyze"
    cell["outputs"], cell["execution_count"] = [], None
    return notebook


def write(folder: str, out: Path, force: bool = False) -> Path:
    """Write the notebook for `folder` to `out`; raises NotebookError (nothing written) on bad input."""
    value = folder_value(folder)
    if out.exists() and (not force or out.is_dir()):
        raise NotebookError(f"{out} exists; choose another --out" + ("" if out.is_dir() else " or pass --force"))
    source = components.path("notebooks/postmortem.ipynb")
    try:
        notebook = json.loads(source.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise NotebookError(f"cannot read the shipped notebook {source}: {exc}") from exc
    text = json.dumps(with_folder(notebook, value, source), indent=1) + "\n"
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, out)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise NotebookError(f"cannot write {out}: {exc}") from exc
    return out
