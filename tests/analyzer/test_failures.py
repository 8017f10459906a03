"""Failures ordered in time: the first crash is the root cause, lost connections are consequences,
a clean exit is `exited`, exit records never wait, and progress counters see past a wrapped ring."""

from __future__ import annotations

from pathlib import Path

import analyzers
from analyzers.diagnosis.failures import PEER_ERROR, classify
from fixtures.builders import WALL_BASE_NS, Job

GLOO_CLOSED = ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
               "[127.0.0.1]:63143. This is typically caused by a remote worker crashing.")
GLOO_RESET = "RuntimeError: [pair.cc:537] Read error [127.0.0.1]:48345: Connection reset by peer."


def causes(report: dict) -> list[tuple[int, str]]:
    return sorted((c["rank"], c["kind"]) for c in report["root_causes"])


def _died(job: Job, rank: int, text: str, at_s: float) -> None:
    job.set(rank, reason="exception", reason_detail=f"uncaught in thread MainThread: {text}",
            dump_time_ns=WALL_BASE_NS + int(at_s * 1e9),
            exception={"type": text.split(":")[0], "message": text.split(": ", 1)[1], "thread": "MainThread",
                       "traceback": ["train.py:50 in main", "train.py:31 in step", "model.py:12 in forward"]})


def test_classify() -> None:
    assert classify(GLOO_CLOSED) == "peer_error" and classify(GLOO_RESET) == "peer_error"
    assert classify("RuntimeError: [gloo] Timed out waiting 1800000ms for recv operation to complete") == "timeout"
    assert classify("ValueError: loss is NaN") == "error"
    assert not PEER_ERROR.search("CUDA out of memory")


def test_a_silent_death_is_the_crash_and_lost_connections_are_consequences(tmp_path: Path) -> None:
    """DDP: rank 3 died without a word; 0 and 2 raised 'connection closed' from the Reducer, 1 was terminated."""
    job = Job(4)
    for _ in range(3):
        job.collective("0", "all_reduce", source="c++", api="c++", site=None)
    job.collective("0", "all_reduce", ranks=[0, 1, 2], state="unknown", source="c++", api="c++", site=None)
    _died(job, 0, GLOO_CLOSED, 1.0)
    _died(job, 2, GLOO_RESET, 1.1)
    job.set(1, reason="signal", dump_time_ns=WALL_BASE_NS + int(1.5e9))
    report = analyzers.load(job.write(tmp_path, skip=[3])).report()
    assert report["verdict"] == "crash"
    assert causes(report) == [(3, "crashed")], report["root_causes"]
    (cause,) = report["root_causes"]
    assert cause["victims"] == [0, 1, 2]
    assert "127.0.0.1:63143" in cause["detail"] and "without leaving a dump" in cause["detail"]
    assert [(f["rank"], f["kind"]) for f in report["failures"]] == [(0, "peer_error"), (2, "peer_error"),
                                                                    (1, "terminated")]
    assert report["summary"].startswith("crash: rank 3 crashed")


def test_the_first_own_error_is_the_root_cause(tmp_path: Path) -> None:
    """Rank 2 raised its own error first; 0 and 1 lost their connection to it; 3 raised later, after them."""
    job = Job(4)
    job.collective("0", "all_reduce")
    job.collective("0", "all_reduce", ranks=[0, 1, 3], state="failed")
    _died(job, 2, "ValueError: loss is NaN at step 7", 1.0)
    _died(job, 0, GLOO_CLOSED, 1.2)
    _died(job, 1, GLOO_RESET, 1.3)
    _died(job, 3, "KeyError: 'labels'", 2.0)  # after the lost connections: a consequence, not a second root
    report = analyzers.load(job.write(tmp_path)).report()
    assert causes(report) == [(2, "crashed")], report["root_causes"]
    (cause,) = report["root_causes"]
    assert "ValueError: loss is NaN" in cause["detail"]
    assert cause["stack"][-1] == "model.py:12 in forward" and cause["victims"] == [0, 1, 3]


def test_a_missing_dump_without_lost_connections_stays_missing_dump(scenario) -> None:
    report = analyzers.load(scenario("missing_dump")).report()
    assert report["verdict"] == "hang" and causes(report) == [(3, "missing_dump")]


def test_a_clean_exit_is_named_exited(tmp_path: Path) -> None:
    """Uneven data: rank 1 ran two steps, left cleanly; the others wait for it in the third all_reduce."""
    job = Job(4)
    job.collective("0", "all_reduce")
    job.collective("0", "all_reduce")
    job.collective("0", "all_reduce", ranks=[0, 2, 3], state="started")
    job.set(1, reason="exit", reason_detail="normal interpreter exit", exit_record=True, threads=[])
    report = analyzers.load(job.write(tmp_path)).report()
    assert report["verdict"] == "hang"
    assert causes(report) == [(1, "exited")]
    assert "exited normally after all_reduce (group 0 [0-3] (world), seq 2" in report["root_causes"][0]["detail"]
    assert report["summary"].startswith("hang: rank 1 exited normally before all_reduce")


