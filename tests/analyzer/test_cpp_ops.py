"""C++-issued collectives whose completion nobody observed (PyTorch's recorder off): a hang inside
DDP's Reducer is found from who entered what, and a job where every rank got as far is not a hang."""

from __future__ import annotations

from pathlib import Path

import analyzers
from analyzers.reporting.render import text_report
from fixtures.builders import COMPUTE_STACK, Job


def _ddp(job: Job, ranks: list[int] | None = None) -> None:
    job.collective("0", "all_reduce", ranks=ranks, state="unknown", source="c++", api="c++")


def test_a_stall_before_a_cpp_all_reduce_is_a_hang(tmp_path: Path) -> None:
    job = Job(2)
    for _ in range(4):
        _ddp(job)
    _ddp(job, ranks=[0])  # rank 0 is in the Reducer's all-reduce; rank 1 never got there
    report = analyzers.load(job.write(tmp_path)).report()
    assert report["verdict"] == "hang", report["summary"]
    assert [(c["rank"], c["kind"]) for c in report["root_causes"]] == [(1, "not_entered")]
    (wait,) = report["waits"]
    assert wait["rank"] == 0 and wait["evidence"] == "inferred"
    assert any("cannot observe completion" in g for g in report["gaps"])


def test_every_rank_at_the_same_cpp_op_is_no_hang(tmp_path: Path) -> None:
    job = Job(2)
    for _ in range(5):
        _ddp(job)
    report = analyzers.load(job.write(tmp_path)).report()
    assert report["verdict"] == "healthy", report["summary"]
    assert report["waits"] == []


def test_comm_stuck_names_a_rank_that_did_not_complete(tmp_path: Path) -> None:
    """Rank 0 completed the all_reduce (it saw the others' data); ranks 1-3 are still in it."""
    job = Job(4)
    job.collective("0", "all_reduce")
    job.collective("0", "all_reduce", ranks=[0])
    job.collective("0", "all_reduce", ranks=[1, 2, 3], state="started", seq=2)
    report = analyzers.load(job.write(tmp_path)).report()
    (cause,) = report["root_causes"]
    assert cause["kind"] == "comm_stuck" and cause["rank"] != 0, cause


def test_comm_stuck_singles_out_ranks_whose_op_never_started(tmp_path: Path) -> None:
    """NCCL-style states: ranks 0, 1, 3 started the kernel, rank 2's op is only scheduled."""
    job = Job(4, backend="nccl")
    job.collective("0", "all_reduce")
    job.collective("0", "all_reduce", ranks=[0, 1, 3], state="started")
    job.collective("0", "all_reduce", ranks=[2], state="enqueued")
    report = analyzers.load(job.write(tmp_path)).report()
    (cause,) = report["root_causes"]
    assert (cause["kind"], cause["rank"], cause["ranks"]) == ("comm_stuck", 2, [2]), cause
    assert "only scheduled" in cause["detail"]


def _late_completion(tmp_path: Path, source: str) -> dict:
    """torch 2.15's gloo, seen once in a DDP stall: rank 1 completed the Reducer's all-reduce #7 and stalled
    in compute; rank 0's copy of #7 still read `started` (PyTorch's recorder, polled, marks completion
    late) and it had issued #8, which rank 1 never entered."""
    job = Job(2)
    for _ in range(6):
        job.collective("0", "all_reduce", source=source, api="c++" if source == "c++" else "all_reduce")
    job.collective("0", "all_reduce", ranks=[1], source=source, api="c++" if source == "c++" else "all_reduce")
    for _ in range(2):
        job.collective("0", "all_reduce", ranks=[0], state="started", source=source,
                       api="c++" if source == "c++" else "all_reduce")
    job.stack(1, COMPUTE_STACK)
    return analyzers.load(job.write(tmp_path)).report()


def test_a_cpp_collective_a_member_completed_is_not_where_a_rank_hangs(tmp_path: Path) -> None:
    report = _late_completion(tmp_path, "c++")
    assert report["verdict"] == "hang", report["summary"]
    assert [(c["rank"], c["kind"]) for c in report["root_causes"]] == [(1, "not_entered")], report["root_causes"]
    (wait,) = report["waits"]
    assert wait["rank"] == 0 and wait["seq"] == 8
    assert any("taken as completed" in n for n in report["gaps"]), report["gaps"]


def test_a_python_collective_keeps_the_state_the_recorder_saw(tmp_path: Path) -> None:
    """flightrec saw the call not return: rank 0 really is inside #7, which its peer finished."""
    report = _late_completion(tmp_path, "python")
    assert [(c["rank"], c["kind"]) for c in report["root_causes"]] == [(0, "comm_stuck")], report["root_causes"]
    assert not any("taken as completed" in n for n in report["gaps"])


def test_a_cpp_op_of_unrecorded_name_reads_as_such(tmp_path: Path) -> None:
    """torch 2.1-2.4 on gloo: no recorder names DDP's C++-issued ops; the report says that, not 'unknown #8'."""
    job = Job(2)
    for _ in range(3):
        job.collective("0", "unknown", state="unknown", source="c++", api="c++")
    job.collective("0", "unknown", ranks=[0], state="unknown", source="c++", api="c++")
    report = analyzers.load(job.write(tmp_path)).report()
    first = text_report(report).splitlines()[0]
    assert first.startswith("HANG: rank 1 never reached collective #4 (issued from C++, op not recorded) of group 0"), first
