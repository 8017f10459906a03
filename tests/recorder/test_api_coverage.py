"""Every recorded API shows up with the right op, group, peer, shapes and matching sequence numbers,
recorded by the C hot path and by the pure-Python wrapper alike."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from flightrec.format.packed import is_packed, plain
from flightrec.record import cpp_reader, fastpath, torch_compat
from tests.helpers import entries, load_dump, run_ranks
from tests.recorder import workers

WORLD = 3
# what differs between two runs of the same job: times, and ids shifted by C++-op records
VARYING = ("id", "t_enqueue_ns", "t_complete_ns", "unit")


# mode -> (FLIGHTREC_FASTPATH, FLIGHTREC_TORCHPEEK, the wrappers and counter readers each rank reports)
MODES = {
    "peek": ("1", "1", "Leaf SeqReader"),  # C hot path reading torch's C++ objects (flightrec build-ext)
    "c": ("1", "0", "Leaf method"),
    "python": ("0", "0", "function method"),
}


@pytest.fixture(scope="module")
def coverage_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The same job three ways: C hot path with and without the built torch reader, and pure Python."""
    runs = {}
    for mode, (fast, torchpeek, _) in MODES.items():
        if mode != "python" and not fastpath.available():
            continue
        if mode == "peek" and cpp_reader.find() is None:
            continue
        out = tmp_path_factory.mktemp(f"coverage-{mode}")
        with pytest.MonkeyPatch.context() as env:
            env.setenv("FLIGHTREC_FASTPATH", fast)
            env.setenv("FLIGHTREC_TORCHPEEK", torchpeek)
            run_ranks(workers.every_api, WORLD, str(out), timeout_s=90)
        runs[mode] = out
    return runs


@pytest.fixture(scope="module", params=list(MODES))
def coverage_dumps(request: pytest.FixtureRequest, coverage_runs: dict[str, Path]) -> list[list[dict]]:
    if request.param not in coverage_runs:
        pytest.skip(f"{request.param}: the C hot path is off, or the torch reader not built")
    out = coverage_runs[request.param]
    wrappers = {(out / f"wrapper-{r}.txt").read_text() for r in range(WORLD)}
    assert wrappers == {MODES[request.param][2]}
    return [entries(load_dump(out, r)) for r in range(WORLD)]


def test_dumps_say_which_hot_path_recorded(coverage_runs: dict[str, Path]) -> None:
    expected = {"peek": {"c": True, "torch_reader": True}, "c": {"c": True, "torch_reader": False},
                "python": {"c": False, "torch_reader": False}}
    for mode, out in coverage_runs.items():
        assert {json.dumps(load_dump(out, r)["hot_path"], sort_keys=True) for r in range(WORLD)} == \
               {json.dumps(expected[mode], sort_keys=True)}, mode


@pytest.mark.parametrize("mode", ["c", "peek"])
def test_c_and_python_hot_paths_record_the_same(coverage_runs: dict[str, Path], mode: str) -> None:
    if mode not in coverage_runs:
        pytest.skip(f"{mode}: the C hot path is off, or the torch reader not built")
    for rank in range(WORLD):
        c, python = (entries(load_dump(coverage_runs[m], rank)) for m in (mode, "python"))
        assert len(c) == len(python)
        for fast, slow in zip(c, python, strict=True):
            assert {k: v for k, v in fast.items() if k not in VARYING} == \
                   {k: v for k, v in slow.items() if k not in VARYING}
            assert (fast["unit"] >= 0) == (slow["unit"] >= 0)


def _python(rows: list[dict]) -> list[dict]:
    return [e for e in rows if e["source"] == "python"]


def test_collectives_line_up_on_every_rank(coverage_dumps: list[list[dict]]) -> None:
    per_rank = [[(e["group"], e["seq"], e["op"], e["api"]) for e in _python(rows) if e["kind"] == "coll" and e["group"] == "0"]
                for rows in coverage_dumps]
    assert per_rank[0] == per_rank[1] == per_rank[2]
    ops = [op for _, _, op, _ in per_rank[0]]
    tensor_ops = torch_compat.gloo_tensor_collectives()  # what this torch's gloo serves: the job called these only then
    assert ops[:4] == ["all_reduce", "all_reduce", "all_gather"] + (["all_gather_into_tensor"] if tensor_ops else ["all_gather"])
    for expected in ("reduce", "broadcast", "scatter", "gather", "all_to_all_single", "barrier", "monitored_barrier",
                     "all_reduce_coalesced", "all_gather_coalesced",
                     *(["reduce_scatter_tensor"] if tensor_ops else [])):
        assert expected in ops, expected
    seqs = [seq for _, seq, _, _ in per_rank[0]]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)


