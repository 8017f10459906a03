"""When dumps happen: timeout (job-wide), failing op, exit, manual trigger, SIGTERM; and where they can't."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest

from fixtures.launch import kill_tree, launch
from flightrec.format.names import dump_filename
from tests.child import command, env_with_root, facts
from tests.helpers import entries, load_dump, run_ranks, wait_for
from tests.recorder import workers

ROOT = Path(__file__).resolve().parents[2]
JOBS = "tests.recorder.one_rank_jobs"
TRAIN = ROOT / "fixtures" / "jobs" / "train.py"


def test_sleeping_rank_makes_every_rank_dump_within_the_timeout(tmp_path: Path) -> None:
    timeout = 2.0
    result = launch(TRAIN, 4, tmp_path, ["--fault", "compute_hang", "--fault-rank", "2", "--fault-step", "2"],
                    env={"FLIGHTREC_TIMEOUT": str(timeout)}, wait_for_ranks=[0, 1, 2, 3], timeout_s=60)
    assert not result.timed_out, result.output[-3000:]
    dumps = {r: load_dump(tmp_path, r) for r in range(4)}
    # the first dump comes one timeout after the hang, the rest a few seconds later at most
    times = sorted(d["dump_time_ns"] for d in dumps.values())
    assert (times[-1] - times[0]) / 1e9 < 5.0
    sleeper = dumps[2]
    main_stack = next(t["stack"] for t in sleeper["threads"] if t["is_main"])
    assert main_stack[-1].endswith("in stall_in_compute"), main_stack
    assert sleeper["reason"] == "peer_request"
    waiting = [d for r, d in dumps.items() if r != 2]
    assert any(d["reason"] == "timeout" for d in waiting)
    for d in waiting:
        pending = [e for e in entries(d) if e["state"] == "started"]
        assert [(e["op"], e["seq"]) for e in pending] == [("all_reduce", 3)], pending
    assert not [e for e in entries(sleeper) if e["state"] == "started"]
    assert all(d["world_size"] == 4 and d["job_id"] for d in dumps.values())
    # each file's first gzip member is the summary: counters, threads and the recent ops, pending one included
    for rank in range(4):
        raw = (tmp_path / dump_filename(rank)).read_bytes()
        inflate = zlib.decompressobj(31)
        head = inflate.decompress(raw)
        assert inflate.eof and inflate.unused_data and head.endswith(b",")
        summary = json.loads(head[:-1] + b"}")
        assert "entries" not in summary and summary["progress"] and summary["threads"]
        assert summary["recent"]["entries"]["id"], rank
    import analyzers

    report = analyzers.load(tmp_path, read="summary").report()
    assert report["read"] == "summary"
    assert [(c["rank"], c["kind"]) for c in report["root_causes"]] == [(2, "not_entered")], report["root_causes"]


@pytest.mark.parametrize("waited", [False, True], ids=["blocking", "async-wait"])
def test_failing_op_dumps_at_once(tmp_path: Path, waited: bool) -> None:
    codes = run_ranks(workers.failing_op, 2, str(tmp_path), waited, timeout_s=60, allow_failure=True)
    assert codes[0] == 3, codes
    dump = load_dump(tmp_path, 0)
    assert dump["reason"] == "op_failed"
    failed = [e for e in entries(dump) if e["state"] == "failed"]
    assert len(failed) == 1 and failed[0]["op"] == "all_reduce" and failed[0]["seq"] == 2
    assert failed[0]["error"]


def test_dump_on_exit(tmp_path: Path) -> None:
    run_ranks(workers.exit_dump, 2, str(tmp_path), timeout_s=60)
    for rank in range(2):
        dump = load_dump(tmp_path, rank)
        assert dump["reason"] == "exit"
        assert [e["op"] for e in entries(dump)] == ["all_reduce"] * 3
        assert all(e["state"] == "completed" for e in entries(dump))


def test_only_an_exit_record_at_exit_by_default(tmp_path: Path) -> None:
    """Without FLIGHTREC_DUMP_ON_EXIT a clean exit leaves the small exit record: the last ops, the
    progress counters, no thread stacks (so a rank that finished early is told from a crashed one)."""
    result = launch(TRAIN, 2, tmp_path, ["--steps", "40"], timeout_s=60)
    assert result.returncode == 0, result.output[-3000:]
    assert len(result.dumps) == 2
    for rank in range(2):
        dump = load_dump(tmp_path, rank)
        assert dump["reason"] == "exit" and dump["exit_record"] is True and dump["threads"] == []
        assert len(entries(dump)) == 16 and dump["recorded"] == 41  # 40 all_reduces and the barrier
        assert {"group": "0", "kind": "coll", "live": False, "entered": 41, "started": 41, "completed": 41} \
            in dump["progress"]


def test_manual_trigger_while_every_rank_is_blocked(tmp_path: Path) -> None:
    import torch.multiprocessing as mp

    from fixtures.launch import free_port

    ctx = mp.start_processes(workers.blocked_forever, args=(3, free_port(), str(tmp_path)), nprocs=3,
                             join=False, start_method="spawn")
    try:
        assert wait_for(lambda: all((tmp_path / f".ready-{r}").exists() for r in range(3)), 60)
        time.sleep(0.5)
        cli = subprocess.run([sys.executable, "-m", "flightrec", "dump-now", str(tmp_path), "--wait", "30"],
                             capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert cli.returncode == 0, cli.stderr
        assert "3 of 3 ranks answered in " in cli.stdout and f"flightrec analyze {tmp_path}" in cli.stdout
        assert all((tmp_path / dump_filename(r)).exists() for r in range(3))
        for rank in range(3):
            assert load_dump(tmp_path, rank)["reason"] == "manual"
    finally:
        for p in ctx.processes:
            kill_tree(p.pid)
            p.join(5)


def test_dump_now_says_when_no_rank_answers(tmp_path: Path) -> None:
    quiet = subprocess.run([sys.executable, "-m", "flightrec", "dump-now", str(tmp_path / "nobody"), "--wait", "0.5"],
                           capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert quiet.returncode == 1 and "no rank answered within 0.5 s: the folder did not exist" in quiet.stderr
    idle = subprocess.run([sys.executable, "-m", "flightrec", "dump-now", str(tmp_path), "--wait", "0.5"],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert idle.returncode == 1 and "FLIGHTREC=1" in idle.stderr


def test_sigterm_dumps_then_dies_of_sigterm(tmp_path: Path) -> None:
    result = launch(TRAIN, 2, tmp_path, ["--fault", "compute_hang", "--fault-rank", "0", "--fault-step", "1"],
                    env={"FLIGHTREC_TIMEOUT": "300"}, wait_for_ranks=None, timeout_s=4)
    assert result.timed_out and result.dumps == []  # no timeout, no dump: the job just hangs
    # now the same hang, but the launcher terminates the workers as torchrun does when one fails
    out = subprocess.run(command(JOBS, "sigterm_torchrun_workers", tmp_path / "term", TRAIN), capture_output=True,
                         text=True, timeout=90, env=env_with_root())
    assert out.returncode == 0, out.stderr[-3000:]
    assert facts(out.stdout)["workers"] == 2
    folder = tmp_path / "term"
    for rank in range(2):
        dump = load_dump(folder, rank)
        assert dump["reason"] == "signal"
    blocked = entries(load_dump(folder, 1))
    assert [e["state"] for e in blocked if e["op"] == "all_reduce"][-1] == "started"


def test_unwritable_folder_keeps_the_job_alive(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    result_prefix = str(tmp_path / "result")
    run_ranks(workers.unwritable, 2, str(not_a_dir / "dumps"), result_prefix, timeout_s=60)
    for rank in range(2):
        assert Path(f"{result_prefix}.{rank}").read_text() == "None"
    err = capfd.readouterr().err
    assert "could not write a dump" in err
    assert err.count("could not write a dump") <= 2  # once per rank, not once per attempt


def test_dump_is_atomic_and_replaces_older(tmp_path: Path) -> None:
    from flightrec.watch.dump_writer import write_dump

    write_dump({"rank": 3, "n": 1}, str(tmp_path))
    (tmp_path / ".rank-00003.json.gz.999999.tmp").write_bytes(b"half")  # left by a killed writer
    path = write_dump({"rank": 3, "n": 2}, str(tmp_path))
    assert os.path.basename(path) == "rank-00003.json.gz"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank-00003.json.gz"]
    assert load_dump(tmp_path, 3)["n"] == 2


def test_sigterm_to_an_idle_process_keeps_default_exit(tmp_path: Path) -> None:
    proc = subprocess.Popen(command(JOBS, "idle_armed", tmp_path), stdout=subprocess.PIPE, text=True,
                            env=env_with_root())
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == -signal.SIGTERM
    finally:
        proc.kill()


def test_sigterm_inside_a_dump_of_the_same_thread_does_not_deadlock(tmp_path: Path) -> None:
    """An op fails in the main thread, which dumps there; the launcher's SIGTERM lands while that
    dump is being written. The handler (main thread, between two bytecodes) must not wait for the
    dump lock its own thread holds: the dump finishes, then the process dumps again and dies."""
    proc = subprocess.run(command(JOBS, "sigterm_inside_dump", tmp_path), capture_output=True, text=True, timeout=60,
                          env=env_with_root())
    assert proc.returncode == -signal.SIGTERM, proc.stderr[-2000:]
    assert "survived" not in proc.stdout
    assert load_dump(tmp_path, 0)["reason"] == "signal"  # the first dump completed, then the signal's
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_abort_dumps_then_dies_of_sigabrt(tmp_path: Path) -> None:
    proc = subprocess.run(command(JOBS, "abort_after_op", tmp_path), capture_output=True, text=True, timeout=60,
                          env=env_with_root())
    assert proc.returncode == -signal.SIGABRT, proc.stderr[-2000:]
    dump = load_dump(tmp_path, 0)
    assert dump["reason"] == "abort" and [e["op"] for e in entries(dump)] == ["all_reduce"]


def test_exit_waits_for_a_watchdog_blocked_in_the_store(tmp_path: Path) -> None:
    codes = run_ranks(workers.exit_while_store_call_in_flight, 2, str(tmp_path), timeout_s=60)
    assert codes == [0, 0], "exit code 5: the watchdog thread outlived the exit hook"
    assert load_dump(tmp_path, 1)["reason"] == "exit"


def test_an_op_in_flight_is_dumped_after_the_ring_dropped_it(tmp_path: Path) -> None:
    run_ranks(workers.in_flight_past_the_ring, 2, str(tmp_path), timeout_s=90)
    dump = load_dump(tmp_path, 0)
    assert dump["reason"] == "api:in-flight"
    rows = entries(dump)
    assert [(e["op"], e["state"]) for e in rows][0] == ("recv", "started"), rows
    assert len(rows) == 5 and rows[0]["id"] < rows[1]["id"] - 1  # the 4 kept entries, after the older one
