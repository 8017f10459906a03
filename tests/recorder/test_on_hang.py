"""FLIGHTREC_ON_HANG: a hung job says so once per rank and, with `abort`, ends so that it can be restarted.

The job tests are real torchrun gloo jobs (4 ranks on 127.0.0.1, rank 2 stalls in compute), each
bounded by `launch`'s time limit, which kills every process of the job before it returns.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
from pathlib import Path

import pytest

from fixtures.launch import launch
from flightrec import log
from flightrec.format.names import dump_filename
from flightrec.settings import DEFAULT_ABORT_GRACE_S, Settings, SettingsError, load_settings
from flightrec.watch.on_hang import ABORT_EXIT_CODE, HangAction, find_suspects, parse_answers, write_error_file
from tests.child import command, env_with_root
from tests.helpers import entries, load_dump, read_dump

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ROOT / "fixtures" / "jobs" / "train.py"
RANKS = 4
HANG = ["--fault", "compute_hang", "--fault-rank", "2", "--fault-step", "2"]
GRACE_S = 3.0  # the stalled rank answers the store request within ~1 s; 2 loaded cores need the margin
GLOO_TIMEOUT_S = 1800  # gloo's default: what a hung job costs without abort


def _hung_lines(output: str) -> dict[int, int]:
    """How many 'the job is hung' lines each rank logged."""
    counts = dict.fromkeys(range(RANKS), 0)
    for m in re.finditer(r"^\[flightrec rank (\d+)\] the job is hung: ", output, re.M):
        counts[int(m.group(1))] += 1
    return counts


def test_on_hang_values(capsys: pytest.CaptureFixture[str]) -> None:
    log.reset()
    assert load_settings({}).on_hang == "wait" and load_settings({}).abort_grace_s == DEFAULT_ABORT_GRACE_S
    assert load_settings({"FLIGHTREC_ON_HANG": " Abort "}).on_hang == "abort"
    assert load_settings({"FLIGHTREC_ON_HANG": "kill"}).on_hang == "wait"  # not a reason to turn the recorder off
    assert load_settings({"FLIGHTREC_ON_HANG": "exit"}).on_hang == "wait"
    warned = [line for line in capsys.readouterr().err.splitlines() if "FLIGHTREC_ON_HANG" in line]
    assert len(warned) == 1 and "'kill' is neither 'wait' nor 'abort'; using 'wait'" in warned[0]
    assert load_settings(on_hang="abort", abort_grace_s=0).abort_grace_s == 0
    for bad in ("soon", "-1", "nan", "1e9"):
        with pytest.raises(SettingsError, match="FLIGHTREC_ABORT_GRACE_S"):
            load_settings({"FLIGHTREC_ABORT_GRACE_S": bad})
    log.reset()


def test_abort_is_scheduled_once_and_never_on_an_unconfirmed_hang(capsys: pytest.CaptureFixture[str]) -> None:
    wait = HangAction(Settings(on_hang="wait"))
    wait.hung("all_reduce group=0 seq=3 incomplete after 2.0s", written=True)
    assert wait.abort_at is None and not wait.dump_is_final
    unsure = HangAction(Settings(on_hang="abort"))
    unsure.hung("all_reduce group=0 seq=3, then no op for 2.0s", written=True, confirmed=False)
    assert unsure.abort_at is None  # a long compute phase after a C++-issued op looks the same
    sure = HangAction(Settings(on_hang="abort", abort_grace_s=30))
    sure.hung("first", written=True)
    first = sure.abort_at
    sure.hung("second", written=True)
    assert first is not None and sure.abort_at == first and sure.what == "first" and sure.dump_is_final
    assert not sure.due()
    err = capsys.readouterr().err
    assert err.count("the job is hung: ") == 2 and err.count("may be hung") == 1  # one line per process each
    assert "FLIGHTREC_ON_HANG=wait: the job stays up" in err and "this rank exits in 30 s" in err


def _root_cause_rank(output: str) -> int | None:
    """The rank of torchrun's "Root Cause (first observed failure)" section."""
    m = re.search(r"Root Cause \(first observed failure\):\n\[\d+\]:\n(?:.*\n){2}\s*rank\s*: (\d+)", output)
    return int(m.group(1)) if m else None


