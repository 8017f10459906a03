"""Every root-cause kind, cascades and evidence gaps, on hand-written dump folders."""

from __future__ import annotations

import networkx as nx
import pytest

import analyzers


def causes(report: dict) -> list[tuple[int, str]]:
    return sorted((c["rank"], c["kind"]) for c in report["root_causes"])


def test_healthy(scenario):
    report = analyzers.load(scenario("healthy")).report()
    assert report["verdict"] == "healthy"
    assert report["root_causes"] == [] and report["waits"] == [] and report["mismatches"] == []
    assert report["ranks"] == {"expected": 4, "dumped": [0, 1, 2, 3], "missing": [], "unreadable": [], "stale": [],
                               "evidence_age_s": {"0": 0.0, "1": 0.0, "2": 0.0, "3": 0.0}, "running": []}


def test_compute_hang_names_the_rank_and_its_stack(scenario):
    report = analyzers.load(scenario("compute_hang")).report()
    assert report["verdict"] == "hang"
    (cause,) = report["root_causes"]
    assert (cause["rank"], cause["kind"], cause["group"], cause["seq"], cause["op"]) == (2, "not_entered", "0", 4, "all_reduce")
    assert cause["site"] == "data.py:41 in decode_shard"
    assert cause["stack"][-1] == "data.py:41 in decode_shard" and "data.py:88 in load_batch" in cause["stack"]
    assert cause["victims"] == [0, 1, 3]
    assert {w["rank"]: w["waits_for"] for w in report["waits"]} == {0: [2], 1: [2], 3: [2]}


def test_missing_dump(scenario):
    a = analyzers.load(scenario("missing_dump"))
    report = a.report()
    assert report["verdict"] == "hang"
    assert causes(report) == [(3, "missing_dump")]
    assert report["ranks"]["missing"] == [3]
    assert 3 in a.graph and not a.graph.nodes[3]["dumped"]
    assert any("no dump" in g for g in report["gaps"])


@pytest.mark.parametrize(
    ("name", "field", "odd"),
    [
        ("mismatch_op", "op", "all_gather_into_tensor"),
        ("mismatch_shape", "shapes", "[[8]] -> [[8]]"),
        ("mismatch_dtype", "dtypes", "bfloat16->bfloat16"),
        ("mismatch_reduce_op", "reduce_op", "MAX"),
    ],
)
def test_mismatch_kinds(scenario, name, field, odd):
    report = analyzers.load(scenario(name)).report()
    assert report["verdict"] == "desync"
    assert causes(report) == [(1, "mismatch")]
    (m,) = report["mismatches"]
    assert (m["group"], m["seq"], m["field"], m["ranks"]) == ("0", 3, field, [1])
    assert m["values"][odd] == [1] and m["values"][m["expected"]] == [0, 2, 3]
    assert report["root_causes"][0]["victims"] == [0, 2, 3]


def test_all_mismatches_of_a_group_are_reported(scenario):
    report = analyzers.load(scenario("mismatch_twice")).report()
    assert report["verdict"] == "desync"
    found = [(m["seq"], m["field"], m["ranks"]) for m in report["mismatches"]]
    assert found == [(2, "reduce_op", [3]), (4, "shapes", [0])]
    assert causes(report) == [(0, "mismatch"), (3, "mismatch")]
    assert "group size 4" in report["mismatches"][1]["values"].__repr__()


def test_comm_stuck_is_one_cause_per_group_instance(scenario):
    report = analyzers.load(scenario("comm_stuck")).report()
    assert report["verdict"] == "hang"
    (cause,) = report["root_causes"]
    assert (cause["rank"], cause["kind"], cause["ranks"], cause["seq"]) == (0, "comm_stuck", [0, 1, 2, 3], 3)
    assert all(w["waits_for"] == [] for w in report["waits"])


@pytest.mark.parametrize("name", ["p2p_deadlock", "group_order_inversion", "batched_p2p_cycle"])
def test_deadlock_cycles(scenario, name):
    a = analyzers.load(scenario(name))
    report = a.report()
    assert report["verdict"] == "deadlock"
    assert report["cycles"] == [[0, 1]]
    assert causes(report) == [(0, "deadlock"), (1, "deadlock")]
    assert not nx.is_directed_acyclic_graph(a.graph)


def test_group_order_inversion_names_both_groups(scenario):
    report = analyzers.load(scenario("group_order_inversion")).report()
    assert {(c["rank"], c["group"]) for c in report["root_causes"]} == {(0, "1"), (1, "2")}


def test_cascade_resolves_to_the_originating_rank(scenario):
    a = analyzers.load(scenario("cascade"))
    report = a.report()
    assert report["verdict"] == "hang"
    (cause,) = report["root_causes"]
    assert (cause["rank"], cause["kind"], cause["group_desc"], cause["op"]) == (5, "not_entered", "tp2", "all_reduce")
    assert cause["victims"] == [0, 1, 2, 3, 4, 6, 7]
    assert report["victims"] == [0, 1, 2, 3, 4, 6, 7]
    waits = {w["rank"]: (w["group"], w["waits_for"]) for w in report["waits"]}
    assert waits[4] == ("3", [5])  # TP
    assert waits[0] == ("5", [4]) and waits[1] == ("6", [5])  # DP
    assert waits[2] == ("0", [0, 1, 4, 5])  # world barrier
    assert nx.has_path(a.graph, 2, 5) and a.graph.out_degree(5) == 0


def test_batched_p2p_waits_as_one_unit(scenario):
    report = analyzers.load(scenario("batched_p2p")).report()
    assert causes(report) == [(1, "not_entered")]
    (w,) = report["waits"]
    assert w["rank"] == 0 and w["waits_for"] == [1] and w["peer"] == 1


def test_failed_op_is_evidence_of_a_wait(scenario):
    report = analyzers.load(scenario("failed_timeout")).report()
    assert causes(report) == [(2, "not_entered")]
    assert {w["rank"]: w["evidence"] for w in report["waits"]} == {0: "failed", 1: "failed"}


def test_wrapped_ring_is_stated(scenario):
    report = analyzers.load(scenario("wrapped_ring")).report()
    assert causes(report) == [(3, "not_entered")]
    assert any("rank 1: ring wrapped" in g and "8 entries dropped" in g for g in report["gaps"])


def test_unknown_participation_is_a_gap_not_a_guess(scenario):
    report = analyzers.load(scenario("wrapped_unknown")).report()
    assert report["verdict"] == "hang"
    assert report["root_causes"] == []
    (w,) = report["waits"]
    assert w["rank"] == 0 and w["waits_for"] == [] and w["unknown"] == [1]
    assert any("cannot tell whether rank(s) 1 took part" in g for g in report["gaps"])


def test_recorder_frames_are_not_the_stall_site(tmp_path):
    from fixtures.builders import Job

    job = Job(2)
    job.collective("0", "all_reduce", ranks=[0], state="started")
    job.stack(1, ["train.py:10 in main", "train.py:20 in step", "/site/flightrec/__init__.py:32 in dump",
                  "/site/flightrec/watch/dump_writer.py:110 in build_dump", "/site/flightrec/record/stacks.py:64 in all_thread_stacks"])
    (cause,) = analyzers.load(job.write(tmp_path / "d")).report()["root_causes"]
    assert cause["site"] == "train.py:20 in step" and cause["stack"] == ["train.py:10 in main", "train.py:20 in step"]
