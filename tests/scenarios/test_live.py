"""Live straggler alerts on real torchrun jobs (flightrec/watch/pace.py, live.py): rank 0's log names the
rank that turned slow within one window of its onset, and says nothing on a healthy control; the
metrics file lists every rank. benchmarks/live_alerts.py runs the same jobs many times."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import threading
import time
from pathlib import Path

from click.testing import CliRunner

from fixtures.launch import free_port, kill_tree, launch
from flightrec.cli.commands import main

JOB = Path(__file__).resolve().parents[2] / "fixtures" / "jobs" / "paced.py"
WINDOW_S = 6  # the job runs ~7 s past the onset: an alert at all is an alert within one window (+ a round)
ENV = {"FLIGHTREC_STRAGGLER_WINDOW_S": str(WINDOW_S), "FLIGHTREC_TIMEOUT": "60"}


def _run(tmp_path: Path, slow_ms: float) -> tuple[str, Path]:
    metrics = tmp_path / "flightrec.prom"
    result = launch(JOB, 4, tmp_path / "dumps", ["--slow-ms", str(slow_ms)],
                    env={**ENV, "FLIGHTREC_METRICS_FILE": str(metrics)}, timeout_s=90)
    assert not result.timed_out and result.returncode == 0, result.output[-3000:]
    return result.output, metrics


def test_a_rank_turning_slow_is_named_within_a_window(tmp_path: Path) -> None:
    output, metrics = _run(tmp_path, slow_ms=15.0)
    assert "ONSET rank 2" in output
    lines = [line for line in output.splitlines() if "straggler:" in line]
    assert lines and all(line.startswith("[flightrec rank 0]") for line in lines), output[-3000:]
    assert re.search(r"straggler: rank 2 \(\S+\) held group 0 back \d+\.\d s of the last \d+ s \(\d+\.\d%\), persistent",
                     lines[0]), lines
    assert not any("rank 0 " in line or "rank 1 " in line or "rank 3 " in line for line in lines), lines
    text = metrics.read_text()
    assert all(f'rank="{r}"' in text for r in range(4))
    cost = {int(m[0]): float(m[1]) for m in re.findall(r'flightrec_cost_to_others_seconds\{rank="(\d)",[^}]*\} (\S+)', text)}
    assert cost[2] > 0 and all(cost[r] == 0 for r in (0, 1, 3)), cost


def test_a_healthy_job_is_quiet(tmp_path: Path) -> None:
    output, metrics = _run(tmp_path, slow_ms=0.0)
    assert "straggler:" not in output, output[-3000:]
    assert "flightrec_cost_to_others_seconds" in metrics.read_text()


def test_watch_sees_a_hang_as_it_happens_and_a_rank_that_stops_answering(tmp_path: Path) -> None:
    """Rank 2 stops in compute at step 40: `flightrec watch HOST:PORT` shows the others waiting in the next
    all_reduce and rank 2 not in it while the job hangs; once rank 2's process is stopped (SIGSTOP), its
    pace ages and watch says it stopped answering. Nothing is written to the dump folder."""
    port = free_port()
    out = tmp_path / "dumps"
    job = threading.Thread(target=launch, args=(JOB, 4, out, ["--slow-ms", "0", "--stall-step", "40"]),
                           kwargs={"env": {**ENV, "FLIGHTREC_TIMEOUT": "300"}, "timeout_s": 40, "master_port": port},
                           daemon=True)
    job.start()
    runner = CliRunner()
    address = f"127.0.0.1:{port}"
    seen, stopped = "", ""
    deadline = time.monotonic() + 35
    try:
        while time.monotonic() < deadline and not stopped:
            time.sleep(1.0)
            done = runner.invoke(main, ["watch", address, "--once", "--window", str(WINDOW_S)])
            if done.exit_code != 0:
                continue  # the store is not up yet
            text = done.output
            if not seen and re.search(r"ranks 0-1, 3 wait in seq \d+ for [\d.]+ s; rank 2 is not in it", text):
                seen = text
                pid = int(re.search(r'"pid":(\d+)', _record(port, 2)).group(1))
                os.kill(pid, signal.SIGSTOP)
            elif seen and "rank 2 (" in text and "stopped answering" in text:
                stopped = text
    finally:
        for rank in range(4):  # end the job now rather than at launch's time limit
            with contextlib.suppress(Exception):
                kill_tree(int(re.search(r'"pid":(\d+)', _record(port, rank)).group(1)))
        job.join(60)
    assert seen, "watch never showed ranks 0,1,3 waiting for rank 2"
    assert stopped, f"watch never said rank 2 stopped answering; last screen:\n{seen}"
    assert not list(out.glob(".flightrec-watch*")) and not (out / "flightrec.prom").exists()


def _record(port: int, rank: int) -> str:
    from flightrec.cli import live_view
    from flightrec.watch import pace

    store = live_view.connect(f"127.0.0.1:{port}")
    attempt = next(a for a in range(live_view.MAX_ATTEMPTS) if store.check([pace.pace_key(a, rank)]))
    return bytes(store.get(pace.pace_key(attempt, rank))).decode()
