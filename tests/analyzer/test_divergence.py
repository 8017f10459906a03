"""Where op streams diverged: per call site, the ops each rank issued next to its peers' (report `divergence`)."""

from __future__ import annotations

from pathlib import Path

import analyzers
from analyzers.constants import CPP_SITE
from analyzers.reporting.render import text_report
from fixtures.builders import Job, extra_op

A, B, C = "train.py:10 in step", "train.py:12 in step", "train.py:14 in step"


def _loop(job: Job, steps: int, skip: tuple[int, int] | None = None) -> None:
    """`steps` steps of three all_reduces (sites A, B, C); `skip` = (rank, step): that rank skips A once."""
    for step in range(steps):
        ranks = [r for r in range(job.world_size) if skip is None or (r, step) != skip]
        job.collective("0", "all_reduce", site=A, ranks=ranks)
        job.collective("0", "all_reduce", site=B)
        job.collective("0", "all_reduce", site=C)


def _skipped(job: Job, rank: int = 3, step: int = 3, steps: int = 8) -> None:
    """`rank` skips A once at `step`: its later ops pair with its peers' previous ones (same sizes), so
    its peers end one op later, waiting in C of the last step for an op it never issues."""
    _loop(job, steps - 1, skip=(rank, step))
    peers = [r for r in range(job.world_size) if r != rank]
    job.collective("0", "all_reduce", site=A)
    job.collective("0", "all_reduce", site=B)
    job.collective("0", "all_reduce", site=C, ranks=[rank])  # paired with its peers' B
    job.collective("0", "all_reduce", site=C, ranks=peers, state="started")


def test_a_rank_that_skipped_one_all_reduce_at_one_site_is_named_with_the_site_and_counts(tmp_path: Path) -> None:
    job = Job(4)
    _skipped(job)
    job.set(3, reason="exit")  # it finished its loop and exited
    analysis = analyzers.load(job.write(tmp_path))
    report = analysis.report()
    (item,) = report["divergence"]
    assert {k: item[k] for k in ("rank", "group", "op", "site", "issued", "peers_issued", "peers", "from_seq")} == {
        "rank": 3, "group": "0", "op": "all_reduce", "site": A, "issued": 7, "peers_issued": 8, "peers": [0, 1, 2],
        "from_seq": 1}
    # steps 0-2 are seqs 1-9: at seq 10 it issued B where its peers issued A, and everything after lines up shifted
    assert item["first_shift"]["seq"] == 10 and item["first_shift"]["offset"] == 1
    assert item["first_shift"]["site"] == B and item["first_shift"]["peers_site"] == A
    text = text_report(report, analysis.graph)
    first_screen = "\n".join(text.splitlines()[:30])
    assert "rank 3 issued 7 all_reduce at train.py:10 in step where its peers (ranks 0-2) issued 8" in first_screen


def test_a_skipping_rank_still_running_is_named_from_its_shifted_stream(tmp_path: Path) -> None:
    """Not exited, behind by one op: the change in its alignment with its peers (sites) shows it diverged."""
    job = Job(4)
    _skipped(job)
    item = analyzers.load(job.write(tmp_path)).report()["divergence"]
    assert [(d["rank"], d["site"], d["issued"], d["peers_issued"]) for d in item] == [(3, A, 7, 8)]


def test_a_ring_that_wrapped_makes_no_false_divergence(tmp_path: Path) -> None:
    """Rank 1 holds only its last 10 ops: counted from the oldest seq every rank holds, all agree."""
    job = Job(4)
    _loop(job, 12)
    job.ring(1, 10)
    job.ring(2, 20)
    report = analyzers.load(job.write(tmp_path)).report()
    assert report["divergence"] == []
    assert not any("different numbers" in g for g in report["gaps"])


def test_a_ring_that_wrapped_still_shows_a_skip_inside_the_common_window(tmp_path: Path) -> None:
    job = Job(4)
    _skipped(job, step=9, steps=12)
    job.set(3, reason="exit")
    job.ring(1, 12)  # holds its last 12 ops: seqs 25-36
    (item,) = analyzers.load(job.write(tmp_path)).report()["divergence"]
    assert (item["rank"], item["site"], item["from_seq"]) == (3, A, 25)
    assert (item["issued"], item["peers_issued"]) == (3, 4)  # from seq 25: A at 25, 28, 31, 34 on its peers


def test_a_rank_blocked_at_an_earlier_position_is_a_hang_not_a_divergence(tmp_path: Path) -> None:
    """Rank 3 is stuck computing before A of the last step: its peers issued one A more, but it may yet."""
    job = Job(4)
    _loop(job, 6)
    job.collective("0", "all_reduce", site=A, ranks=[0, 1, 2], state="started")
    job.stack(3, ["train.py:140 in <module>", "train.py:96 in step", "data.py:88 in load_batch"])
    report = analyzers.load(job.write(tmp_path)).report()
    assert report["verdict"] == "hang" and report["divergence"] == []


def test_a_rank_that_crashed_early_is_not_a_divergence(tmp_path: Path) -> None:
    job = Job(4)
    _loop(job, 6)
    job.collective("0", "all_reduce", site=A, ranks=[0, 1, 2], state="started")
    job.set(3, reason="exception", exception={"type": "ValueError", "message": "bad batch"})
    assert analyzers.load(job.write(tmp_path)).report()["divergence"] == []


