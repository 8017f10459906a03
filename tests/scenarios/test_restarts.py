"""A torchelastic restart: attempt 0 fails, torchrun (`--max_restarts 1`) starts attempt 1, which completes.

Both attempts' dumps stay side by side; the analyzer reads the latest attempt unless told otherwise.
Attempt 1 runs with FLIGHTREC_ON_HANG=abort and a 3 s timeout for longer than that timeout: a healthy
job is never ended. One real torchrun gloo job, bounded by `launch`, which kills all of it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import analyzers
from fixtures.launch import launch
from tests.helpers import read_dump

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "fixtures" / "jobs" / "restarts.py"
RANKS = 4


def test_restart_attempts_keep_their_dumps_and_the_latest_is_analysed(tmp_path: Path) -> None:
    out = tmp_path / "dumps"
    # 9 steps of 0.4 s outlast the 3 s timeout; each op waits up to 0.3 s for the slowest rank (with a 1 s
    # timeout, a loaded 2-core CI machine once made that 1.1 s and ended the healthy attempt)
    result = launch(JOB, RANKS, out, ["--fail-rank", "1", "--steps", "9", "--step-sleep", "0.4"], max_restarts=1,
                    timeout_s=120, env={"FLIGHTREC_TIMEOUT": "3", "FLIGHTREC_ON_HANG": "abort",
                                        "FLIGHTREC_ABORT_GRACE_S": "1"})
    assert not result.timed_out and not result.stopped, result.output[-3000:]
    assert result.returncode == 0, result.output[-3000:]  # attempt 1 completed: nothing aborted it
    assert "injected failure of restart attempt 0" in result.output and "aborting" not in result.output
    names = sorted(p.name for p in out.glob("rank-*"))
    assert names == sorted([f"rank-{r:05d}.json.gz" for r in range(RANKS)]
                           + [f"rank-{r:05d}.attempt-1.json.gz" for r in range(RANKS)]), names
    first = {r: read_dump(str(out / f"rank-{r:05d}.json.gz")) for r in range(RANKS)}
    second = {r: read_dump(str(out / f"rank-{r:05d}.attempt-1.json.gz")) for r in range(RANKS)}
    assert {d["attempt"] for d in first.values()} == {0} and {d["attempt"] for d in second.values()} == {1}
    assert first[1]["reason"] == "exception" and {d["reason"] for d in second.values()} == {"exit"}

    latest = analyzers.load(str(out)).report()
    assert latest["attempts"] == {"analysed": 1, "others": [
        {"attempt": 0, "ranks": list(range(RANKS)), "files": [f"rank-{r:05d}.json.gz" for r in range(RANKS)]}]}
    assert latest["verdict"] == "healthy" and latest["ranks"]["dumped"] == list(range(RANKS)), latest["summary"]
    assert latest["jobs"]["ignored"] == []  # a restart is not "another job"

    run = subprocess.run([sys.executable, "-m", "flightrec", "analyze", str(out), "--attempt", "0", "--format", "json"],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-3000:]
    earlier = json.loads(run.stdout)
    assert earlier["attempts"]["analysed"] == 0 and [o["attempt"] for o in earlier["attempts"]["others"]] == [1]
    assert earlier["verdict"] == "crash" and [c["rank"] for c in earlier["root_causes"]] == [1], earlier["summary"]
    text = subprocess.run([sys.executable, "-m", "flightrec", "analyze", str(out)], capture_output=True, text=True,
                          timeout=120, cwd=ROOT).stdout
    assert ("warning: dumps of other torchelastic restart attempts are here too (attempt 0: rank(s) 0-3); "
            "this report is of attempt 1") in text, text[:2000]
