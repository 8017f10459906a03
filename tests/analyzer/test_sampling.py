"""A sampled read (analyzers/reading/sample.py): each ring's recent ops for the diagnosis and a bounded
timing sample, so that memory stays bounded at any world size; the slow rank and its cost come out as
from every entry, within the sampling error."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import analyzers
from analyzers.reading import sample
from analyzers.timing.blocking_ops import _blocking_ops
from analyzers.timing.lateness import collective_lateness
from fixtures import synth

RANKS = 64


@pytest.fixture(scope="module")
def straggler(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return synth.write_folder(tmp_path_factory.mktemp("sampling") / "straggler", RANKS, 2000, "straggler")


def test_the_slow_rank_and_its_cost_match_the_full_read(straggler: Path) -> None:
    full = analyzers.load(straggler).report()
    sampled = analyzers.load(straggler, read="sampled").report()
    assert sampled["read"] == "sampled" and sampled["verdict"] == full["verdict"] == "slow"
    assert synth.check(sampled, RANKS, "straggler") == []
    a, b = full["stragglers"][0], sampled["stragglers"][0]
    assert (a["rank"], a["pattern"]) == (b["rank"], b["pattern"])
    assert b["cost_ms"] == pytest.approx(a["cost_ms"], rel=0.15)  # scaled by the stride: an estimate of the whole
    assert b["late_ms_when_late"] == pytest.approx(a["late_ms_when_late"], rel=0.15)
    assert any("timing from a sample" in g for g in sampled["gaps"])


def test_kept_ops_carry_the_gap_taken_on_the_whole_ring(straggler: Path) -> None:
    full = _blocking_ops(analyzers.load(straggler).entries)
    timing = analyzers.load(straggler, read="sampled").timing_entries
    assert timing is not None
    kept = _blocking_ops(timing)
    key = ["rank", "group", "seq", "op", "peer"]
    joined = kept.astype({"group": str, "op": str}).merge(full.astype({"group": str, "op": str}), on=key,
                                                           suffixes=("", "_full"))
    assert len(joined) == len(kept) > 0
    np.testing.assert_array_equal(joined["gap_ns"].to_numpy(), joined["gap_ns_full"].to_numpy())


def test_sampled_instances_are_complete_and_evenly_spaced(straggler: Path) -> None:
    analysis = analyzers.load(straggler, read="sampled")
    timing = analysis.timing_entries
    assert timing is not None
    coll = timing[timing["kind"] == "coll"]
    assert (coll["seq"] % coll["weight"] == 0).all()
    sizes = dict(zip(analysis.groups["group"].astype(str), analysis.groups["size"].astype(int), strict=True))
    timed = collective_lateness(timing, sizes)
    in_complete = (timed["channel"].astype(str).str.contains(" ") == False).sum()  # noqa: E712 - collectives
    assert in_complete >= 0.9 * len(coll)  # members decide alone, yet nearly every kept op finds all its peers
    seqs = np.sort(coll[(coll["rank"] == 0) & (coll["group"] == "1")]["seq"].unique())
    assert len(seqs) >= sample.SAMPLE_PER_CHANNEL // 2 and len(np.unique(np.diff(seqs))) == 1  # every n-th


def test_memory_stays_bounded_when_rings_grow(tmp_path: Path) -> None:
    """Rows kept per rank do not grow with the ring: about SAMPLE_PER_CHANNEL per channel, plus the recent ops."""
    kept = {}
    for entries in (1000, 4000):
        folder = synth.write_folder(tmp_path / str(entries), 16, entries, "stall")
        timing = analyzers.load(folder, read="sampled").timing_entries
        assert timing is not None
        kept[entries] = timing.groupby("rank").size().max()
    channels = 3 + 4  # TP, DP, world, and up to four pipeline directions
    assert kept[4000] <= 2 * sample.SAMPLE_PER_CHANNEL * channels
    assert kept[4000] < 1.5 * kept[1000]


@pytest.mark.parametrize("fault", ["stall", "mismatch"])
def test_hang_verdicts_match_the_other_reads(tmp_path: Path, fault: str) -> None:
    folder = synth.write_folder(tmp_path / fault, RANKS, 300, fault)
    keys = []
    for read in ("full", "summary", "sampled"):
        report = analyzers.load(folder, read=read).report()
        assert synth.check(report, RANKS, fault) == [], read
        keys.append((report["verdict"], [(c["rank"], c["kind"]) for c in report["root_causes"]], report["victims"]))
    assert keys[0] == keys[1] == keys[2]


def test_pytorch_dumps_are_read_whole(tmp_path: Path) -> None:
    """No summary in PyTorch's format: every row is kept, and the report is the full one."""
    folder = synth.write_folder(tmp_path / "torch", 16, 300, "stall", "torch")
    full = analyzers.load(folder).report()
    sampled = analyzers.load(folder, read="sampled")
    assert len(sampled.entries) == len(analyzers.load(folder).entries)
    assert sampled.report()["root_causes"] == full["root_causes"]
