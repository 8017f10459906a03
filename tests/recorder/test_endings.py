"""How a rank ends leaves evidence: an uncaught exception (any thread, C++-issued ops included) dumps
before the process dies, a clean exit leaves an exit record, and C++-issued ops carry only measured
times (polled ones are kept apart as `t_seen_ns`)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.child import command, env_with_root
from tests.helpers import entries, load_dump

ROOT = Path(__file__).resolve().parents[2]
JOBS = "tests.recorder.one_rank_jobs"


def _run(job: str, folder: Path, *args: object, **env: str) -> subprocess.CompletedProcess[str]:
    """Run `job` of tests/recorder/one_rank_jobs.py armed by FLIGHTREC=1, as a user's job is."""
    full_env = env_with_root({"FLIGHTREC": "1", "FLIGHTREC_DIR": str(folder), "RANK": "0", "WORLD_SIZE": "1",
                              "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin", **env})
    return subprocess.run(command(JOBS, job, *args), capture_output=True, text=True, timeout=120, cwd=ROOT, env=full_env)


def test_an_uncaught_exception_dumps_before_the_process_dies(tmp_path: Path) -> None:
    out = _run("main_thread_error", tmp_path)
    assert out.returncode == 1 and "ValueError: bad sample 17" in out.stderr  # the job's own hook still ran
    dump = load_dump(tmp_path, 0)
    assert dump["reason"] == "exception" and "ValueError: bad sample 17" in dump["reason_detail"]
    assert dump["exception"]["type"] == "ValueError" and dump["exception"]["thread"] == "MainThread"
    assert dump["exception"]["traceback"][-1].endswith("in load_batch")
    assert not dump["exit_record"]  # the exit that follows must not replace the crash evidence


def test_an_uncaught_exception_in_another_thread_dumps(tmp_path: Path) -> None:
    out = _run("other_thread_error", tmp_path, FLIGHTREC_DUMP_ON_EXIT="0")
    assert out.returncode == 0 and "KeyError" in out.stderr
    dump = load_dump(tmp_path, 0)
    assert dump["reason"] == "exception" and dump["exception"]["thread"] == "prefetcher"


def test_a_clean_exit_leaves_an_exit_record(tmp_path: Path) -> None:
    out = _run("three_ops", tmp_path)
    assert out.returncode == 0, out.stderr
    dump = load_dump(tmp_path, 0)
    assert dump["reason"] == "exit" and dump["exit_record"] is True and dump["threads"] == []
    assert [e["op"] for e in entries(dump)] == ["all_reduce"] * 3
    assert {"group": "0", "kind": "coll", "live": True, "entered": 3, "started": 3, "completed": 3} in dump["progress"]
    full = tmp_path / "full"
    assert _run("three_ops", full, FLIGHTREC_DUMP_ON_EXIT="1").returncode == 0
    assert load_dump(full, 0)["exit_record"] is False and load_dump(full, 0)["threads"]


@pytest.mark.parametrize("torch_recorder", ["on", "off"])
def test_cpp_issued_ops_carry_only_measured_times(tmp_path: Path, torch_recorder: str) -> None:
    """DDP's all-reduces never pass through Python. Without PyTorch's recorder their times are when the
    watchdog noticed them: kept in t_seen_ns, never in t_enqueue_ns/t_complete_ns."""
    env = {"FLIGHTREC_DUMP_ON_EXIT": "1", **({"TORCH_FR_BUFFER_SIZE": "0"} if torch_recorder == "off" else {})}
    out = _run("ddp_steps", tmp_path, 5, **env)
    assert out.returncode == 0, out.stderr
    cpp = [e for e in entries(load_dump(tmp_path, 0)) if e["source"] == "c++"]
    assert len(cpp) >= 5
    if torch_recorder == "off":
        assert all(e["t_enqueue_ns"] is None and e["t_complete_ns"] is None for e in cpp)
        assert all(e.get("t_seen_ns") is not None for e in cpp)
        assert {e["op"] for e in cpp} == {"unknown"}
    else:  # PyTorch's recorder stamped each op where it was issued: distinct, increasing, measured
        enqueued = [e["t_enqueue_ns"] for e in cpp]
        assert None not in enqueued and enqueued == sorted(enqueued) and len(set(enqueued)) == len(enqueued)
        assert all(e.get("t_seen_ns") is None for e in cpp)
        assert "all_reduce" in {e["op"] for e in cpp}


def test_the_launchers_sigterm_after_a_failure_keeps_the_failure_dump(tmp_path: Path) -> None:
    """torchrun stops every worker once one exited with an error, often while a failing rank is still
    on its way out: the SIGTERM dump must not replace the dump that says what failed."""
    out = _run("other_thread_error_then_sigterm", tmp_path)
    assert out.returncode == -15, out.stderr
    dump = load_dump(tmp_path, 0)
    assert dump["reason"] == "exception" and dump["exception"]["type"] == "KeyError"
