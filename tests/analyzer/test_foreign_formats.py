"""Other recorders' dumps (PyTorch's schema versions, fr_trace's test dumps, torchcomms, torch_npu), read right.

The folders are written by fixtures/foreign/make.py from each recorder's own code (see its README for the
sources and for which values were filled in); each has an expected verdict and root-cause ranks.
"""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import pytest

import analyzers
from analyzers.reading import read_torch_fr
from analyzers.reading.columns import to_frame
from analyzers.reading.rankdump import SideFile
from analyzers.reading.read import read_path
from fixtures.foreign import make as foreign

from .conftest import ROOT

FOREIGN = ROOT / "fixtures" / "foreign"


def causes(report: dict) -> list[tuple[int, str]]:
    return [(c["rank"], c["kind"]) for c in report["root_causes"]]


@pytest.mark.parametrize("name", sorted(foreign.EXPECTED))
def test_expected_verdict_and_root_causes(name: str) -> None:
    report = analyzers.load(FOREIGN / name).report()
    verdict, roots = foreign.EXPECTED[name]
    assert (report["verdict"], causes(report)) == (verdict, roots)
    assert report["unreadable_files"] == []


def test_committed_folders_are_what_the_script_writes(tmp_path: Path) -> None:
    foreign.make(tmp_path)
    for name in foreign.EXPECTED:
        written = {p.name: p.read_bytes() for p in (tmp_path / name).iterdir()}
        committed = {p.name: p.read_bytes() for p in (FOREIGN / name).iterdir()}
        assert written == committed, name


def test_seq_zero_is_a_sequence() -> None:
    """fr_trace's test dumps put ops at "0" (a string): rank 1 never joined, and the size mismatch is seen."""
    a = analyzers.load(FOREIGN / "fr_trace-test-seq0-hang")
    assert a.entries["seq"].tolist() == [1]
    (cause,) = a.report()["root_causes"]
    assert (cause["rank"], cause["op"], cause["seq"]) == (1, "all_reduce", 1)
    (m,) = analyzers.load(FOREIGN / "fr_trace-test-seq0-size-mismatch").report()["mismatches"]
    assert (m["field"], m["seq"], m["values"]) == ("shapes", 1, {"[[5, 5]] -> [[5, 5]]": [2], "[[4, 4]] -> [[4, 4]]": [0, 1]})


def test_torchcomms_counts_from_zero_and_completes_by_retired() -> None:
    a = analyzers.load(FOREIGN / "torchcomms-2.10-gloo-hang")
    rank0 = a.entries[a.entries["rank"] == 0]
    assert rank0["seq"].tolist() == [1, 2, 3]
    assert rank0["op"].tolist() == ["all_reduce"] * 3  # `nccl:` on gloo is a label, not a backend
    assert rank0["state"].tolist() == ["completed", "completed", "started"]  # scheduled but retired = finished
    assert not a.dumps[0].completion_reliable
    gaps = " ".join(a.report()["gaps"])
    assert "observed no device events" in gaps and "gloo recorder" not in gaps
    assert "membership not recorded" not in gaps  # pg_config's "0,1" is read
    assert a.groups.set_index("group").loc["world", "ranks"] == (0, 1)


def test_torchcomms_one_counter_for_all_communicators() -> None:
    """One recorder numbers the world and split comms together: each group's k-th op must be seq k."""
    a = analyzers.load(FOREIGN / "torchcomms-2.10-split-hang")
    rank0 = a.entries[a.entries["rank"] == 0]
    assert list(zip(rank0["group"], rank0["seq"], strict=True)) == [("world", 1), ("split_a", 1), ("split_a", 2), ("world", 2)]
    assert a.groups.set_index("group").loc["split_b", "ranks"] == (2, 3)


def test_completion_never_from_the_name_prefix(tmp_path: Path) -> None:
    """A `gloo:` op whose recorder saw device events is judged by its state; an `nccl:` op of a recorder that saw
    none is judged by `retired`."""
    pg = ("0", "default_pg")
    events = [foreign.torch_entry(0, pg, "gloo:all_reduce", 1), foreign.torch_entry(1, pg, "gloo:all_reduce", 2, state="started")]
    events[1]["retired"] = True  # retired but not completed: timed out
    dump = read_torch_fr.parse({"version": "2.10", "pg_config": {}, "pg_status": {}, "entries": events}, "x_0", 0, "p")
    assert list(to_frame(dump.entries)["state"].astype(str)) == ["completed", "started"] and dump.completion_reliable
    quiet = [foreign.torch_entry(i, pg, "nccl:all_reduce", i + 1, state="scheduled") for i in range(2)]
    quiet[0]["retired"] = True
    dump = read_torch_fr.parse({"version": "2.10", "pg_config": {}, "pg_status": {}, "entries": quiet}, "x_0", 0, "p")
    assert list(to_frame(dump.entries)["state"].astype(str)) == ["completed", "started"] and not dump.completion_reliable