def test_exit_records_never_wait(tmp_path: Path) -> None:
    """A healthy DDP job dumped at exit: the ranks saw different numbers of C++-issued all-reduces in
    flight (59-62) when they left; none of them waits for anything."""
    job = Job(4)
    for _ in range(58):
        job.collective("0", "all_reduce", source="c++", api="c++")
    for rank, extra in ((0, 1), (1, 2), (2, 3), (3, 4)):
        for _ in range(extra):
            job.collective("0", "all_reduce", ranks=[rank], state="started", source="c++", api="c++")
        job.set(rank, reason="exit", reason_detail="normal interpreter exit")
    report = analyzers.load(job.write(tmp_path)).report()
    assert report["verdict"] == "healthy", report["summary"]
    assert report["waits"] == [] and report["root_causes"] == []


def test_progress_counters_see_past_a_wrapped_ring(tmp_path: Path) -> None:
    """Rank 1's ring holds only its side group's ops; its counters say it never entered world seq 2."""
    job = Job(4)
    job.group("5", [1], "solo1")
    job.collective("0", "all_reduce")
    for _ in range(20):
        job.collective("5", "all_reduce")
    job.collective("0", "all_reduce", ranks=[0, 2, 3], state="started")
    job.ring(1, 8)
    job.set(1, progress=[{"group": "0", "kind": "coll", "entered": 1, "started": 1, "completed": 1},
                         {"group": "5", "kind": "coll", "entered": 20, "started": 20, "completed": 20}])
    report = analyzers.load(job.write(tmp_path)).report()
    assert causes(report) == [(1, "not_entered")], (report["root_causes"], report["gaps"])
    job.set(1, progress=None)
    report = analyzers.load(job.write(tmp_path / "without")).report()
    assert causes(report) != [(1, "not_entered")]  # without the counters the ring alone cannot tell


def test_a_wait_chain_that_ends_at_an_unreadable_file_is_inconclusive(tmp_path: Path) -> None:
    """A bad file (or a reader's bug) is no evidence that its rank is the culprit (issue 21.6)."""
    job = Job(4)
    job.collective("0", "all_reduce")
    job.collective("0", "all_reduce", ranks=[0, 1, 2], state="started")
    folder = job.write(tmp_path)
    (folder / "rank-00003.json.gz").write_bytes(b"\x1f\x8b\x08\x00garbage")
    report = analyzers.load(folder).report()
    assert report["verdict"] == "inconclusive", report["summary"]
    assert report["ranks"]["unreadable"] == [3] and "could not be read" in report["summary"]


def _nan_skip(job: Job, last_state: dict[int, str]) -> None:
    """DDP, rank 2 skipped one backward: it issued 12 C++ all-reduces, left (exit record) and closed its
    connections; ranks 0, 1, 3 died in their 13th, which its recorder read from PyTorch's gloo recorder
    (that retires a failed op as completed)."""
    for _ in range(12):
        job.collective("0", "all_reduce", source="c++", api="c++", site=None)
    for rank in (0, 1, 3):
        job.collective("0", "all_reduce", ranks=[rank], state=last_state[rank], source="c++", api="c++", site=None)
    job.set(2, reason="exit", reason_detail="normal interpreter exit", exit_record=True, threads=[],
            dump_time_ns=WALL_BASE_NS + int(1.3e9))  # written at exit, after its connections closed
    for rank, at_s in ((1, 1.0), (3, 1.1), (0, 1.2)):
        _died(job, rank, GLOO_CLOSED, at_s)


def test_a_rank_that_left_while_the_others_failed_is_never_healthy(tmp_path: Path) -> None:
    """The others' last op reads completed (as PyTorch's gloo recorder has it) and nobody waits: the
    rank that left while they still ran their all-reduce is the root cause, never them."""
    job = Job(4)
    _nan_skip(job, {0: "started", 1: "completed", 3: "completed"})
    report = analyzers.load(job.write(tmp_path)).report()
    assert report["verdict"] == "hang", report["summary"]
    assert causes(report) == [(2, "exited")], report["root_causes"]
    (cause,) = report["root_causes"]
    assert cause["victims"] == [0, 1, 3] and cause["seq"] == 13 and cause["op"] == "all_reduce"
    assert report["summary"].startswith("hang: rank 2 exited normally before all_reduce (group 0, seq 13)")
    # rank 0's op is still running: ranks 1 and 3 'completed' it only as PyTorch's gloo recorder says (it
    # counts a failed op), and rank 2 never entered it: nobody can have completed it
    assert [w["rank"] for w in report["waits"]] == [0] and not any("rank 0's all_reduce" in g for g in report["gaps"])


def test_the_failed_ops_wait_for_the_rank_that_left(tmp_path: Path) -> None:
    """As the recorder writes it: the op the others died in is failed; they wait for the rank that left."""
    job = Job(4)
    _nan_skip(job, {0: "failed", 1: "failed", 3: "failed"})
    report = analyzers.load(job.write(tmp_path)).report()
    assert report["verdict"] == "hang" and causes(report) == [(2, "exited")], report["root_causes"]
    assert sorted(w["rank"] for w in report["waits"]) == [0, 1, 3]


