"""Issue 20: positions with no majority, coalesced sizes, and verdicts without evidence.

Who diverged at a position with no majority is told by aligning the ranks' op streams (an extra or
missing op is a one-step shift), never by rank number; when the streams cannot tell, every rank is
named. A folder where an expected rank left no current dump is `inconclusive`, not `healthy`.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

import analyzers
from analyzers.reporting.render import text_report
from fixtures import builders
from fixtures.builders import Job
from fixtures.foreign import make as foreign
from fixtures.launch import launch

EXTRA_OP_JOB = Path(builders.__file__).resolve().parent / "jobs" / "extra_op.py"


def _report(folder: Path) -> dict:
    return analyzers.load(folder).report()


def _causes(report: dict) -> list[tuple[int, str]]:
    return [(c["rank"], c["kind"]) for c in report["root_causes"]]


@pytest.mark.parametrize("extra_rank", [0, 1])
def test_tutorial_extra_all_reduce_blames_the_rank_that_issued_it(extra_rank: int, tmp_path: Path) -> None:
    """PyTorch's tutorial (rank 0 issues one extra all_reduce): rank 0 is blamed, and mirrored, rank 1 is."""
    report = _report(builders.extra_op(tmp_path / "d", extra_rank))
    other = 1 - extra_rank
    assert report["verdict"] == "desync", report["summary"]
    assert _causes(report) == [(extra_rank, "mismatch")], report["root_causes"]
    (cause,) = report["root_causes"]
    assert (cause["seq"], cause["op"], cause["site"]) == (3, "all_reduce", "tutorial.py:36 in <module>")
    assert f"rank {extra_rank}'s op stream has one extra all_reduce at seq 3" in cause["detail"]
    assert f"rank {other} never issues a seq 5" in cause["detail"]
    (m,) = report["mismatches"]
    assert (m["ranks"], m["tie"], m["field"]) == ([extra_rank], True, "shapes")
    assert m["expected"] == "[[3, 4]] -> [[3, 4]]" and "one extra all_reduce at seq 3" in m["alignment"]
    assert report["summary"].startswith(f"desync: rank {extra_rank} mismatch in all_reduce (group 0, seq 3)")


def test_tutorial_as_pytorch_nccl_dumps_blames_rank_0(tmp_path: Path) -> None:
    """The tutorial as its readers see it: PyTorch's own NCCL recorder pickles (`fr_trace` input). Rank 0's
    seq 3 is the (4, 5) all_reduce; its seq 5 is still started when the job is stuck; rank 1 completed 4 ops."""
    cfg = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}}
    pg = ("0", "default_pg")
    sizes = {0: [[3, 4]] * 2 + [[4, 5]] + [[3, 4]] * 2, 1: [[3, 4]] * 4}
    for r, per_op in sizes.items():
        entries = [foreign.torch_entry(i, pg, "nccl:all_reduce", i + 1, sizes=[size],
                                       state="started" if r == 0 and i == 4 else "completed")
                   for i, size in enumerate(per_op)]
        foreign.write_pickle(tmp_path, f"nccl_trace_rank_{r}", {"version": "2.10", "comm_lib_version": "2.26.2",
                                                                 "pg_config": cfg, "pg_status": {}, "entries": entries})
    report = _report(tmp_path)
    assert report["verdict"] == "desync", report["summary"]
    assert _causes(report) == [(0, "mismatch")], report["root_causes"]
    assert "rank 0's op stream has one extra all_reduce at seq 3" in report["root_causes"][0]["detail"]


