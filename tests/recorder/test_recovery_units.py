"""The watch a declared hang keeps on its op (flightrec/watch/recovery.py), without a job."""

from __future__ import annotations

from flightrec.record.entry import Entry
from flightrec.watch import recovery


def _entry(record_id: int, seq: int, state: str = "started", group: str = "0") -> Entry:
    e = Entry(record_id, group, "coll", "barrier", "barrier")
    e.seq, e.state, e.t_enqueue_ns = seq, state, 1_000_000_000
    if state == "completed":
        e.t_complete_ns = 10_000_000_000
    return e


def test_the_position_a_request_names() -> None:
    what = "barrier group=0 seq=11 at /job/train.py:88 in main incomplete after 5.1s on rank 1"
    assert recovery.position_of(what) == ("0", 11)
    assert recovery.position_of("dump requested through the dump folder") is None


def test_a_waiter_recovers_when_its_own_op_completes() -> None:
    mine = _entry(7, 11)
    stall = recovery.watch(mine, "0", 11, 5.0, "timeout", "barrier group=0 seq=11 ... incomplete after 5.1s", 8)
    assert recovery.settled(stall, list) == (None, False)
    mine.state, mine.t_complete_ns = "completed", 10_000_000_000
    done, failed = recovery.settled(stall, list)
    assert done is mine and not failed
    item = recovery.record(stall, done, 1)
    assert item["timed_out"] and item["waited_s"] == 9.0 and item["seq"] == 11
    assert "recovered after 9.0 s in barrier #11 (group 0)" in recovery.line(item, "/dumps")
    mine.state = "failed"
    assert recovery.settled(stall, list) == (None, True)  # a failure's own dump is the evidence


def test_the_holder_recovers_when_the_position_completes_here() -> None:
    stall = recovery.watch(None, "0", 11, 5.0, "peer_request", "barrier group=0 seq=11 ... on rank 1", 8)
    earlier, other_group = _entry(6, 10, "completed"), _entry(8, 11, "completed", group="1")
    assert recovery.settled(stall, lambda: [earlier, other_group]) == (None, False)
    mine = _entry(9, 11, "completed")
    done, _ = recovery.settled(stall, lambda: [earlier, other_group, mine])
    assert done is mine and not recovery.record(stall, mine, None)["timed_out"]
    anywhere = recovery.watch(None, "", -1, 5.0, "peer_request", "...", 8)  # not a member of the stalled group
    assert recovery.settled(anywhere, lambda: [earlier, other_group])[0] is other_group


def test_recovery_line_names_who_set_the_timeout() -> None:
    item = {"op": "barrier", "seq": 11, "group": "0", "site": "train.py:88 in main", "waited_s": 9.0,
            "timeout_s": 5.0, "timed_out": True}
    assert "recovered after 9.0 s in barrier #11 (group 0) at train.py:88" in recovery.line(item, "d")
    assert "the 5 s timeout (FLIGHTREC_TIMEOUT)" in recovery.line(item, "d", "FLIGHTREC_TIMEOUT")
    assert "(flightrec.enable(timeout_s))" in recovery.line(item, "d", "enable()")
    assert "(flightrec's limit, from the group's timeout)" in recovery.line(item, "d", "default")
    assert "FLIGHTREC_TIMEOUT" not in recovery.line(dict(item, timeout_s=300.0), "d", "default")
