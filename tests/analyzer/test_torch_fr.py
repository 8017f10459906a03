"""PyTorch's built-in flight recorder: a real gloo dump (pickle and JSON) and hand-written NCCL/HCCL ones."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import pytest

import analyzers

from .conftest import GOLDEN


@pytest.mark.parametrize("name", ["torch_fr_gloo", "torch_fr_gloo_json"])
def test_real_gloo_dump(name):
    a = analyzers.load(GOLDEN / name)
    report = a.report()
    assert report["verdict"] == "hang"
    assert report["ranks"] == {"expected": 4, "dumped": [0, 1, 2, 3], "missing": [], "unreadable": [], "stale": [],
                               "evidence_age_s": {}, "running": []}  # PyTorch's dumps carry no write time
    (cause,) = report["root_causes"]
    assert (cause["rank"], cause["kind"], cause["group"], cause["group_desc"], cause["op"]) == (
        3, "not_entered", "2", "tp1", "all_reduce"
    )
    assert cause["victims"] == [0, 1, 2]
    waits = {w["rank"]: (w["group"], w["seq"], w["waits_for"], w["evidence"]) for w in report["waits"]}
    assert waits[2] == ("2", 3, [3], "pending")
    # rank 0 dumped mid-hang (op not retired); rank 1 after gloo's timeout fired: PyTorch marks that op
    # retired and pg_status counts it completed, so its wait is inferred from ranks 2, 3 never entering
    assert waits[0] == ("0", 5, [2, 3], "pending")
    assert waits[1] == ("0", 5, [2, 3], "inferred")
    gaps = " ".join(report["gaps"])
    assert "gloo recorder" in gaps and "membership not recorded" in gaps and "world size not recorded" in gaps
    assert set(a.entries["source"].astype(str)) == {"torch_fr"}
    assert set(a.entries["in_dtypes"].dropna().astype(str)) == {"float32", ""}  # "" = barrier, no tensors
    assert (a.groups.set_index("group").loc["2", "ranks"]) == (2, 3)


def test_pickle_and_json_of_the_same_rank(tmp_path):
    folder = tmp_path / "both"
    shutil.copytree(GOLDEN / "torch_fr_gloo", folder)
    for f in (GOLDEN / "torch_fr_gloo_json").iterdir():
        shutil.copy(f, folder / f.name)
    a = analyzers.load(folder)
    assert {d.fmt for d in a.dumps.values()} == {"torch_fr_pickle"}
    assert any("several dumps" in g for g in a.report()["gaps"])


def fr_entry(rid: int, pg: tuple[str, str], name: str, seq: int, p2p_seq: int = 0, state: str = "completed",
             sizes: list[list[int]] | None = None) -> dict:
    p2p = " " in name
    return {
        "record_id": rid, "pg_id": int(pg[0]), "process_group": pg, "collective_seq_id": seq, "p2p_seq_id": p2p_seq,
        "op_id": rid + 1, "profiling_name": name, "time_created_ns": 1_700_000_000_000_000_000 + rid * 1000,
        "input_sizes": sizes or [[4]], "input_dtypes": ["Float"], "output_sizes": sizes or [[4]], "output_dtypes": ["Float"],
        "state": state, "time_discovered_started_ns": None, "time_discovered_completed_ns": None, "retired": state == "completed",
        "timeout_ms": 600000, "is_p2p": p2p,
        "frames": [{"name": "forward", "filename": "/src/model.py", "line": 10 + rid}],
    }


def fr_dump(entries: list[dict], pg_config: dict, version: str = "2.10") -> dict:
    return {"version": version, "pg_config": pg_config, "pg_status": {}, "comm_lib_version": "2.21.5", "entries": entries}


def test_nccl_p2p_peer_mapping(tmp_path):
    world = ("0", "default_pg")
    pp = ("1", "pp")
    cfg = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3]"}, "1": {"name": "1", "desc": "pp", "ranks": "[2, 3]"}}
    dumps = {
        0: [fr_entry(0, world, "nccl:all_reduce", 1)],
        1: [fr_entry(0, world, "nccl:all_reduce", 1)],
        2: [fr_entry(0, world, "nccl:all_reduce", 1)],
        3: [fr_entry(0, world, "nccl:all_reduce", 1), fr_entry(1, pp, "nccl:recv 1<-0", 1, p2p_seq=1, state="started")],
    }
    for r, entries in dumps.items():
        (tmp_path / f"nccl_trace_rank_{r}").write_bytes(pickle.dumps(fr_dump(entries, cfg)))
    a = analyzers.load(tmp_path)
    row = a.entries[(a.entries["rank"] == 3) & (a.entries["kind"] == "p2p")].iloc[0]
    assert (row["op"], row["peer"], row["seq"], row["state"]) == ("recv", 2, 1, "started")
    report = a.report()
    assert [(c["rank"], c["kind"], c["op"]) for c in report["root_causes"]] == [(2, "not_entered", "send")]  # it owes the send rank 3 waits for
    assert report["groups"][1]["membership"] == "recorded"
    assert not any("membership not recorded" in g for g in report["gaps"])


def test_nccl_states_and_size_mismatch(tmp_path):
    world = ("0", "default_pg")
    cfg = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}}
    for r in (0, 1):
        entries = [
            fr_entry(0, world, "nccl:_all_gather_base", 1, sizes=None),
            fr_entry(1, world, "nccl:all_reduce", 2, state="scheduled", sizes=[[8]] if r else [[4]]),
        ]
        entries[0]["output_sizes"] = [[8]]
        (tmp_path / f"nccl_trace_rank_{r}").write_bytes(pickle.dumps(fr_dump(entries, cfg)))
    report = analyzers.load(tmp_path).report()
    assert report["verdict"] == "desync"
    (m,) = report["mismatches"]
    assert (m["seq"], m["field"], m["tie"]) == (2, "shapes", True)
    assert {w["state"] for w in report["waits"]} == {"enqueued"}


def test_hccl_json(tmp_path):
    """torch_npu writes no op names (`profiling_name` is ""; this test used to assume `hccl:` names) and calls
    its default group `group_name_0` with an empty desc."""
    cfg = {"group_name_0": {"name": "group_name_0", "desc": "", "ranks": "[0, 1]"}}
    for r in (0, 1):
        entries = [fr_entry(0, ("0", ""), "", 1)]
        if r == 0:
            entries.append(fr_entry(1, ("0", ""), "", 2, state="started"))
        for e in entries:
            e.pop("frames")
            e["process_group"] = ["group_name_0", ""]
            e["time_discovered_completed_ns"] = 0
        (tmp_path / f"hccl_trace_rank_{r}.json").write_text(json.dumps(fr_dump(entries, cfg)))
    report = analyzers.load(tmp_path).report()
    assert [(c["rank"], c["kind"], c["op"], c["group_desc"]) for c in report["root_causes"]] == [
        (1, "not_entered", "unknown", "default_pg")
    ]
    assert any("no Python frames" in g for g in report["gaps"])
    assert not any("world size not recorded" in g for g in report["gaps"])


def test_unsupported_torch_version(tmp_path):
    (tmp_path / "nccl_trace_rank_0").write_bytes(pickle.dumps(fr_dump([], {}, version="2.10")))
    (tmp_path / "nccl_trace_rank_1").write_bytes(pickle.dumps(fr_dump([], {}, version="3.0")))
    report = analyzers.load(tmp_path).report()
    assert "unsupported PyTorch flight-recorder version '3.0'" in report["unreadable_files"][0]["reason"]


def test_fixture_script_is_importable():
    spec = Path(GOLDEN).parent / "make_torch_fr.py"
    text = spec.read_text()
    assert "_dump_fr_trace_json" in text and "TORCH_FR_BUFFER_SIZE" in text


def test_missing_member_of_an_unrecorded_group_is_not_guessed(tmp_path):
    """Without rank 3's dump, gloo's empty pg_config leaves tp1 = {2} as far as anyone can tell:
    rank 2 is not called comm_stuck; the report says the chain ends at a member it cannot name."""
    folder = tmp_path / "g"
    shutil.copytree(GOLDEN / "torch_fr_gloo", folder)
    (folder / "comm_lib_trace_rank_3").unlink()
    report = analyzers.load(folder).report()
    assert report["verdict"] == "hang"
    assert report["root_causes"] == []
    assert any("group 2's membership is not recorded" in g for g in report["gaps"])
    assert any(g.startswith("world size not recorded") for g in report["gaps"])


def test_p2p_ops_without_p2p_seq_id_are_not_one_unit(tmp_path):
    """Recorders before `p2p_seq_id` give p2p ops the group's current collective seq: the pipeline's
    sends and receives between two collectives share it, which must not make them one coalesced unit."""
    world = ("0", "default_pg")
    cfg = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}}
    entries = [fr_entry(0, world, "nccl:all_reduce", 1), fr_entry(1, world, "nccl:send 0->1", 1),
               fr_entry(2, world, "nccl:send 0->1", 1), fr_entry(3, world, "nccl:recv 0<-1", 1)]
    for e in entries:
        del e["p2p_seq_id"]
    (tmp_path / "nccl_trace_rank_0").write_bytes(pickle.dumps(fr_dump(entries, cfg)))
    a = analyzers.load(tmp_path)
    assert (a.entries.loc[a.entries["kind"] == "p2p", "unit"] == -1).all()