def test_abort_ends_a_hung_torchrun_job_after_every_rank_dumped(tmp_path: Path) -> None:
    """Rank 2 stalls in compute: every rank's abort line names rank 2 and the dump folder, rank 2 exits
    first, so torchrun's root cause is rank 2, and its error file puts our line in that section."""
    result = launch(TRAIN, RANKS, tmp_path, HANG, timeout_s=90,
                    env={"FLIGHTREC_TIMEOUT": "1", "FLIGHTREC_ON_HANG": "abort", "FLIGHTREC_ABORT_GRACE_S": str(GRACE_S)})
    out = result.output
    assert not result.timed_out and not result.stopped, out[-3000:]  # torchrun ended on its own
    assert result.returncode != 0 and result.elapsed_s < GLOO_TIMEOUT_S / 10, (result.returncode, out[-3000:])
    assert f"exitcode: {ABORT_EXIT_CODE}" in out, out[-3000:]  # torchrun saw a worker fail with our code
    reasons = {r: load_dump(tmp_path, r)["reason"] for r in range(RANKS)}
    assert reasons[2] == "peer_request" and set(reasons.values()) <= {"timeout", "peer_request"}, reasons
    lines = dict(re.findall(r"^flightrec: aborting rank (\d+): (hung in all_reduce group=0 seq=3 .*)$", out, re.M))
    # each rank once: the suspect at the end of its grace period, the others when torchrun stops them
    assert sorted(int(r) for r in lines) == list(range(RANKS)), out[-3000:]
    for rank, line in lines.items():
        mine = "; this rank" if rank == "2" else ""
        assert f"; suspect: rank 2 (not in group=0 seq=3 yet){mine}; dumps in {tmp_path} on " in line, line
        assert line.endswith(f"; FLIGHTREC_ON_HANG=abort (exit code {ABORT_EXIT_CODE})"), line
    assert _hung_lines(out) == dict.fromkeys(range(RANKS), 1), out[-3000:]
    root = out[out.index("Root Cause (first observed failure)"):]
    assert _root_cause_rank(out) == 2, root[:1500]
    assert f"exitcode  : {ABORT_EXIT_CODE}" in root and "flightrec: aborting rank 2: " in root, root[:1500]


def test_suspects_are_named_from_the_answers_never_guessed() -> None:
    assert parse_answers("0:3;2:2;bad;3:x;1:3;") == {0: 3, 2: 2, 1: 3}
    held = find_suspects("0", 3, {0: 3, 1: 3, 2: 2, 3: 3}, [0, 1, 2, 3])
    assert (held.behind, held.silent) == ([2], []) and held.text(0) == "suspect: rank 2 (not in group=0 seq=3 yet)"
    assert held.text(2).endswith("; this rank")
    quiet = find_suspects("0", 3, {0: 3, 1: 3}, [0, 1, 2, 3])  # 2 and 3 never answered: both named, no tie broken
    assert quiet.text(1) == "suspects: ranks 2, 3 (did not answer the dump request)"
    both = find_suspects("g", 5, {0: 5, 1: 4}, [0, 1, 2])
    assert both.text(0) == "suspects: rank 1 (not in group=g seq=5 yet), rank 2 (did not answer the dump request)"
    assert find_suspects("0", 3, {0: 3, 1: 3}, [0, 1]).text(0) == ""  # everyone is in it: unknown, said so
    assert find_suspects("0", 3, {0: 3, 5: 1}, None).behind == [5]  # a non-member knows no members: no silent ones
    action = HangAction(Settings(on_hang="abort", dir="/tmp/d"))
    action.hung("all_reduce group=0 seq=3 incomplete after 2.0s", written=True)
    assert "suspect unknown: run flightrec analyze /tmp/d" in action.abort_line()
    action.suspects = find_suspects("0", 3, {0: 3, 1: 3}, [0, 1])
    assert "suspect unknown: run flightrec analyze /tmp/d" in action.abort_line() and not action.hold(0)
    action.suspects = held
    first = action.abort_at
    assert not action.hold(2) and action.hold(0) and not action.hold(0)  # an innocent waits once, the suspect never
    assert action.abort_at is not None and first is not None and action.abort_at > first
    action.suspects = quiet  # silent suspects cannot exit on their own: nobody waits for them
    action.held = False
    assert not action.hold(0)


def test_the_abort_line_goes_into_torchruns_error_file(tmp_path: Path) -> None:
    path = tmp_path / "error.json"
    write_error_file("flightrec: aborting rank 0: ...", {"TORCHELASTIC_ERROR_FILE": str(path)})
    data = json.loads(path.read_text())
    assert data["message"]["extraInfo"]["py_callstack"] == "flightrec: aborting rank 0: ..."
    assert int(data["message"]["extraInfo"]["timestamp"]) > 0
    write_error_file("other", {"TORCHELASTIC_ERROR_FILE": str(path)})  # the job's own error file stays
    assert json.loads(path.read_text()) == data
    write_error_file("none", {})  # not under torchrun: nothing