def test_extra_op_of_a_whole_camp(tmp_path: Path) -> None:
    """Four ranks, two against two: ranks 1 and 3 issue an extra broadcast; the two camps have no majority."""
    job = Job(4)
    builders._warmup(job, 2)
    job.collective("0", "broadcast", shape=(6,), ranks=[1, 3], root=0)
    job.collective("0", "all_reduce", shape=(4,))  # seq 3 on 0 and 2, seq 4 on 1 and 3
    job.collective("0", "barrier")
    job.collective("0", "all_reduce", ranks=[0, 2])
    job.collective("0", "all_reduce", ranks=[1, 3], state="started")
    report = _report(job.write(tmp_path / "d"))
    assert report["verdict"] == "desync", report["summary"]
    assert sorted(_causes(report)) == [(1, "mismatch"), (3, "mismatch")], report["root_causes"]
    for cause in report["root_causes"]:
        assert "ranks 1, 3's op streams have one extra broadcast at seq 3" in cause["detail"]
    assert {tuple(m["ranks"]) for m in report["mismatches"]} == {(1, 3)}  # every shifted position, same culprits


def test_equal_evidence_names_both_and_says_so(scenario) -> None:
    """One position differs and nothing else tells the two ranks apart: both named, neither by number."""
    report = _report(scenario("tie_undecided"))
    assert report["verdict"] == "desync"
    (m,) = report["mismatches"]
    assert (m["ranks"], m["tie"], m["expected"]) == ([0, 1], True, "")
    assert "does not tell which one diverged" in m["alignment"]
    assert sorted(_causes(report)) == [(0, "mismatch"), (1, "mismatch")]
    for cause in report["root_causes"]:
        assert cause["ranks"] == [0, 1] and "cannot decide" in cause["detail"]
    assert report["summary"].startswith("desync: ranks 0-1 disagree in all_reduce (group 0, seq 3)")
    assert "cannot tell which one diverged" in report["summary"] and "more root cause" not in report["summary"]


def test_a_swapped_op_in_a_longer_stream_is_not_taken_for_a_shift(tmp_path: Path) -> None:
    """Rank 0 has a different op at seq 3 and is two ops ahead at the end: no single extra op explains it."""
    job = Job(2)
    builders._warmup(job, 2)
    job.collective("0", "all_reduce", shape=(8,), ranks=[0])
    job.collective("0", "all_reduce")
    job.collective("0", "all_reduce", ranks=[0])
    job.collective("0", "all_reduce", ranks=[0], state="started")
    report = _report(job.write(tmp_path / "d"))
    (m,) = report["mismatches"]
    assert m["ranks"] == [0, 1] and m["expected"] == ""


@pytest.mark.parametrize(("src", "dst"), [(0, 1), (1, 0)])
def test_p2p_payload_mismatch_names_sender_and_receiver(src: int, dst: int, tmp_path: Path) -> None:
    job = Job(2)
    job.send("0", src, dst, shape=(4,))
    job.recv("0", dst, src, shape=(5,))
    report = _report(job.write(tmp_path / "d"))
    assert report["verdict"] == "desync"
    assert sorted(_causes(report)) == [(0, "mismatch"), (1, "mismatch")], report["root_causes"]
    for cause in report["root_causes"]:
        assert cause["ranks"] == [0, 1]
        assert f"rank {src} sent shapes '[[4]]' to rank {dst}" in cause["detail"]
        assert "cannot tell which side is wrong" in cause["detail"]
    assert report["summary"].startswith("desync: ranks 0-1 disagree in send/recv")


@pytest.mark.parametrize(("op", "right", "wrong"), [
    # all_gather: output k must be input k x group size; rank 1's outputs total the same 24 elements
    ("all_gather_into_tensor_coalesced", {"in_shapes": [[4], [8]], "out_shapes": [[8], [16]]},
     {"in_shapes": [[4], [8]], "out_shapes": [[12], [12]]}),
    # reduce_scatter: input k must be output k x group size; rank 1's inputs total the same 24 elements
    ("reduce_scatter_tensor_coalesced", {"in_shapes": [[8], [16]], "out_shapes": [[4], [8]]},
     {"in_shapes": [[12], [12]], "out_shapes": [[4], [8]]}),
])
def test_size_mismatch_inside_a_coalesced_op_is_found(op: str, right: dict, wrong: dict, tmp_path: Path) -> None:
    """One coalesced op carrying two tensors: rank 1's sizes are wrong tensor by tensor though their totals agree."""
    job = Job(2)
    for r, shapes in ((0, right), (1, wrong)):
        job.collective("0", op, ranks=[r], in_dtypes=["float32"] * 2, out_dtypes=["float32"] * 2, **shapes)
    report = _report(job.write(tmp_path / "d"))
    assert report["verdict"] == "desync", report["summary"]
    (m,) = report["mismatches"]
    assert (m["seq"], m["field"]) == (1, "shapes")
    assert "for tensor(s) [0, 1]" in next(v for v, rs in m["values"].items() if rs == [1])
    assert "for tensor" not in next(v for v, rs in m["values"].items() if rs == [0])


