"""The emulated device backend (fixtures/device_backend.py) behaves as ProcessGroupNCCL and torch_npu's
ProcessGroupHCCL do on the host, on real 2-rank torchrun jobs: it is what the scenario suite's device
runs stand on, so each behaviour it copies is checked here."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from fixtures.launch import JobResult, launch

JOB = Path(__file__).resolve().parents[2] / "fixtures" / "jobs" / "device_semantics.py"
LATE_S = 1.5


def _probe(tmp_path: Path, probe: str, backend: str = "emu_nccl", env: dict[str, str] | None = None,
           timeout_s: float = 60.0) -> tuple[JobResult, dict]:
    result = launch(JOB, 2, tmp_path, [probe, "--timeout-s", str(timeout_s)], flightrec=False, timeout_s=60,
                    env={"SCENARIO_BACKEND": backend, **(env or {})})
    found = tmp_path / "probe-rank0.json"
    return result, json.loads(found.read_text()) if found.exists() else {}


@pytest.mark.parametrize("backend", ["emu_nccl", "emu_hccl"])
def test_the_host_runs_ahead_and_the_work_completes_later(tmp_path: Path, backend: str) -> None:
    result, got = _probe(tmp_path, "host_runs_ahead", backend)
    assert result.returncode == 0, result.output[-3000:]
    assert got["call_s"] < 0.5 and got["wait_s"] < 0.5  # queued on the stream; wait() holds the stream, not the host
    assert not got["completed_at_return"] and got["future_done_at_return"]  # the future completes when queued
    assert got["completed_after_s"] > LATE_S - 0.6  # ... the Work when the peer joined
    assert got["value"] == [3.0] * 4
    assert got["barrier_s"] > LATE_S - 0.6  # a barrier's wait holds the host
    assert got["seq"] == 2  # getSequenceNumberForGroup: collectives only


def test_blocking_wait_holds_the_host(tmp_path: Path) -> None:
    result, got = _probe(tmp_path, "blocking_wait", env={"TORCH_NCCL_BLOCKING_WAIT": "1"})
    assert result.returncode == 0, result.output[-3000:]
    assert got["wait_s"] > LATE_S - 0.6


def test_ddp_reducer_ops_reach_the_backend(tmp_path: Path) -> None:
    result, got = _probe(tmp_path, "ddp")
    assert result.returncode == 0, result.output[-3000:]
    assert got["reducer_ops"] >= 3  # one bucket all-reduce per backward, issued from C++


def test_a_timeout_takes_the_process_down_by_default_after_dumping_the_recorder(tmp_path: Path) -> None:
    result, got = _probe(tmp_path, "timeout", timeout_s=1.0,
                         env={"TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC": "50",
                              "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": str(tmp_path / "nccl_trace_rank_")})
    assert result.returncode != 0 and got == {}  # SkipCleanUp (3): the watchdog's exception ends the process
    assert ("[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=2, OpType=ALLREDUCE, "
            "NumelIn=4, NumelOut=4, Timeout(ms)=1000) ran for") in result.output
    assert "terminate called after throwing an instance of 'c10::DistBackendError'" in result.output
    assert "exitcode  : -6" in result.output  # SIGABRT, as torchrun reports it
    trace = pickle.loads((tmp_path / "nccl_trace_rank_0").read_bytes())
    assert trace["version"] == "2.10" and set(trace["pg_status"]["0"]) == {
        "last_enqueued_collective", "last_started_collective", "last_completed_collective"}
    entries = trace["entries"]
    assert [e["profiling_name"] for e in entries] == ["nccl:all_reduce", "nccl:all_reduce"]
    assert [e["state"] for e in entries] == ["completed", "scheduled"]  # no start event without timing
    assert [e["collective_seq_id"] for e in entries] == [1, 2] and entries[1]["timeout_ms"] == 1000


def test_clean_up_only_aborts_the_communicator_and_the_process_goes_on(tmp_path: Path) -> None:
    result, got = _probe(tmp_path, "timeout", timeout_s=1.0, env={"TORCH_NCCL_ASYNC_ERROR_HANDLING": "2",
                                                                  "TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC": "50",
                                                                  "TORCH_NCCL_DUMP_ON_TIMEOUT": "0"})
    assert result.returncode == 0, result.output[-3000:]
    assert 0.9 < got["completed"] < 3 and got["exception"] == "None"  # the aborted kernel ends; the user's copy holds no error
    assert got["next_op"] == "DistBackendError: NCCL communicator was aborted on rank 0. "


def test_no_handling_leaves_the_op_hanging(tmp_path: Path) -> None:
    result, got = _probe(tmp_path, "timeout", timeout_s=1.0, env={"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"})
    assert result.returncode == 0, result.output[-3000:]
    assert "completed" not in got and got["next_op"] == "ran"
    assert "Watchdog caught collective operation timeout" in result.output


def test_hccl_tears_down_with_its_own_names(tmp_path: Path) -> None:
    result, got = _probe(tmp_path, "timeout", "emu_hccl", timeout_s=1.0,
                         env={"TORCH_HCCL_TRACE_BUFFER_SIZE": "100", "TORCH_HCCL_DUMP_ON_TIMEOUT": "1",
                              "TORCH_HCCL_DEBUG_INFO_TEMP_FILE": str(tmp_path / "hccl_trace_rank_")})
    assert result.returncode != 0 and got == {}  # TearDown (1), torch_npu's default
    assert "[Rank 0] Watchdog caught collective operation timeout: WorkHCCL(SeqNum=2, OpType=ALLREDUCE" in result.output
    assert "HCCL watchdog thread terminated with exception" in result.output
    trace = pickle.loads((tmp_path / "hccl_trace_rank_0").read_bytes())
    assert trace["version"] == "2.4" and [e["profiling_name"] for e in trace["entries"]] == ["", ""]
    assert [e["op_id"] for e in trace["entries"]] == [1, 2]  # the Work's seq as op_id
    assert (tmp_path / "hccl_trace_rank_0_py_traceback").read_text().startswith("pid: ")
