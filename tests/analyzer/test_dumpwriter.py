"""One model of a rank, two writers (fixtures/dumpwriter.py): the same recorded history written as
flightrec's dump and as PyTorch's must read back as the same ops, so that a scenario tested in one
format tests the analyzer on the same job in the other."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pandas as pd

import analyzers
from analyzers.reading.loader import load_folder
from fixtures import synth
from fixtures.builders import Job
from fixtures.dumpwriter import flightrec_dump

SAME = ["rank", "id", "group", "kind", "peer", "state", "in_shapes", "out_shapes", "site"]


def _job() -> Job:
    """Two groups, pipeline sends, a wrapped ring on rank 1, and a hang: rank 3 never enters seq 5."""
    job = Job(4)
    job.group("1", [0, 1], "tp0")
    job.group("2", [2, 3], "tp1")
    for step in range(3):
        job.collective("0", "all_reduce")
        job.collective("1", "all_reduce", ranks=[0, 1], shape=(2, 3))
        job.collective("2", "reduce_scatter_tensor", ranks=[2, 3], shape=(6,))
        job.send("0", 0, 2, is_async=True)
        job.recv("0", 2, 0, is_async=True)
        if step == 2:
            job.send("0", 1, 3)
            job.recv("0", 3, 1)
    job.collective("0", "all_gather_into_tensor", ranks=[0, 1, 2], state="started")
    job.ring(1, 5)
    return job


def _both(tmp_path: Path) -> tuple[Path, Path, Job]:
    job = _job()
    ours = job.write(tmp_path / "flightrec")
    theirs = tmp_path / "torch"
    theirs.mkdir()
    for r in range(job.world_size):
        (theirs / f"nccl_trace_rank_{r}").write_bytes(pickle.dumps(job.torch_dump(r)))
    return ours, theirs, job


def _comparable(entries: pd.DataFrame) -> pd.DataFrame:
    out = entries[SAME].astype(str).reset_index(drop=True)
    coll = entries["kind"].to_numpy() == "coll"
    out["coll_seq"] = np.where(coll, entries["seq"].to_numpy(), -1)
    enq = entries["t_enqueue_ns"].astype("int64")
    out["since_first"] = (enq - enq.groupby(entries["rank"]).transform("min")).to_numpy()
    done = entries["t_complete_ns"].astype("Int64")
    out["duration"] = (done - enq).astype(str).to_numpy()
    return out


def test_both_formats_read_back_as_the_same_ops(tmp_path: Path) -> None:
    ours, theirs, job = _both(tmp_path)
    a, b = load_folder(ours).entries, load_folder(theirs).entries
    assert len(a) == len(b) == sum(len(job.entries[r]) for r in (0, 2, 3)) + 5
    pd.testing.assert_frame_equal(_comparable(a), _comparable(b))
    # the wrapped ring keeps its newest 5 ops in both
    kept = b[b["rank"] == 1]
    assert kept["id"].tolist() == list(range(len(job.entries[1]) - 5, len(job.entries[1])))
    # PyTorch numbers p2p ops per group, counting those its ring dropped: rank 0's third send stays number 3
    job.ring(0, 2)
    p2p = [e["p2p_seq_id"] for e in job.torch_dump(0)["entries"] if e["is_p2p"]]
    assert p2p == [3]


def test_both_formats_name_the_same_culprit(tmp_path: Path) -> None:
    ours, theirs, _ = _both(tmp_path)
    for folder in (ours, theirs):
        report = analyzers.load(folder).report()
        assert report["verdict"] == "hang", folder
        assert [(c["rank"], c["kind"]) for c in report["root_causes"]] == [(3, "not_entered")], folder


def test_synth_and_builders_share_the_writer() -> None:
    """A synthetic rank goes through the same writer: its dump is what `flightrec_dump` makes of its model."""
    layout = synth.Layout.of(64)
    ring = synth.rank_ring(layout, layout.culprit, 300, "mismatch")
    dump = flightrec_dump(ring)
    assert dump["recorded"] == ring.recorded and dump["dropped"] == ring.recorded - 300
    assert [synth.WRONG_SHAPE] in dump["templates"]["in_shapes"]["values"]
