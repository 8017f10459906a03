"""`flightrec demo --out DIR` never deletes what it did not write (issue 19, point 8).

The job itself is replaced by a fake `launch` of the demo's launcher (fixtures/launch.py, loaded by
flightrec.cli.components.demo_launcher) that copies a recorded 4-rank hang (fixtures/golden/compute_hang) into
the folder: what is tested here is the folder handling.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from fixtures.launch import JobResult
from flightrec.cli import components
from flightrec.cli.commands import main
from flightrec.cli.demo import MARKER

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "fixtures" / "golden" / "compute_hang"


@pytest.fixture
def fake_launch(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Replace the real job (~15 s) by copying a recorded one; returns the folders it was run into."""
    runs: list[Path] = []

    def launch(script: Any, nproc: int, out: Any, *args: Any, **kwargs: Any) -> JobResult:
        out = Path(out)
        runs.append(out)
        (out / ".job.log").write_text("fake torchrun log\n")
        for p in sorted(GOLDEN.iterdir()):
            shutil.copy(p, out / p.name)
        return JobResult(0, False, sorted(out.glob("rank-*.json.gz")), "", 0.1)

    monkeypatch.setattr(components.demo_launcher(), "launch", launch)
    return runs


def _demo(out: Path) -> Any:
    return CliRunner().invoke(main, ["demo", "--out", str(out)])


def test_demo_refuses_a_folder_with_other_files(tmp_path: Path, fake_launch: list[Path]) -> None:
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("precious")
    (out / "sub").mkdir()
    (out / "sub" / "data.bin").write_bytes(b"x")
    result = _demo(out)
    assert result.exit_code != 0
    assert "did not write" in result.output and "notes.txt" in result.output and "nothing was deleted" in result.output
    assert (out / "notes.txt").read_text() == "precious" and (out / "sub" / "data.bin").exists()
    assert fake_launch == []  # no job was started


def test_demo_refuses_a_real_jobs_dumps(tmp_path: Path, fake_launch: list[Path]) -> None:
    out = tmp_path / "flightrec_dir"
    out.mkdir()
    for p in GOLDEN.iterdir():
        shutil.copy(p, out / p.name)  # a real job's FLIGHTREC_DIR: dump names only, no demo marker
    before = sorted(p.name for p in out.iterdir())
    result = _demo(out)
    assert result.exit_code != 0 and MARKER in result.output, result.output
    assert sorted(p.name for p in out.iterdir()) == before
    assert fake_launch == []


def test_demo_runs_in_a_new_folder_and_reruns_over_its_own_files(tmp_path: Path, fake_launch: list[Path]) -> None:
    out = tmp_path / "new" / "demo"
    result = _demo(out)
    assert result.exit_code == 0, result.output
    assert "HANG: rank 2 never reached all_reduce" in result.output  # the (recorded) job was analysed
    assert (out / MARKER).is_file() and len(list(out.glob("rank-*.json.gz"))) == 4
    (out / "rank-00007.json.gz").write_bytes((out / "rank-00003.json.gz").read_bytes())  # an earlier, bigger run's
    (out / ".rank-00001.json.gz.123.tmp").write_bytes(b"half")
    result = _demo(out)
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.glob("rank-*")) == [f"rank-0000{r}.json.gz" for r in range(4)]
    assert not (out / ".rank-00001.json.gz.123.tmp").exists()
    assert fake_launch == [out, out]


def test_demo_accepts_an_empty_folder(tmp_path: Path, fake_launch: list[Path]) -> None:
    result = _demo(tmp_path)
    assert result.exit_code == 0, result.output
    assert tmp_path.exists() and (tmp_path / MARKER).is_file()


def test_demo_without_the_analyzers_dependencies_says_what_to_install(
    tmp_path: Path, fake_launch: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "networkx", None)  # as if `flightrec[analyze]` were not installed
    result = _demo(tmp_path / "demo")
    assert result.exit_code == 0, result.output  # the job ran and dumped; only the analysis is left out
    assert "networkx" in result.output and "pip install 'flightrec[analyze]'" in result.output, result.output
    assert f"flightrec analyze {tmp_path / 'demo'}" in result.output
