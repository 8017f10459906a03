"""Synthetic jobs (fixtures/synth.py): the analyzer names the injected culprit, in both formats.

The culprit is computed by the generator's layout, never written here, and each fault moves it
(stall: not_entered, mismatch: mismatch, straggler: slow); PyTorch's own analyzer must accept the
pickles we call PyTorch-format.
"""

from __future__ import annotations

import gzip
import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

import analyzers
from fixtures import synth
from flightrec.format.packed import pack, plain
from tests.helpers import columns

RANKS = 64  # TP 8 x PP 4 x DP 2: every group kind, p2p included
ENTRIES = 300  # rings wrap on the middle stages


@pytest.mark.parametrize("fmt", synth.FORMATS)
@pytest.mark.parametrize("fault", synth.FAULTS)
def test_analyzer_names_the_injected_culprit(tmp_path: Path, fault: str, fmt: str) -> None:
    folder = synth.write_folder(tmp_path / f"{fault}-{fmt}", RANKS, ENTRIES, fault, fmt)
    report = analyzers.load(folder).report()
    assert synth.check(report, RANKS, fault) == []
    want = synth.expected(RANKS, fault)
    if fault != "straggler":
        assert report["root_causes"][0]["rank"] == want["culprit"]
    if fault != "straggler" and fmt == "flightrec":
        # PyTorch's format numbers p2p per group, so wrapped rings can mis-pair sends (a stated gap)
        assert set(report["victims"]) == set(range(RANKS)) - {want["culprit"]}
        assert len(report["root_causes"]) == 1


def test_pytorch_format_transfers_numbered_from_one_per_pair(tmp_path: Path) -> None:
    """PyTorch's format has no per-pair sequence: the reader anchors each pair at its last completed
    transfer (around 2^20), and the loader numbers each pair from 1 again, by one shift for both
    sides. Against flightrec's own dumps of the same job, every transfer's number differs by one
    constant per pair (the alignment holds), and no report shows an anchor-sized number."""
    tables = {}
    for fmt in synth.FORMATS:
        job = analyzers.load(synth.write_folder(tmp_path / fmt, RANKS, ENTRIES, "stall", fmt))
        e = job.entries
        p2p = e[e["kind"] == "p2p"]
        tables[fmt] = p2p.assign(group=p2p["group"].astype(str), op=p2p["op"].astype(str))[
            ["rank", "id", "group", "op", "peer", "seq"]]
    both = tables["flightrec"].merge(tables["torch"], on=["rank", "id"], suffixes=("", "_torch"))
    assert len(both) == len(tables["torch"]) > 100
    assert (both["op"] == both["op_torch"]).all() and (both["peer"] == both["peer_torch"]).all()
    sender = both["rank"].where(both["op"] == "send", both["peer"])
    receiver = both["peer"].where(both["op"] == "send", both["rank"])
    shift = (both["seq_torch"] - both["seq"]).groupby([both["group"], sender, receiver]).nunique()
    assert (shift == 1).all()  # one constant per pair: both sides moved together
    lowest = both["seq_torch"].groupby([both["group"], sender, receiver]).min()
    assert (lowest == 1).all() and both["seq_torch"].max() < 1000


def test_check_rejects_a_wrong_answer() -> None:
    layout = synth.Layout.of(RANKS)
    wrong = {"verdict": "hang", "root_causes": [{"rank": layout.culprit + 1, "kind": "not_entered"}]}
    assert synth.check(wrong, RANKS, "stall")
    assert synth.check({"verdict": "healthy", "stragglers": []}, RANKS, "straggler")


def test_layout_and_dump_shape(tmp_path: Path) -> None:
    layout = synth.Layout.of(256)
    assert (layout.tp, layout.pp, layout.dp) == (8, 4, 8)
    folder = synth.write_folder(tmp_path / "d", 16, 120, "stall", "flightrec")
    files = sorted(folder.glob("rank-*.json.gz"))
    assert len(files) == 16
    dump = json.loads(gzip.decompress(files[5].read_bytes()))
    assert dump["format"] == "flightrec-dump" and dump["schema_version"] == 6
    lengths = {len(v) for v in columns(dump).values()}
    assert lengths == {120}
    assert set(dump["entries"]) >= {"id", "seq", "state", "t_enqueue_ns", "template"}
    assert set(dump["templates"]) >= {"group", "op", "in_shapes", "site"}
    assert isinstance(dump["templates"]["op"], dict) and len(dump["templates"]["op"]["values"]) < 10  # coded
    assert len(dump["templates"]["op"]["codes"]) < 30 and max(plain(dump["entries"]["template"])) < 30  # a few distinct ops
    # packed exactly as the recorder packs (flightrec/format/packed.py), nulls included
    done = plain(dump["entries"]["t_complete_ns"])
    assert dump["entries"]["t_complete_ns"] == pack(done) and dump["entries"]["id"] == pack(plain(dump["entries"]["id"]))
    assert dump["dropped"] == dump["recorded"] - 120 > 0
    names = {g["desc"][:2] for g in dump["groups"]}
    assert names == {"de", "tp", "pp", "dp"}
    # a second call with the same parameters reuses the folder
    stamp = (folder / ".synth.json").stat().st_mtime_ns
    synth.write_folder(folder, 16, 120, "stall", "flightrec")
    assert (folder / ".synth.json").stat().st_mtime_ns == stamp


def test_torch_format_is_read_by_pytorchs_analyzer(tmp_path: Path) -> None:
    folder = synth.write_folder(tmp_path / "fr", 16, 60, "straggler", "torch")
    dump = pickle.loads((folder / f"{synth.TORCH_PREFIX}3").read_bytes())
    assert dump["version"].startswith("2.") and len(dump["entries"]) == 60
    out = tmp_path / "db.pkl"
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", str(folder), "-o", str(out)],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert out.stat().st_size > 0


def test_a_reader_batch_builds_the_table_each_file_builds(tmp_path: Path) -> None:
    """The pool's readers take the template columns of a whole batch onto its entries at once
    (columns.expand_batch); the table must be exactly the one each file's own reading gives, also
    when a batch mixes in another format."""
    import pandas as pd

    from analyzers.reading import loader, read
    from analyzers.reading.columns import concat_columns, to_frame

    ours = synth.write_folder(tmp_path / "fr", 16, 120, "straggler", "flightrec")
    theirs = synth.write_folder(tmp_path / "torch", 16, 120, "straggler", "torch")
    files = [str(p) for p in sorted(ours.glob("rank-*"))]
    mixed = files[:5] + [str(theirs / "nccl_trace_rank_5")] + files[6:]
    for names in (files, mixed):
        batch = loader.read_batch(names)
        assert batch.table is not None and len(batch.spans) == len(names)
        each = [read.read_path(n).entries for n in names]
        pd.testing.assert_frame_equal(to_frame(concat_columns([batch.table])), to_frame(concat_columns(each)))
