"""The dump's `not_recorded` (what the recorder's torch release could not record) reaches the report."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import analyzers

GOLDEN = Path(__file__).resolve().parents[2] / "fixtures" / "golden" / "compute_hang"
LOSS = {"what": "cpp_op_detail", "why": "this torch has no flight recorder readable from Python"}


def _with_losses(folder: Path, ranks: set[int]) -> None:
    shutil.copytree(GOLDEN, folder)
    for path in folder.glob("rank-*.json.gz"):
        with gzip.open(path, "rt") as handle:
            dump = json.load(handle)
        dump["torch_version"] = "2.1.2"
        dump["not_recorded"] = [LOSS] if dump["rank"] in ranks else []
        with gzip.open(path, "wt") as handle:
            json.dump(dump, handle)


def test_losses_are_stated_once_with_their_ranks(tmp_path: Path) -> None:
    _with_losses(tmp_path / "job", {0, 1, 3})
    report = analyzers.load(str(tmp_path / "job")).report()
    notes = [g for g in report["gaps"] if g.startswith("not recorded with torch")]
    assert notes == [f"not recorded with torch 2.1.2: cpp_op_detail ({LOSS['why']}) (ranks 0-1, 3)"]
    assert report["verdict"] == "hang" and [c["rank"] for c in report["root_causes"]] == [2]


def test_no_losses_no_note(tmp_path: Path) -> None:
    _with_losses(tmp_path / "job", set())
    report = analyzers.load(str(tmp_path / "job")).report()
    assert not [g for g in report["gaps"] if g.startswith("not recorded")]
