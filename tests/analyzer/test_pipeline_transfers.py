"""Pipelines post several p2p ops at once and wait on them late or together: a send its receiver
completed is delivered, and a rank waits where its thread is, not in an older transfer its peer has
taken up (fixtures/builders.py: pipeline_*)."""

from __future__ import annotations

import analyzers
from fixtures import builders


def _causes(report: dict) -> list[tuple[int, str]]:
    return [(c["rank"], c["kind"]) for c in report["root_causes"]]


def _waits(report: dict) -> dict[int, tuple[str, int, list[int]]]:
    return {w["rank"]: (w["op"], w["seq"], w["waits_for"]) for w in report["waits"]}


def test_send_its_receiver_completed_is_delivered(scenario):
    report = analyzers.load(scenario("pipeline_send_delivered")).report()
    assert _causes(report) == [(0, "not_entered")]
    assert report["root_causes"][0]["op"] == "send" and "stall_in_compute" in report["root_causes"][0]["site"]
    assert _waits(report) == {1: ("recv", 2, [0]), 2: ("recv", 2, [1])}
    assert any("taken as delivered" in n and "rank 1's send to rank 2" in n for n in report["gaps"])


def test_rank_waits_where_its_thread_is_not_in_a_transfer_the_peer_took_up(scenario):
    report = analyzers.load(scenario("pipeline_posted_recv")).report()
    assert _causes(report) == [(1, "not_entered")]
    assert report["root_causes"][0]["op"] == "send"  # rank 1 owes the send rank 0 waits to receive
    assert _waits(report) == {0: ("recv", 1, [1])}


def test_batches_are_judged_as_units(scenario):
    report = analyzers.load(scenario("pipeline_batches")).report()
    assert _causes(report) == [(0, "not_entered")]
    waits = _waits(report)
    assert waits[1][2] == [0] and waits[2][2] == [1]
    assert "comm_stuck" not in {c["kind"] for c in report["root_causes"]}


def test_receivers_counters_tell_delivery_when_its_ring_lost_the_receive(tmp_path):
    """The receiver's ring wrapped past its completed receive: its `progress` counter still says it."""
    job = builders.pipeline_send_delivered_job()
    job.ring(2, 1)  # only its open receive is left
    job.set(2, progress=[{"group": "0", "kind": "coll", "entered": 1, "started": 1, "completed": 1},
                         {"group": "0", "kind": "p2p", "op": "recv", "peer": 1, "entered": 2, "started": 2,
                          "completed": 1}])
    report = analyzers.load(str(job.write(tmp_path / "job"))).report()
    assert _causes(report) == [(0, "not_entered")]
    assert _waits(report)[1] == ("recv", 2, [0])
