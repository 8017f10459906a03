"""The overhead benchmark runs end to end (a tiny configuration): its pacing of the side-by-side
children, its variants and its verdict lines. Its figures are not asserted: they are a benchmark's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_overhead_benchmark_runs_and_prints_its_verdict() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "overhead.py"), "--rounds", "2", "--blocks", "2",
                           "--block", "20"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("all_reduce of 16 floats") and "2 rounds x 2 blocks x 20 calls" in lines[0]
    assert any(line.startswith("per round, sync (us): A flightrec") for line in lines)
    assert any("torch reader" in line for line in lines)  # with it (and without, interleaved), or why not
    assert lines[-1].startswith("target: sync added <= 5.00 us -> A ")
    assert "PyTorch's recorder adds (A) -> sync " in lines[-1] and ", async " in lines[-1]


def test_startup_benchmark_finds_no_import_by_the_hook() -> None:
    """The start-up hook's benchmark runs; the hook, with FLIGHTREC unset, imported nothing of
    flightrec's or torch's (that part is a fact, not a timing)."""
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "startup.py"), "--starts", "2"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={k: v for k, v in os.environ.items() if k != "FLIGHTREC"})
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("start-up hook: ") and lines[0].endswith("flightrec.pth")
    assert "modules the hook imported: none" in lines
    assert any(line.startswith("target: no torch or flightrec import, under 1% of start-up -> ") for line in lines)
    # the command's own start-up is timed too (issue 23): one line per command, with its target
    timed = [line for line in lines if line.startswith("flightrec ")]
    assert [line.split(":")[0] for line in timed] == ["flightrec --help", "flightrec dump-now", "flightrec analyze (4 ranks)"]
    assert all(" s (" in line and "target < " in line for line in timed), timed