def test_coalesced_block_size_mismatch_with_no_majority_names_both(tmp_path: Path) -> None:
    """A coalescing block of two all_reduces (one unit, one seq) whose second op's size differs between the two
    ranks: compared op by op in record order, and with nothing else to tell them apart, both are named."""
    job = Job(2)
    for r in (0, 1):
        unit = len(job.entries[r])
        job.entry(r, group="0", seq=1, op="all_reduce", unit=unit, in_shapes=[[4]], out_shapes=[[4]], reduce_op="SUM")
        job.entry(r, group="0", seq=1, op="all_reduce", unit=unit, in_shapes=[[6] if r else [8]],
                  out_shapes=[[6] if r else [8]], reduce_op="SUM")
    (m,) = _report(job.write(tmp_path / "d"))["mismatches"]
    assert (m["seq"], m["field"], m["ranks"]) == (1, "shapes", [0, 1])
    assert set(m["values"]) == {"[[4]] -> [[4]] + [[8]] -> [[8]]", "[[4]] -> [[4]] + [[6]] -> [[6]]"}


def test_missing_dump_that_nobody_waits_for_is_inconclusive(scenario) -> None:
    report = _report(scenario("missing_idle"))
    assert report["verdict"] == "inconclusive"
    assert report["root_causes"] == [] and report["waits"] == []
    summary = report["summary"]
    assert summary.startswith("inconclusive: no rank is waiting, but 1 expected rank (3) left no current dump")
    assert "rank 3: no dump file" in summary
    assert text_report(report).splitlines()[0] == "INCONCLUSIVE: " + summary.split(": ", 1)[1]


def test_unreadable_dump_that_nobody_waits_for_is_inconclusive(scenario) -> None:
    folder = scenario("healthy")
    (folder / "rank-00002.json.gz").write_bytes(gzip.compress(b"{not json"))
    report = _report(folder)
    assert report["verdict"] == "inconclusive" and report["ranks"]["unreadable"] == [2]
    assert "rank 2: its dump is unreadable" in report["summary"]


def test_stale_dump_that_nobody_waits_for_is_inconclusive(tmp_path: Path) -> None:
    job = Job(3)
    builders._warmup(job, 3)
    folder = job.write(tmp_path / "d")
    path = folder / "rank-00001.json.gz"
    dump = json.loads(gzip.decompress(path.read_bytes()))
    dump["dump_time_ns"] -= 120 * 10**9
    path.write_bytes(gzip.compress(json.dumps(dump).encode()))
    report = _report(folder)
    assert report["ranks"]["stale"] == [1]
    assert report["verdict"] == "inconclusive" and "rank 1: " in report["summary"], report["summary"]


def test_every_rank_dumped_and_idle_is_still_healthy(scenario) -> None:
    report = _report(scenario("healthy"))
    assert report["verdict"] == "healthy" and report["summary"].startswith("healthy:")