def test_torch_npu_side_files_become_thread_stacks() -> None:
    a = analyzers.load(FOREIGN / "torch_npu-2.4-hccl-hang")
    report = a.report()
    assert report["unreadable_files"] == []
    main = next(t for t in a.dumps[1].threads if t["is_main"])
    assert main["name"] == "MainThread" and main["stack"][-1] == "/workspace/train.py:77 in load_batch"
    (cause,) = report["root_causes"]
    assert cause["site"] == "/workspace/train.py:77 in load_batch"
    gaps = " ".join(report["gaps"])
    assert "dumps no thread stacks" not in gaps and "world size not recorded" not in gaps
    assert "records no op names" in gaps
    assert a.groups.set_index("group").loc["group_name_0", "desc"] == "default_pg"


def test_torch_npu_side_file_without_a_dump(tmp_path: Path) -> None:
    folder = tmp_path / "npu"
    shutil.copytree(FOREIGN / "torch_npu-2.4-hccl-hang", folder)
    (folder / "hccl_trace_rank_1").unlink()
    report = analyzers.load(folder).report()
    (problem,) = report["unreadable_files"]
    assert (problem["file"], problem["rank"]) == ("hccl_trace_rank_1_py_traceback", 1)
    assert "no readable dump" in problem["reason"]


def test_py_traceback_is_read_as_text_not_decoded(tmp_path: Path) -> None:
    side = tmp_path / "hccl_trace_rank_7_py_traceback"
    side.write_bytes(pickle.dumps({"version": "2.4", "pg_config": {}, "entries": []}))  # bytes, not stacks
    result = read_path(str(side))
    assert not isinstance(result, SideFile) and result.rank == 7
    side.write_text("pid: 1\nthread 1234:\n  File \"/a.py\", line 3, in f\n    g()\n")
    result = read_path(str(side))
    assert isinstance(result, SideFile) and result.threads == [
        {"name": "thread-1234", "ident": 1234, "is_main": False, "stack": ["/a.py:3 in f"]}
    ]


def test_empty_ring_json_without_entries_is_a_dump() -> None:
    report = analyzers.load(FOREIGN / "pytorch-2.13-gloo-json-empty-ring").report()
    assert report["ranks"]["dumped"] == [0, 1]
    assert report["ranks"]["unreadable"] == []


def test_coalesced_marker_has_no_payload() -> None:
    a = analyzers.load(FOREIGN / "pytorch-2.10-nccl-coalesced")
    marker = a.entries[a.entries["op"] == "coalesced"]
    assert len(marker) == 2 and marker["in_shapes"].isna().all() and marker["out_dtypes"].isna().all()
    members = a.entries[(a.entries["rank"] == 0) & (a.entries["seq"] == 2)]
    assert members["unit"].nunique() == 1 and len(members) == 3


def test_schema_versions(tmp_path: Path) -> None:
    """Versions 1.x and 2.x are read; torchcomms' comm-local member lists are not taken as global ranks."""
    entry = foreign.fr_test_event(0, "all_reduce", [[4]], [[4]])
    for version in ("1.5", "2.0", "2.10"):
        dump = read_torch_fr.parse({"version": version, "pg_config": {}, "entries": [entry]}, "x_0", 0, "p")
        assert list(to_frame(dump.entries)["seq"]) == [1]
    cfg = {"c": {"name": "c", "desc": "nccl", "ranks": "0,1"}}
    tc = foreign.torchcomms_entry(0, "c", "nccl", "all_reduce", 0, True, False)
    assert read_torch_fr.parse({"version": "2.10", "pg_config": cfg, "entries": [tc]}, "x_1", 1, "p").groups[0].ranks == (0, 1)
    assert read_torch_fr.parse({"version": "2.10", "pg_config": cfg, "entries": [tc]}, "x_3", 3, "p").groups[0].ranks is None


def test_readme_lists_every_folder() -> None:
    text = (FOREIGN / "README.md").read_text()
    assert all(name in text for name in foreign.EXPECTED)
    assert json.loads(json.dumps(foreign.EXPECTED))  # plain data
