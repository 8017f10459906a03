"""FLIGHTREC_SNAPSHOT_S: a running torchrun job's dumps, rewritten every second, are analysed while it
runs and after it was killed: `slow` with the slow rank named, never `hang` (issue 22)."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import analyzers
from fixtures.launch import descendants, free_port, stop_job
from flightrec.format.names import dump_filename

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ROOT / "fixtures" / "jobs" / "train.py"


def _snapshots(out: Path, world: int) -> list[dict]:
    found = []
    for rank in range(world):
        try:
            with gzip.open(out / dump_filename(rank), "rt") as handle:
                found.append(json.load(handle))
        except (OSError, EOFError, ValueError):  # not written yet
            return []
    return found


def test_snapshots_of_a_running_job_say_slow_never_hang(tmp_path: Path) -> None:
    out, copy = tmp_path / "dumps", tmp_path / "copy"
    out.mkdir()
    env = {**os.environ, "FLIGHTREC": "1", "FLIGHTREC_DIR": str(out), "FLIGHTREC_SNAPSHOT_S": "1",
           "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "4", "--master_addr", "127.0.0.1",
               "--master_port", str(free_port()), "--max_restarts", "0", str(TRAIN),
               "--steps", "2000", "--step-ms", "20", "--slow-rank", "1", "--slow-pct", "25"]
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 60
        dumps: list[dict] = []
        while time.monotonic() < deadline and proc.poll() is None:  # snapshots of ~4 s of training
            workers = sorted(set(workers) | set(descendants(proc.pid)))
            dumps = _snapshots(out, 4)
            if dumps and all(d["reason"] == "snapshot" and d["recorded"] >= 150 for d in dumps):
                break
            time.sleep(0.2)
        assert proc.poll() is None and dumps, "the job ended or wrote no snapshots in time"
        shutil.copytree(out, copy)  # each file is complete: a snapshot is written aside, then renamed
        running = analyzers.load(copy).report()
    finally:
        stop_job(proc, workers)  # SIGKILL: no exit dump, the last snapshots stay
    killed = analyzers.load(out).report()
    for report in (running, killed):
        assert report["verdict"] == "slow", report["summary"]
        assert [s["rank"] for s in report["stragglers"]][:1] == [1], report["stragglers"]
    assert all(d["settings"]["snapshot_s"] == 1 for d in _snapshots(out, 4))


def test_snapshots_go_on_after_a_dump_now(tmp_path: Path) -> None:
    """`flightrec dump-now` is a snapshot taken by hand: the periodic snapshots replace it and go on, and
    the analysis of the running job says how old each rank's evidence is."""
    out = tmp_path / "dumps"
    out.mkdir()
    env = {**os.environ, "FLIGHTREC": "1", "FLIGHTREC_DIR": str(out), "FLIGHTREC_SNAPSHOT_S": "1s",
           "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
               "--master_port", str(free_port()), "--max_restarts", "0", str(TRAIN), "--steps", "3000", "--step-ms", "10"]
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
    workers: list[int] = []

    def wait_for(ok, within_s: float) -> list[dict]:
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline and proc.poll() is None:
            workers[:] = sorted(set(workers) | set(descendants(proc.pid)))
            dumps = _snapshots(out, 2)
            if dumps and ok(dumps):
                return dumps
            time.sleep(0.2)
        return []

    try:
        assert wait_for(lambda ds: all(d["reason"] == "snapshot" for d in ds), 60), "no snapshots in time"
        asked = subprocess.run([sys.executable, "-m", "flightrec", "dump-now", str(out), "--wait", "10"], env=env,
                               capture_output=True, text=True, timeout=60)
        assert asked.returncode == 0 and "answered" in asked.stdout, asked.stdout + asked.stderr
        time.sleep(2.0)  # every rank has polled the request by now (a watchdog tick is well under that)
        since = time.time_ns()  # snapshots written from here on came after the dump-now's dumps
        later = wait_for(lambda ds: all(d["reason"] == "snapshot" and d["dump_time_ns"] > since for d in ds), 15)
        assert later, "no snapshot was written after the dump-now"
        report = analyzers.load(out).report()
    finally:
        stop_job(proc, workers)
    assert report["ranks"]["running"] == [0, 1] and set(report["ranks"]["evidence_age_s"]) == {"0", "1"}
    assert max(report["ranks"]["evidence_age_s"].values()) < 5.0, report["ranks"]