def test_ranks_that_call_one_collective_from_different_lines_do_not_diverge(tmp_path: Path) -> None:
    """`if rank == 0: all_reduce(x) else: all_reduce(x)` on two lines, and rank 0 stuck before the last one."""
    job = Job(4)
    for _ in range(6):
        job.collective("0", "all_reduce", site="train.py:20 in step", ranks=[0])
        job.collective("0", "all_reduce", site="train.py:22 in step", ranks=[1, 2, 3])
    job.collective("0", "all_reduce", site="train.py:22 in step", ranks=[1, 2, 3], state="started")
    assert analyzers.load(job.write(tmp_path)).report()["divergence"] == []


def test_cpp_issued_ops_are_counted_under_their_group_and_op(tmp_path: Path) -> None:
    """DDP's Reducer: no Python call site. A rank that skipped one backward and exited issued one fewer."""
    job = Job(4)
    cpp = {"source": "c++", "api": "c++"}
    job.collective("0", "broadcast", **cpp)
    for step in range(5):
        job.collective("0", "all_reduce", ranks=[0, 1, 3] if step == 3 else None, **cpp)
    job.collective("0", "all_reduce", ranks=[2], **cpp)  # its last step's, paired with its peers' previous one
    job.collective("0", "all_reduce", ranks=[0, 1, 3], state="started", **cpp)
    for recorded in job.entries.values():
        for entry in recorded:
            entry["site"] = ""  # the recorder knows no Python call site of a C++-issued op
    job.set(2, reason="exit")
    analysis = analyzers.load(job.write(tmp_path))
    report = analysis.report()
    assert [(d["rank"], d["op"], d["site"], d["issued"], d["peers_issued"]) for d in report["divergence"]] == [
        (2, "all_reduce", CPP_SITE, 5, 6)]
    assert f"rank 2 issued 5 all_reduce {CPP_SITE} where its peers (ranks 0-1, 3) issued 6" in text_report(report)


def test_the_tutorials_extra_op_is_told_at_its_site_and_in_the_root_cause(tmp_path: Path) -> None:
    """Two ranks: no majority count; the stream alignment that named rank 0 names the side that differs."""
    report = analyzers.load(extra_op(tmp_path)).report()
    assert [(d["rank"], d["site"], d["issued"], d["peers_issued"]) for d in report["divergence"]] == [
        (0, "tutorial.py:36 in <module>", 1, 0)]
    cause = report["root_causes"][0]
    assert cause["kind"] == "mismatch" and "rank 0 issued 1 all_reduce at tutorial.py:36" in cause["detail"]


def test_two_ranks_with_no_alignment_name_nobody(tmp_path: Path) -> None:
    """Rank 0 exited one A short of rank 1 and nothing else tells them apart: neither is named."""
    job = Job(2)
    _loop(job, 3)
    job.collective("0", "all_reduce", site=A, ranks=[1], state="started")
    job.set(0, reason="exit")
    report = analyzers.load(job.write(tmp_path)).report()
    assert report["divergence"] == []
    assert any("no majority or stream alignment tells which one diverged" in g for g in report["gaps"])


def test_a_skip_on_ranks_that_call_from_different_lines_is_counted_without_a_site(tmp_path: Path) -> None:
    """Rank 0 calls the op from its own line; rank 3 skips one call and exits: no one site holds the
    difference, so its count is told over all its sites (`site` null)."""
    job = Job(4)
    for step in range(5):
        job.collective("0", "all_reduce", site="train.py:20 in step", ranks=[0])
        job.collective("0", "all_reduce", site="train.py:22 in step", ranks=[1, 2] + ([3] if step != 2 else []))
    job.collective("0", "all_reduce", site="train.py:22 in step", ranks=[3])  # its last, paired with their 5th
    job.collective("0", "all_reduce", site="train.py:20 in step", ranks=[0], state="started")
    job.collective("0", "all_reduce", site="train.py:22 in step", ranks=[1, 2], state="started")
    job.set(3, reason="exit")
    report = analyzers.load(job.write(tmp_path)).report()
    assert [(d["rank"], d["site"], d["issued"], d["peers_issued"]) for d in report["divergence"]] == [(3, None, 5, 6)]
    assert "rank 3 issued 5 all_reduce (its call sites differ from its peers')" in text_report(report)


def test_ops_of_unknown_kind_beside_known_ones_are_not_counted_apart(tmp_path: Path) -> None:
    """Rank 1 recorded a C++ op whose kind it could not tell; the others know it is an all_reduce: counting
    it as another op would make rank 1 look one all_reduce short."""
    job = Job(4)
    for _ in range(4):
        job.collective("0", "all_reduce", source="c++", api="c++")
    for r in range(4):
        job.entry(r, group="0", seq=5, kind="coll", op="unknown" if r == 1 else "all_reduce", source="c++")
    report = analyzers.load(job.write(tmp_path)).report()
    assert report["divergence"] == []
    assert any("unknown kind" in g for g in report["gaps"])
