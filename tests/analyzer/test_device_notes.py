"""The report says when device times are missing because ops were captured into CUDA graphs."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import analyzers
from analyzers.reading.read_flightrec import NOTE_GRAPHS

from .conftest import GOLDEN


def test_graph_captured_ops_are_named_in_the_gaps(tmp_path: Path) -> None:
    folder = tmp_path / "job"
    shutil.copytree(GOLDEN / "compute_hang", folder)
    path = folder / "rank-00001.json.gz"
    dump = json.loads(gzip.decompress(path.read_bytes()))
    dump["graph_captured_ops"] = 3
    path.write_bytes(gzip.compress(json.dumps(dump).encode()))
    gaps = analyzers.load(folder).report()["gaps"]
    assert f"{NOTE_GRAPHS} (ranks 1)" in gaps
    clean = analyzers.load(GOLDEN / "compute_hang").report()["gaps"]
    assert not any("CUDA graphs" in g for g in clean)