def test_details_of_each_op(coverage_dumps: list[list[dict]]) -> None:
    rows = _python(coverage_dumps[0])
    by_api = {}
    for e in rows:
        by_api.setdefault(e["api"], []).append(e)
    first, second = by_api["all_reduce"][:2]
    assert first["in_shapes"] == [[4]] and first["in_dtypes"] == ["float32"] and first["reduce_op"] == "SUM"
    assert second["is_async"] and second["reduce_op"] == "MAX" and second["state"] == "completed"
    gather = by_api["all_gather"][0]
    assert gather["out_shapes"] == [[4]] * WORLD
    # sizes, then data: torch 2.15 gathers both into one tensor (all_gather_into_tensor), earlier releases into lists
    assert [e["op"] for e in by_api["all_gather_object"]] in (["all_gather"] * 2, ["all_gather_into_tensor"] * 2)
    assert [e["op"] for e in by_api["broadcast_object_list"]] == ["broadcast", "broadcast"]
    assert by_api["reduce"][0]["root"] == 1
    assert by_api["broadcast"][0]["root"] == 2
    assert by_api["scatter"][0]["root"] == 0 and by_api["scatter"][0]["in_shapes"] == [[3]] * WORLD
    assert by_api["gather"][0]["root"] == 1
    (coalesced,) = by_api["all_reduce_coalesced"]  # one op over two tensors, not a C++-issued 'unknown'
    assert coalesced["op"] == "all_reduce_coalesced" and coalesced["in_shapes"] == [[2], [3]]
    (gathered,) = by_api["all_gather_coalesced"]
    assert gathered["in_shapes"] == [[2], [3]] and gathered["out_shapes"] == [[2], [3]] * WORLD
    assert not [e for e in coverage_dumps[0] if e["source"] == "c++"]
    assert all(e["state"] == "completed" for e in rows)
    assert all(e["site"].endswith("in every_api") for e in rows), {e["site"] for e in rows}
    assert all(e["t_complete_ns"] >= e["t_enqueue_ns"] for e in rows)


def test_p2p_pairs_and_batches(coverage_dumps: list[list[dict]]) -> None:
    for rank, rows in enumerate(coverage_dumps):
        p2p = [e for e in rows if e["kind"] == "p2p"]
        right, left = (rank + 1) % WORLD, (rank - 1) % WORLD
        sends = [e for e in p2p if e["op"] == "send"]
        recvs = [e for e in p2p if e["op"] == "recv"]
        assert [e["api"] for e in sends] == ["send", "isend", "batch_isend_irecv"]
        assert [e["api"] for e in recvs] == ["recv", "irecv", "batch_isend_irecv"]
        assert {e["peer"] for e in sends} == {right} and {e["peer"] for e in recvs} == {left}
        assert [e["seq"] for e in sends] == [1, 2, 3] and [e["seq"] for e in recvs] == [1, 2, 3]
        assert [e["in_shapes"] for e in sends] == [[[6]], [[7]], [[8]]]
        assert [e["out_shapes"] for e in recvs] == [[[6]], [[7]], [[8]]]
        batch = [e for e in p2p if e["api"] == "batch_isend_irecv"]
        assert len({e["unit"] for e in batch}) == 1 and batch[0]["unit"] >= 0
        assert all(e["state"] == "completed" for e in p2p)
    # the k-th send r -> r+1 is the k-th receive of r+1 from r
    for rank, rows in enumerate(coverage_dumps):
        right = (rank + 1) % WORLD
        sent = [(e["seq"], e["in_shapes"]) for e in rows if e["op"] == "send"]
        got = [(e["seq"], e["out_shapes"]) for e in coverage_dumps[right] if e["op"] == "recv" and e["peer"] == rank]
        assert sent == got


def test_coalescing_manager_is_one_unit(coverage_dumps: list[list[dict]]) -> None:
    for rows in coverage_dumps:
        block = [e for e in rows if e["api"] == "coalescing_manager"]
        assert [e["op"] for e in block] == ["all_reduce", "all_reduce"]
        assert len({e["unit"] for e in block}) == 1
        assert all(e["state"] == "completed" for e in block)


def test_subgroup_from_new_group(coverage_dumps: list[list[dict]]) -> None:
    def sub_rows(rows: list[dict]) -> list[tuple]:
        return [(e["group"], e["seq"], e["op"]) for e in rows if e["group"] != "0"]

    assert sub_rows(coverage_dumps[0]) == sub_rows(coverage_dumps[2])
    assert len(sub_rows(coverage_dumps[0])) == 2 and sub_rows(coverage_dumps[1]) == []
    assert [s for _, s, _ in sub_rows(coverage_dumps[0])] == [1, 2]


