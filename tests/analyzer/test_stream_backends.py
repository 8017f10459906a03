"""What a stream-ordered backend (NCCL, HCCL, the emulated `emu_nccl`) leaves in its dumps, read as
such: its host returns before the op runs, so where the host thread is says little about where the
rank waits. Each job is also read as gloo's where that answer differs, so each test shows the rule
it needs (fixtures/builders.py; real jobs on the emulated backend: tests/scenarios)."""

from __future__ import annotations

from pathlib import Path

import analyzers
from fixtures.builders import Job


def _report(job: Job, folder: Path) -> dict:
    return analyzers.load(str(job.write(folder))).report()


def _causes(report: dict) -> list[tuple[int, str]]:
    return [(c["rank"], c["kind"]) for c in report["root_causes"]]


def _pipeline_stage_stalls(backend: str) -> Job:
    """Rank 0 posted its transfers with rank 1 (async, as a pipeline schedule does) and its host ran
    on: no thread inside an op. Rank 1 stalls in compute before its send."""
    job = Job(2, backend=backend)
    job.collective("0")
    job.send("0", 0, 1, is_async=True)
    job.recv("0", 1, 0, is_async=True)
    job.recv("0", 0, 1, state="started", is_async=True)
    job.send("0", 0, 1, state="started", is_async=True)
    job.stack(0, ["train.py:50 in <module>", "train.py:30 in forward"], in_op=None)
    job.stack(1, ["train.py:50 in <module>", "train.py:12 in stall_in_compute"], in_op=None)
    return job


def test_ops_left_in_flight_on_a_stream_are_where_the_rank_waits(tmp_path: Path) -> None:
    report = _report(_pipeline_stage_stalls("nccl"), tmp_path / "nccl")
    assert report["verdict"] == "hang", report["summary"]
    assert _causes(report) == [(1, "not_entered")]
    # on gloo the same dumps say rank 0 computes past its async ops: nobody waits yet
    assert _report(_pipeline_stage_stalls("gloo"), tmp_path / "gloo")["verdict"] != "hang"


def test_receives_first_on_both_sides_of_a_stream_pair_are_a_deadlock(tmp_path: Path) -> None:
    """Both ranks receive first, then send (NCCL: one stream per pair, so each send waits behind its
    rank's own receive). Each peer's send was posted, but behind a receive: a cycle, not a transfer
    that both sides entered (comm_stuck)."""
    job = Job(2, backend="nccl")
    job.collective("0")
    for rank, peer in ((0, 1), (1, 0)):
        job.recv("0", rank, peer, state="started")
        job.send("0", rank, peer, state="started")
    report = _report(job, tmp_path)
    assert report["verdict"] == "deadlock", report["summary"]
    assert _causes(report) == [(0, "deadlock"), (1, "deadlock")]


def test_a_rank_that_got_through_a_mismatched_op_closes_no_cycle(tmp_path: Path) -> None:
    """Rank 1 enters all_reduce #3 with other sizes; the transport lets ranks 1 and 3 through, and
    they wait at the next barrier for ranks 0 and 2, still in #3 waiting on rank 1. The desync is the
    cause, not a deadlock among ranks 0-2."""
    job = Job(4, backend="nccl")
    job.collective("0")
    job.collective("0")
    job.collective("0", shape=(4,), ranks=[0, 2], state="started")
    job.collective("0", shape=(8,), ranks=[1])
    job.collective("0", shape=(4,), ranks=[3])
    job.collective("0", "barrier", ranks=[1, 3], state="started")
    report = _report(job, tmp_path)
    assert report["verdict"] == "desync", report["summary"]
    assert _causes(report) == [(1, "mismatch")]
    assert report["cycles"] == []


def test_a_rank_that_left_early_while_the_others_streams_waited_is_named(tmp_path: Path) -> None:
    """Every host reached its exit: ranks 0, 2, 3 with all_reduce #4 still in flight on their
    streams, rank 1 after #3 (it skipped one). As on gloo, where its peers fail on the connection
    it closed: rank 1 left early."""
    job = Job(4, backend="nccl", counters=True)  # the exit records' progress counters say what was in flight
    for _ in range(3):
        job.collective("0")
    job.collective("0", ranks=[0, 2, 3], state="started")
    for rank in range(4):
        job.set(rank, reason="exit", reason_detail="normal interpreter exit", exit_record=True, threads=[])
    report = _report(job, tmp_path)
    assert report["verdict"] == "hang", report["summary"]
    assert _causes(report) == [(1, "exited")]
    assert report["root_causes"][0]["victims"] == [0, 2, 3]


def test_ranks_that_entered_the_op_and_left_are_not_what_holds_it(tmp_path: Path) -> None:
    """Rank 2 skipped all_reduce #4 and exited; ranks 1 and 3 entered it and exited with it in flight (its
    error ended their streams); rank 0 still waits in it. Only the rank that never entered holds it."""
    job = Job(4, backend="nccl", counters=True)
    for _ in range(3):
        job.collective("0")
    job.collective("0", ranks=[0, 1, 3], state="started")
    for rank in (1, 2, 3):
        job.set(rank, reason="exit", reason_detail="normal interpreter exit", exit_record=True, threads=[])
    report = _report(job, tmp_path)
    assert report["verdict"] == "hang", report["summary"]
    assert _causes(report) == [(2, "exited")]


def _device_timed_job(slow_rank: int, steps: int = 40, late_ns: int = 4_000_000) -> Job:
    """Blocking all_reduces on a stream backend: each host called at once (it runs ahead of its
    stream) and the ops completed by a poll (no host end), as flightrec records NCCL ops; only the
    device events say when each rank's stream reached the op and when it went on. `slow_rank`'s own
    device work makes it arrive `late_ns` late at every op."""
    job = Job(4, backend="nccl")
    step_ns = 20_000_000
    for seq in range(1, steps + 1):
        for rank in range(4):
            arrive = seq * step_ns + rank * 50_000 + (late_ns if rank == slow_rank else 0)
            job.collective("0", ranks=[rank], t_dev_start_ns=arrive, t_dev_end_ns=seq * step_ns + late_ns + 300_000)
            job._now -= 1_000_000  # every rank's host called at the same moment
        job._now += 1_000_000
    for rows in job.entries.values():
        for row in rows:
            row["t_complete_ns"] = None  # completed when a poll found it done: not a measured end
    return job


def test_ops_timed_on_the_device_name_the_slow_rank(tmp_path: Path) -> None:
    """On NCCL/HCCL a device op's host times hold no timing; its device events do (they were never
    read by the timing before: a slow GPU rank read healthy)."""
    report = _report(_device_timed_job(slow_rank=2), tmp_path / "slow")
    assert report["verdict"] == "slow", report["summary"]
    assert [s["rank"] for s in report["stragglers"]] == [2]
    assert report["stragglers"][0]["late_ms_median"] >= 3.5
    sampled = analyzers.load(str(tmp_path / "slow"), read="sampled").report()
    assert [s["rank"] for s in sampled["stragglers"]] == [2]
    healthy = _report(_device_timed_job(slow_rank=-1), tmp_path / "healthy")
    assert healthy["verdict"] == "healthy" and healthy["stragglers"] == []
    untimed = _device_timed_job(slow_rank=2)
    for rows in untimed.entries.values():
        for row in rows:
            row["t_dev_start_ns"] = row["t_dev_end_ns"] = None
    assert _report(untimed, tmp_path / "untimed")["stragglers"] == []  # host times alone cannot tell
