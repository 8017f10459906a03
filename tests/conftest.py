"""Test set-up shared by every folder, and the markers that pick the fast loop (CONTRIBUTING.md).

`job`: the test runs real multi-process jobs (torchrun, torch.multiprocessing): every module of the
folders in JOB_FOLDERS, except the in-process ones in NOT_JOBS; `serial`: a job whose checks read
timing (SERIAL), which CI runs alone. `slow`: long runs among the rest (SLOW). The default `pytest` leaves both out (pyproject.toml); `-m ""` runs everything, as CI does.
"""

import os
import sys
from pathlib import Path

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.pop("FLIGHTREC", None)

TESTS = Path(__file__).resolve().parent
JOB_FOLDERS = {"recorder", "reliability", "scenarios"}
NOT_JOBS = {"recorder/test_recovery_units.py", "recorder/test_thread_stacks.py", "recorder/test_torch_fr_read.py",
            "recorder/test_cli_startup.py", "recorder/test_pace.py", "reliability/test_analyzer_fuzz.py", "reliability/test_analyzer_inputs.py"}
JOBS = {"analyzer/test_jobs.py::test_real_two_jobs_in_one_folder", "analyzer/test_alignment.py::test_real_tutorial_job_blames_rank_0"}
JOB_FIXTURES = {"batch_ring"}  # module fixtures that run a real job (tests/analyzer/test_trace_export.py)
# Jobs whose checks read timing (stragglers, clock offsets, timing shifts, recovered stalls, live alerts,
# a soak's false alarms): `serial`, run one at a time with the cores to themselves; the other jobs run
# on two workers beside the in-process tests in CI (.ci/test). Scenarios whose expectations read timing are marked where they are
# parametrized (tests/scenarios/test_fault_injection.py, fixtures/run.py `timed`).
# A test id there is a job heavy enough to starve whatever runs beside it (thousands of gloo threads).
SERIAL = {"scenarios/test_live.py", "scenarios/test_snapshots.py", "reliability/test_soak.py",
          "reliability/test_recorder_faults.py::test_a_thousand_live_groups_number_each_group_on_its_own",
          # the emulated stream's own timings, bounded above (a call returns within 0.5 s): failed once beside
          # other device jobs on two workers
          "recorder/test_device_backend.py::test_the_host_runs_ahead_and_the_work_completes_later"}
# the longest tests without a job, 15-140 s each on 2 cores: a wheel build, thousands of simulated jobs, fuzzing
SLOW = {"test_packaging.py::test_wheel_installs_beside_a_package_named_fixtures",
        "analyzer/test_sim.py::test_reports_name_exactly_the_true_culprits",
        "analyzer/test_summaries.py::test_simulated_jobs_get_the_same_verdict_from_summaries",
        "analyzer/test_summaries.py::test_short_summaries_still_decide_hangs_and_deadlocks",
        "reliability/test_analyzer_fuzz.py::test_mutated_dumps_are_reported_or_rejected_never_a_crash"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        path = Path(str(item.fspath)).resolve().relative_to(TESTS).as_posix()
        test = f"{path}::{item.name.split('[')[0]}"
        if ((path.split("/")[0] in JOB_FOLDERS and path not in NOT_JOBS) or test in JOBS
                or JOB_FIXTURES & set(getattr(item, "fixturenames", ()))):
            item.add_marker(pytest.mark.job)
        if path in SERIAL or test in SERIAL:
            item.add_marker(pytest.mark.serial)
        if test in SLOW:
            item.add_marker(pytest.mark.slow)
        if item.get_closest_marker("gpu") is not None and not _cuda():
            item.add_marker(pytest.mark.skip(reason="no CUDA device here"))


def _cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())
