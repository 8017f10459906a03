"""The held-GIL watch: faulthandler's C timer, re-armed by the watchdog thread (flightrec/watch/gil_watch.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from fixtures.launch import free_port
from flightrec.watch.gil_watch import LONGEST_LIMIT_S, limit_for, stacks_filename

ROOT = Path(__file__).resolve().parents[2]


def test_stacks_file_is_named_after_the_dump() -> None:
    assert stacks_filename("rank-00002.json.gz") == "rank-00002.stacks.txt"
    assert stacks_filename("rank-00002.attempt-1.json.gz") == "rank-00002.attempt-1.stacks.txt"


def test_limit_follows_the_timeout_within_bounds() -> None:
    assert limit_for(5.0, 0.2) == 5.0
    assert limit_for(2.0, 0.2) == 3.0  # a short timeout (tests) does not make a loaded host's hiccup a stacks file
    assert limit_for(300.0, 0.5) == LONGEST_LIMIT_S
    assert limit_for(0.1, 0.05) == 3.0  # never so short that an ordinary tick's work trips it


def test_job_timer_fork_and_disable(tmp_path: Path) -> None:
    """A job's own dump_traceback_later wins; a forked child can use faulthandler; a held GIL is written
    down right after a fork; disable() cancels the timer and gives faulthandler back; an unused file goes."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLIGHTREC", "TORCHELASTIC"))}
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, str(ROOT / "tests" / "recorder" / "gil_worker.py"), str(tmp_path / "a"),
                          str(tmp_path / "b"), str(free_port())], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0 and "OK" in out.stdout, out.stdout[-3000:] + out.stderr[-3000:]
