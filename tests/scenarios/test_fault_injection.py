"""End to end: a real torchrun gloo job, a fault, FLIGHTREC=1 in the environment, `flightrec analyze` out.

Each scenario runs under a hard time bound and the launcher kills every process of the job (stopped
ones included) before the test ends.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from fixtures.run import (
    DEVICE_IN_CI,
    DEVICE_MATCHED,
    SCENARIOS,
    analyze,
    check,
    dumped_ranks,
    job_problems,
    run_scenario,
    timed,
)

ROOT = Path(__file__).resolve().parents[2]
# Every scenario on gloo, and on the emulated device backends a set of those whose answers match there
# already (fixtures/run.py DEVICE_IN_CI; docs/device-emulation.md lists the others and what they answer).
DEVICE_RUNS = DEVICE_MATCHED if os.environ.get("FLIGHTREC_DEVICE_SCENARIOS") == "all" else DEVICE_IN_CI
SERIAL = [pytest.mark.serial]  # its checks read timing: CI runs it alone (tests/conftest.py)
RUNS = [pytest.param(name, "gloo", id=name, marks=SERIAL if timed(SCENARIOS[name]) else ()) for name in SCENARIOS] + [
    pytest.param(name, backend, id=f"{name}-{backend}", marks=SERIAL if timed(SCENARIOS[name]) else ())
    for backend, names in DEVICE_RUNS.items() for name in names]


def _analyze_cli(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "flightrec", "analyze", str(folder), *args],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)


def _cli_reports_the_compute_hang(folder: Path) -> None:
    out = _analyze_cli(folder, "--format", "json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert [(c["rank"], c["kind"]) for c in report["root_causes"]] == [(2, "not_entered")]
    text = _analyze_cli(folder).stdout
    assert text.splitlines()[0].startswith("HANG: rank 2 never reached all_reduce") and "stall_in_compute" in text


def _mesh_dp_hang_names_the_dp_group_by_members(folder: Path) -> None:
    text = _analyze_cli(folder, "-q").stdout
    assert "HANG: rank 3 never reached all_reduce #4 of group " in text and "[1, 3] (dp); rank 1 waits" in text, text


def _sigkilled_rank_host_is_inferred(folder: Path) -> None:
    import socket

    text = _analyze_cli(folder, "-q").stdout
    assert f"  where       host {socket.gethostname()} (node 0, local rank 3; inferred: " in text, text
    hosts = _analyze_cli(folder, "-q", "--hosts")
    assert hosts.stdout.split() == [socket.gethostname()] and "rank 3: host" in hosts.stderr


# What the CLI says of a scenario's gloo run, checked on that run's dumps (a second run of the job
# would cost CI another torchrun job for the same evidence)
CLI_CHECKS: dict[str, Callable[[Path], None]] = {
    "compute_hang": _cli_reports_the_compute_hang,
    "mesh_dp_hang": _mesh_dp_hang_names_the_dp_group_by_members,
    "sigkill": _sigkilled_rank_host_is_inferred,
}


@pytest.mark.parametrize(("name", "backend"), RUNS)
def test_scenario(name: str, backend: str, tmp_path: Path) -> None:
    scenario = SCENARIOS[name]
    result = run_scenario(scenario, tmp_path / name, backend=backend)
    assert not result.timed_out, f"{name} did not produce its dumps in time:\n{result.output[-3000:]}"
    report = analyze(tmp_path / name)
    problems = check(scenario, report, dumped_ranks(tmp_path / name), tmp_path / name) + job_problems(scenario, result)
    assert not problems, f"{name}: {problems}\n{json.dumps(report, indent=1, default=str)[:4000]}"
    if report["verdict"] == "healthy":  # estimated ends of C++-issued ops changed nothing: not said
        assert not [g for g in report["gaps"] if "no recorded end" in g], report["gaps"]
    for pid in result.worker_pids:  # nothing of the job survives it (SIGKILL takes effect within moments)
        assert _gone(pid), f"worker {pid} of {name} outlived the job"
    if backend == "gloo" and name in CLI_CHECKS:
        CLI_CHECKS[name](tmp_path / name)


def _gone(pid: int, within_s: float = 5.0) -> bool:
    """The process has exited (or is a zombie) within `within_s`: a killed process with a large heap
    needs a moment to tear it down, and the check came right after the kill."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            if "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]:
                return True
        except (FileNotFoundError, ProcessLookupError, IndexError):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def test_published_scenario_table_covers_every_scenario() -> None:
    """docs/scenarios.md is generated: every scenario has its row, with the text it injects today."""
    table = (ROOT / "docs" / "scenarios.md").read_text().split("## Ground-truth simulator")[0]
    rows = {line.split("|")[1].strip(): line for line in table.splitlines() if line.startswith("| ") and "---" not in line}
    assert set(SCENARIOS) <= set(rows), set(SCENARIOS) - set(rows)
    for name, scenario in SCENARIOS.items():
        assert f"| {scenario.injected} |" in rows[name], f"{name}: regenerate docs/scenarios.md"


def test_readme_demo_names_the_stalled_rank(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "flightrec", "demo", "--out", str(tmp_path / "demo")],
                         capture_output=True, text=True, timeout=180, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "HANG: rank 2 never reached all_reduce" in out.stdout and "stall_in_compute" in out.stdout
    # the stalled rank's stack and the waiters' place read like a traceback, with their source lines
    assert "    File \"" in out.stdout and "      time.sleep(3600)" in out.stdout
    assert "ranks 0-1, 3 -> rank 2 in all_reduce #4 of group 0 [0-3] (world), at train.py:109 in main: dist.all_reduce(grad)" in out.stdout


def test_torn_down_crash_is_accepted_only_with_its_evidence() -> None:
    """A crash whose survivors torchrun stopped before they saw it may be named by the missing dump,
    but only when every survivor was terminated by a signal and nothing else failed."""
    scenario = SCENARIOS["ddp_crash"]
    report = {"verdict": "hang", "root_causes": [{"rank": 3, "kind": "missing_dump"}], "cycles": [], "mismatches": [],
              "failures": [{"rank": r, "kind": "terminated"} for r in (0, 1, 2)]}
    assert check(scenario, report, [0, 1, 2]) == []
    report["failures"][1] = {"rank": 1, "kind": "peer_lost"}
    assert check(scenario, report, [0, 1, 2])  # a survivor saw something: the crash must be named
    report["failures"] = [{"rank": r, "kind": "terminated"} for r in (0, 1)]
    assert check(scenario, report, [0, 1, 2])  # rank 2 was not stopped by the launcher


def test_the_device_runs_are_matched_scenarios() -> None:
    assert set(CLI_CHECKS) <= set(SCENARIOS)  # a renamed scenario must not drop its CLI checks silently
    for backend, names in DEVICE_IN_CI.items():
        assert set(names) <= set(DEVICE_MATCHED[backend]) <= set(SCENARIOS), backend
