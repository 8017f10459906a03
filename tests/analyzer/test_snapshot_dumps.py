"""Snapshots (FLIGHTREC_SNAPSHOT_S) of a running job: an op in flight younger than the rank's timeout
is not a wait; one older is (the watchdog would have replaced the snapshot with a `timeout` dump)."""

from __future__ import annotations

from pathlib import Path

import analyzers
from fixtures.builders import Job


def _job(reason: str, timeout_s: float) -> Job:
    job = Job(2)
    for _ in range(3):
        job.collective("0")
    job.collective("0", ranks=[0], state="started")  # rank 0 is in it; rank 1 is still computing
    for rank in range(2):
        job.set(rank, reason=reason, settings={"buffer": 1000, "timeout_s": timeout_s, "snapshot_s": 5})
    return job


def _report(job: Job, folder: Path) -> dict:
    return analyzers.load(job.write(folder)).report()


def test_an_op_in_flight_in_a_snapshot_is_not_a_hang(tmp_path: Path) -> None:
    report = _report(_job("snapshot", 60), tmp_path)
    assert report["verdict"] == "healthy", report["summary"]
    assert any(g.startswith("snapshots of a running job") for g in report["gaps"]), report["gaps"]


def test_the_same_op_in_a_timeout_dump_is_a_hang(tmp_path: Path) -> None:
    report = _report(_job("timeout", 60), tmp_path)
    assert report["verdict"] == "hang" and [c["rank"] for c in report["root_causes"]] == [1]


def test_an_op_older_than_its_timeout_is_a_hang_even_in_a_snapshot(tmp_path: Path) -> None:
    report = _report(_job("snapshot", 1e-6), tmp_path)
    assert report["verdict"] == "hang" and [c["rank"] for c in report["root_causes"]] == [1]


def test_snapshots_say_how_old_each_ranks_evidence_is(tmp_path: Path) -> None:
    """Snapshots of a running job are written at different moments: the report says, per rank, how long
    before the newest dump each was taken, and the first screen gives the spread and the oldest rank."""
    from analyzers.reporting.render import text_report

    job = _job("snapshot", 60)
    newest = job.dump(0)["dump_time_ns"]
    for rank, age_s in ((0, 0.0), (1, 3.5)):
        job.set(rank, dump_time_ns=newest - int(age_s * 1e9))
    analysis = analyzers.load(job.write(tmp_path))
    report = analysis.report()
    assert report["ranks"]["evidence_age_s"] == {"0": 0.0, "1": 3.5}
    assert report["ranks"]["running"] == [0, 1]
    evidence = text_report(report, analysis.graph).splitlines()[1]
    assert "snapshots of a running job, 0-3.5 s old at the newest dump" in evidence and "oldest: rank 1" in evidence


def test_dumps_of_an_ended_job_carry_no_snapshot_age_line(tmp_path: Path) -> None:
    from analyzers.reporting.render import text_report

    analysis = analyzers.load(_job("timeout", 60).write(tmp_path))
    report = analysis.report()
    assert report["ranks"]["running"] == [] and set(report["ranks"]["evidence_age_s"]) == {"0", "1"}
    assert "snapshots" not in text_report(report, analysis.graph).splitlines()[1]