def test_failures_nothing_explains_are_inconclusive(tmp_path: Path) -> None:
    """Every rank was stopped by a signal, or lost a connection, and nobody waits: never healthy."""
    job = Job(4)
    job.collective("0", "all_reduce")
    for rank in range(4):
        job.set(rank, reason="signal", reason_detail="SIGTERM", dump_time_ns=WALL_BASE_NS + int(1e9))
    report = analyzers.load(job.write(tmp_path)).report()
    assert report["verdict"] == "inconclusive", report["summary"]
    assert "ranks 0-3 were stopped by a signal" in report["summary"]
    job.set(1, reason="exception", reason_detail=f"uncaught in thread MainThread: {GLOO_CLOSED}")
    report = analyzers.load(job.write(tmp_path / "lost")).report()
    assert report["verdict"] == "inconclusive" and "rank 1 failed with a lost connection" in report["summary"]


def test_every_failure_and_exit_is_on_the_first_screen(tmp_path: Path) -> None:
    """The text report names how each rank ended, grouped by kind, before the root cause's detail."""
    from analyzers.reporting.render import text_report

    job = Job(4)
    _nan_skip(job, {0: "failed", 1: "failed", 3: "failed"})
    lines = text_report(analyzers.load(job.write(tmp_path)).report()).splitlines()
    assert lines[0] == ("HANG: rank 2 exited while its peers still ran all_reduce #13 of group 0 [0-3] (world); "
                        "ranks 0-1, 3 then failed on the lost connection")
    first_screen = "\n".join(lines[:24])
    assert "  rank 2 exited normally (+0.30 s)" in first_screen
    assert ("  ranks 0-1, 3 failed with a lost connection (+0.00 to +0.20 s): RuntimeError: Connection closed by peer "
            "[127.0.0.1]:63143.") in first_screen




def _crossed_after_a_crash(tmp_path: Path, also: dict[int, str]) -> dict:
    """Ranks 0 and 2 each wait in a group the other has not entered (a wait cycle), rank 3 waits with 0;
    rank 1 raised its own error at 1.0 s, rank 0 then lost its connection, 2 and 3 were terminated;
    `also`: rank -> the error it raised at 0.5 s instead."""
    job = Job(4)
    a, b = job.group("1", [0, 1, 2]), job.group("2", [0, 2, 3])
    job.collective("0", "all_reduce")
    job.collective(a, "all_reduce", ranks=[0, 1], state="started")
    job.collective(b, "all_reduce", ranks=[2, 3], state="started")
    _died(job, 1, "ValueError: gradient check failed in RaiseInBackward.backward", 1.0)
    for r in (0, 2, 3):
        if r in also:
            _died(job, r, also[r], 0.5)
        elif r == 0:
            _died(job, 0, GLOO_CLOSED, 1.2)
        else:
            job.set(r, reason="signal", dump_time_ns=WALL_BASE_NS + int(1.5e9))
    return analyzers.load(job.write(tmp_path)).report()


def test_a_wait_cycle_among_a_crashs_victims_is_not_a_deadlock(tmp_path: Path) -> None:
    """After rank 1's crash broke their groups, the op states of 0 and 2 close a wait cycle (seen once
    under CI's load on the emulated NCCL, where a failed op is retired as completed in PyTorch's
    recorder, so one rank's failed ops read done and another's pending). Every rank of the cycle lost
    its connection or was terminated after the crash: the crash is the cause, the cycle a note."""
    report = _crossed_after_a_crash(tmp_path, {})
    assert report["verdict"] == "crash", report["summary"]
    assert causes(report) == [(1, "crashed")], report["root_causes"]
    assert report["cycles"] == []
    assert any("wait cycle among ranks 0, 2" in gap and "rank 1 crashed" in gap for gap in report["gaps"]), report["gaps"]


def test_a_wait_cycle_through_a_rank_that_died_of_its_own_error_is_the_crash(tmp_path: Path) -> None:
    """Rank 2 of the cycle raised its own error first (seen under load on the emulated NCCL: the rank whose
    backward raised read as waiting in DDP's broadcast, its peer in the all_gather before it): a rank
    that died waits for nobody, its last ops froze pending. The crashes are the causes, never a deadlock
    naming rank 0, which only lost its connection."""
    report = _crossed_after_a_crash(tmp_path / "own", {2: "ValueError: loss is NaN"})
    assert report["verdict"] == "crash", report["summary"]
    assert causes(report) == [(1, "crashed"), (2, "crashed")], report["root_causes"]
    assert report["cycles"] == []


def test_a_wait_cycle_with_a_timed_out_rank_in_it_stays_a_deadlock(tmp_path: Path) -> None:
    """The same cycle, but rank 2 of it timed out waiting (its watchdog's timeout, not a lost connection):
    it was alive and waiting, so the cycle is not a crash's consequence and stays a deadlock."""
    report = _crossed_after_a_crash(tmp_path / "timeout", {2: "RuntimeError: [gloo] Timed out waiting 1800000ms "
                                                              "for recv operation to complete"})
    assert report["cycles"] == [[0, 2]], report["summary"]
    assert report["verdict"] == "deadlock"
