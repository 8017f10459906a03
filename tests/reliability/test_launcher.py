"""The launcher is never armed, only its training workers: SIGTERM to torchrun stops every worker.

Armed in torchrun's agent, our watchdog used to read the agent's SIGTERM from the wakeup pipe and
kill it at once (exit 143), before torchrun's own handler could stop its workers: they were left
orphaned. Real processes throughout, each bounded in time and killed in the end.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from fixtures.launch import descendants, free_port, stop_job
from flightrec.format.names import dump_filename
from tests.child import command, facts
from tests.helpers import read_dump

ROOT = Path(__file__).resolve().parents[2]
JOB = Path(__file__).with_name("launcher_job.py")
JOBS = "tests.reliability.one_rank_jobs"
NPROC = 2


def _env(out: Path, flightrec: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLIGHTREC")}
    env.update({"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])),
                "FLIGHTREC_DIR": str(out), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
    if flightrec:
        env.update({"FLIGHTREC": "1", "FLIGHTREC_TIMEOUT": "300"})
    return env


def _alive(pid: int) -> bool:
    """Running (a zombie has exited: its parent has only to reap it)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _ours(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return JOB.name.encode() in handle.read()
    except OSError:
        return False


@dataclass
class Outcome:
    returncode: int | None
    workers: list[int]
    orphans: list[int]
    reasons: dict[int, str | None]
    log: str


def terminate_torchrun(out: Path, flightrec: bool, ready_timeout_s: float = 90.0, exit_timeout_s: float = 40.0
                       ) -> Outcome:
    """Start the job under torchrun, wait until every worker blocks, SIGTERM torchrun alone, and see what stays."""
    out.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", str(NPROC),
               "--master_addr", "127.0.0.1", "--master_port", str(free_port()), "--max_restarts", "0",
               "--monitor_interval", "0.2", str(JOB), str(out)]
    log_path = out / ".torchrun.log"
    seen: set[int] = set()
    with open(log_path, "w", encoding="utf-8") as log:
        proc = subprocess.Popen(command, env=_env(out, flightrec), stdout=log, stderr=subprocess.STDOUT,
                                cwd=out, start_new_session=True)
        try:
            markers = [out / f"ready-{rank}" for rank in range(NPROC)]
            deadline = time.monotonic() + ready_timeout_s
            while not all(m.exists() for m in markers):
                seen.update(descendants(proc.pid))
                assert proc.poll() is None, f"torchrun exited early:\n{log_path.read_text(errors='replace')}"
                assert time.monotonic() < deadline, f"workers not ready:\n{log_path.read_text(errors='replace')}"
                time.sleep(0.1)
            workers = [int(m.read_text()) for m in markers]
            seen.update(descendants(proc.pid))
            time.sleep(0.5)  # the other ranks reach their blocking all_reduce
            proc.send_signal(signal.SIGTERM)
            try:
                returncode: int | None = proc.wait(timeout=exit_timeout_s)
            except subprocess.TimeoutExpired:
                returncode = None
            deadline = time.monotonic() + 3  # an exited worker may take a moment to leave /proc
            while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
                time.sleep(0.1)
            orphans = [pid for pid in workers if _alive(pid)]
        finally:
            stop_job(proc, [pid for pid in seen if _alive(pid) and _ours(pid)])
    reasons: dict[int, str | None] = {}
    for rank in range(NPROC):
        path = out / dump_filename(rank)
        reasons[rank] = read_dump(str(path))["reason"] if path.exists() else None
    return Outcome(returncode, workers, orphans, reasons, log_path.read_text(errors="replace"))


@pytest.mark.parametrize("attempt", range(3))
def test_sigterm_to_an_armed_torchrun_stops_every_worker_and_each_dumps(tmp_path: Path, attempt: int) -> None:
    outcome = terminate_torchrun(tmp_path, flightrec=True)
    assert outcome.returncode is not None, f"torchrun still running 40 s after SIGTERM:\n{outcome.log[-3000:]}"
    assert outcome.orphans == [], f"workers left running: {outcome.orphans}\n{outcome.log[-3000:]}"
    assert outcome.reasons == {rank: "signal" for rank in range(NPROC)}, outcome.log[-3000:]
    assert "[flightrec]" not in outcome.log, outcome.log[-3000:]  # the agent has nothing to say: it is not armed


def test_sigterm_to_torchrun_without_flightrec_stops_every_worker(tmp_path: Path) -> None:
    """The control: what torchrun does on its own."""
    outcome = terminate_torchrun(tmp_path, flightrec=False)
    assert outcome.returncode is not None, outcome.log[-3000:]
    assert outcome.orphans == [], f"workers left running: {outcome.orphans}\n{outcome.log[-3000:]}"
    assert outcome.reasons == {rank: None for rank in range(NPROC)}


def test_a_process_is_armed_only_when_it_joins_its_default_group(tmp_path: Path) -> None:
    """torchrun's agent imports torch.distributed and never joins: nothing of ours may run there."""
    run = subprocess.run(command(JOBS, "armed_once_joined"), capture_output=True, text=True, timeout=120,
                         cwd=tmp_path, env=_env(tmp_path, flightrec=True))
    assert run.returncode == 0, run.stderr[-3000:]
    got = facts(run.stdout)
    assert got["imported"] == {"armed": False, "watchdog": False, "default_sigterm": True}, run.stderr[-3000:]
    assert got["joined"] == {"armed": True, "watchdog": True, "default_sigterm": False}, run.stderr[-3000:]
    assert got["initialized"]


def test_sigterm_goes_to_a_handler_installed_after_ours_and_does_not_kill(tmp_path: Path) -> None:
    """Whoever replaced our handler (torchrun's agent, user code) decides what SIGTERM does; we only dump."""
    run = subprocess.run(command(JOBS, "chained_sigterm", tmp_path), capture_output=True, text=True, timeout=60,
                         cwd=tmp_path, env=_env(tmp_path, flightrec=False))
    assert run.returncode == 0, (run.returncode, run.stderr[-3000:])
    got = facts(run.stdout)
    assert got["enabled"] and got["hits"] == [got["sigterm"]], run.stderr[-3000:]
    assert got["reason"] == "signal", run.stderr[-3000:]