def test_group_table_and_metadata(tmp_path_factory: pytest.TempPathFactory, coverage_dumps: list[list[dict]]) -> None:
    # re-read one raw dump for the header fields
    out = next(tmp_path_factory.getbasetemp().glob("coverage-*"))
    dump = load_dump(out, 2)
    assert dump["format"] == "flightrec-dump" and dump["schema_version"] == 6
    assert dump["rank"] == 2 and dump["world_size"] == WORLD and dump["backends"] == ["gloo"]
    assert dump["reason"] == "api:coverage"
    groups = {g["name"]: g for g in dump["groups"]}
    # a torch without group descriptions leaves desc empty, and the dump says it could not record them
    assert groups["0"]["ranks"] == [0, 1, 2] and groups["0"]["desc"] == ("default_pg" if torch_compat.has_group_desc() else "")
    assert ("group_desc" in {x["what"] for x in dump["not_recorded"]}) == (not torch_compat.has_group_desc())
    sub = [g for g in groups.values() if g["ranks"] == [0, 2]]
    assert sub and sub[0]["rank_in_group"] == 1
    assert dump["clock"]["wall_ns"] > dump["clock"]["mono_ns"] > 0
    assert any(t["is_main"] for t in dump["threads"])
    # every integer column of `entries` (and the codes of its coded columns) is packed;
    # 6: counted from its first value, so a timestamp (~10^11 ns after boot) does not widen its column
    assert all(is_packed(v) or is_packed(v.get("codes")) for v in dump["entries"].values())
    enqueued = dump["entries"]["t_enqueue_ns"]
    width = 2 * int(enqueued["dtype"][-1])  # hex digits per value
    assert enqueued["start"] == plain(enqueued)[0] > 0 and int(enqueued["data"][:width], 16) == 0  # first difference: 0
    raw = {k: plain(v) for k, v in dump["entries"].items()}
    templates = dump["templates"]
    for table, rows in ((raw, len(raw["id"])), (templates, max(raw["template"]) + 1)):
        counts = Counter(len(v["codes"] if isinstance(v, dict) else v) for v in table.values())
        assert counts.keys() == {rows}  # every column has one value (or code) per entry / per template
    op = templates["op"]
    assert isinstance(op, dict) and len(op["values"]) == len(set(op["values"]))
    keys = [tuple(json.dumps(templates[c]["values"][templates[c]["codes"][t]] if isinstance(templates[c], dict)
                             else templates[c][t]) for c in templates) for t in range(len(op["codes"]))]
    assert len(keys) == len(set(keys))  # each distinct op once
    assert "t_dev_start_ns" not in raw and "stack" not in raw  # all null on gloo without stacks: left out


@pytest.mark.parametrize("mode", ["c", "python"])
def test_watchdog_completes_async_ops_nobody_waits_on(tmp_path: Path, mode: str) -> None:
    if mode == "c" and not fastpath.available():
        pytest.skip("the C hot path is off or not built")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("FLIGHTREC_FASTPATH", "1" if mode == "c" else "0")
        run_ranks(workers.unwaited_async, 2, str(tmp_path), timeout_s=60)
    for rank in range(2):
        result = json.loads((tmp_path / f"unwaited-{rank}.json").read_text())
        assert result == {"state": "completed", "work_done": True, "by_work": 0, "pending": 0,
                          "wrapper": "Leaf" if mode == "c" else "function", "slot_empty": True}


@pytest.mark.parametrize("mode", ["c", "python"])
def test_the_watchdog_sees_every_op_in_flight(tmp_path: Path, mode: str) -> None:
    """A blocking op of the C hot path is in no table while it runs (its thread's in_leaf holds
    it), an async one is in by_work until waited on, then in in_leaf while its wait blocks: the
    watchdog's `in_flight` must find them all, as the Python wrapper's (in `pending`), and nothing
    once they completed."""
    if mode == "c" and not fastpath.available():
        pytest.skip("the C hot path is off or not built")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("FLIGHTREC_FASTPATH", "1" if mode == "c" else "0")
        run_ranks(workers.ops_in_flight, 2, str(tmp_path), timeout_s=60)
    seen = json.loads((tmp_path / "in-flight-0.json").read_text())
    assert seen["blocking"] == [["all_reduce", "started", 2]]
    assert seen["blocking_in_pending"] == (0 if mode == "c" else 1)
    assert seen["async"] == seen["waiting"] == [["all_reduce", "started", 3]]
    assert seen["after"] == []
    assert json.loads((tmp_path / "in-flight-1.json").read_text())["after"] == []