def test_wait_is_the_default_and_keeps_a_hung_job_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLIGHTREC_ON_HANG", raising=False)
    # every rank dumped, then nothing for grace + 3 s: with abort, the job would have ended by then
    grace = 1.0
    result = launch(TRAIN, RANKS, tmp_path, HANG, wait_for_ranks=list(range(RANKS)), settle_s=grace + 3, timeout_s=90,
                    env={"FLIGHTREC_TIMEOUT": "1", "FLIGHTREC_ABORT_GRACE_S": str(grace)})
    out = result.output
    assert not result.timed_out and result.stopped, out[-3000:]  # still running when launch stopped it
    assert "aborting" not in out and "exitcode" not in out, out[-3000:]
    assert _hung_lines(out) == dict.fromkeys(range(RANKS), 1), out[-3000:]
    line = next(x for x in out.splitlines() if x.startswith("[flightrec rank 2] the job is hung"))
    assert f"dumps in {tmp_path} on " in line and f"flightrec analyze {tmp_path}" in line and "seq=3" in line
    assert "FLIGHTREC_ON_HANG=wait" in line


def test_after_a_hang_dump_with_abort_no_dump_replaces_it_and_the_watchdog_exits(tmp_path: Path) -> None:
    run = subprocess.run(command("tests.recorder.one_rank_jobs", "final_hang_dump", tmp_path), capture_output=True,
                         text=True, timeout=60,
                         env=env_with_root({k: v for k, v in os.environ.items() if not k.startswith("FLIGHTREC")}))
    assert run.returncode == ABORT_EXIT_CODE, (run.returncode, run.stderr[-3000:])
    assert run.stdout == "True True\nstill buffered", run.stdout
    assert run.stderr.strip().splitlines()[-1] == (
        f"flightrec: aborting rank 0: hung in all_reduce group=0 seq=7 incomplete after 9.0s; suspect unknown: run "
        f"flightrec analyze {tmp_path}; dumps in {tmp_path} on {socket.gethostname()}; "
        f"FLIGHTREC_ON_HANG=abort (exit code {ABORT_EXIT_CODE})"), run.stderr[-3000:]
    assert read_dump(str(tmp_path / "rank-00000.json.gz"))["reason"] == "api:before"


SCENARIO_JOB = ROOT / "fixtures" / "jobs" / "scenarios.py"


def test_a_stall_that_recovers_is_recorded_and_the_exit_record_replaces_the_hang_dump(tmp_path: Path) -> None:
    """Rank 0 checkpoints for 4 s while the others wait in a barrier (FLIGHTREC_TIMEOUT=1.5): every rank
    dumps and says the job is hung, then says it recovered, and leaves an exit record that keeps the
    barrier (past its last 16 ops) and a `recovered` record of it; the job exits 0."""
    result = launch(SCENARIO_JOB, RANKS, tmp_path, ["checkpoint_stall_recovers", "--fault-rank", "0", "--stall-s", "4",
                                                    "--steps", "20"], env={"FLIGHTREC_TIMEOUT": "1.5"}, timeout_s=90)
    assert result.returncode == 0 and not result.stopped, result.output[-3000:]
    assert _hung_lines(result.output) == dict.fromkeys(range(RANKS), 1), result.output[-3000:]
    recovered = re.findall(r"^\[flightrec rank (\d+)\] recovered(?: after (\d+\.\d) s)?", result.output, re.M)
    assert sorted(int(r) for r, _ in recovered) == list(range(RANKS)), result.output[-3000:]
    assert all(float(s) >= 3.0 for r, s in recovered if r != "0"), recovered
    for rank in range(RANKS):
        dump = read_dump(str(tmp_path / dump_filename(rank)))
        assert dump["reason"] == "exit" and dump["exit_record"], (rank, dump["reason"])
        (item,) = dump["recovered"]
        assert (item["group"], item["op"], item["timed_out"]) == ("0", "barrier", rank != 0), item
        assert item["hang_reason"] == ("peer_request" if rank == 0 else "timeout") and item["timeout_s"] == 1.5
        assert "checkpoint_stall_recovers" in item["site"] and item["hang_dump_ns"] < item["completed_wall_ns"]
        assert (rank == 0) == (item["waited_s"] < 1.0), item
        kept = {e["id"]: e for e in entries(dump)}  # 17 ops came after it: the exit record kept it for the record
        assert kept[item["id"]]["op"] == "barrier" and len(kept) == 17, sorted(kept)