@pytest.mark.parametrize("extra_shape", ["4,3", "3,4"])
def test_real_tutorial_job_blames_rank_0(extra_shape: str, tmp_path: Path) -> None:
    """The tutorial's program as a real 2-rank gloo job under torchrun (FLIGHTREC=1): rank 0 diverged. With a
    (4, 3) extra tensor the shapes disagree at seq 3; with (3, 4) nothing but the call site tells the ops apart."""
    out = tmp_path / "dumps"
    result = launch(EXTRA_OP_JOB, 2, out, ["--extra-shape", extra_shape], env={"FLIGHTREC_TIMEOUT": "2"},
                    wait_for_ranks=[0, 1], timeout_s=90)
    assert not result.timed_out, result.output[-3000:]
    report = _report(out)
    assert report["verdict"] == "desync", report["summary"]
    assert _causes(report) == [(0, "mismatch")], report["root_causes"]
    (cause,) = report["root_causes"]
    assert cause["seq"] == 3 and "rank 0's op stream has one extra all_reduce at seq 3" in cause["detail"]
    assert cause["site"] and cause["site"].endswith("extra_op.py:49 in main")  # the `if rank == args.extra_rank` op
    (m,) = report["mismatches"]
    assert m["field"] == ("shapes" if extra_shape == "4,3" else "site") and m["ranks"] == [0]
    assert {w["rank"]: w["seq"] for w in report["waits"]} == {0: 5}


def _same_shape_job(extra_site: str | None, hang_rank: int = 0) -> Job:
    """2 ranks; rank `hang_rank` issues one extra all_reduce of the usual shape at seq 3 from `extra_site`."""
    job = Job(2)
    other = 1 - hang_rank
    for _ in range(2):
        job.collective("0", "all_reduce", site="loop.py:10 in step")
    job.collective("0", "all_reduce", ranks=[hang_rank], site=extra_site)
    job.collective("0", "all_reduce", site="loop.py:20 in step")
    job.collective("0", "all_reduce", ranks=[other], site="loop.py:20 in step")
    job.collective("0", "all_reduce", ranks=[hang_rank], site="loop.py:20 in step", state="started")
    return job


@pytest.mark.parametrize("extra_rank", [0, 1])
def test_same_shape_extra_op_is_told_by_its_call_site(extra_rank: int, tmp_path: Path) -> None:
    report = _report(_same_shape_job("log.py:5 in log_loss", extra_rank).write(tmp_path / "d"))
    assert report["verdict"] == "desync", report["summary"]
    assert _causes(report) == [(extra_rank, "mismatch")], report["root_causes"]
    (m,) = report["mismatches"]
    assert (m["field"], m["seq"], m["ranks"], m["expected"]) == ("site", 3, [extra_rank], "loop.py:20 in step")
    assert "their call sites tell them apart" in m["alignment"]
    assert report["root_causes"][0]["site"] == "log.py:5 in log_loss"


def test_call_sites_that_agree_leave_an_ordinary_hang(tmp_path: Path) -> None:
    """The same streams with the extra op at the usual site (or an op issued from C++, no site): nothing tells it
    from rank 1 not entering seq 5, so rank 1 stays `not_entered`."""
    for name, site in (("same", "loop.py:20 in step"), ("cpp", None)):
        job = _same_shape_job(site)
        if site is None:
            job.entries[0][2].update(site=None, source="c++")
        report = _report(job.write(tmp_path / name))
        assert report["verdict"] == "hang", report["summary"]
        assert _causes(report) == [(1, "not_entered")], report["root_causes"]


def test_rank_dependent_call_sites_are_no_shift(tmp_path: Path) -> None:
    """Rank 0 calls broadcast from another line than rank 1 every step (an `if rank == 0` branch), and rank 1 is
    stuck in compute: the sites differ but shifting does not line them up, so no desync is claimed."""
    job = Job(2)
    for _ in range(3):
        for r in (0, 1):
            job.collective("0", "broadcast", ranks=[r], root=0, site=f"train.py:{10 if r == 0 else 12} in step")
        job.collective("0", "all_reduce", site="train.py:20 in step")
    job.collective("0", "broadcast", ranks=[0], root=0, site="train.py:10 in step", state="started")
    report = _report(job.write(tmp_path / "d"))
    assert report["verdict"] == "hang" and _causes(report) == [(1, "not_entered")], report["summary"]
