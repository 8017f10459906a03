"""fork, spawn, destroy_process_group and interpreter shutdown with the recorder armed."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.child import command, env_with_root, facts
from tests.helpers import entries, load_dump

ROOT = Path(__file__).resolve().parents[2]
JOBS = "tests.reliability.one_rank_jobs"


def test_dataloader_workers_neither_record_nor_replace_the_ranks_dump(tmp_path: Path) -> None:
    """Armed from the environment (FLIGHTREC=1) and dumping at exit, as a user's job would be.

    fork workers: the recorder is off in them and no watchdog runs. spawn workers re-arm from the
    environment and inherit RANK, but never join a group: at their exit they must not replace the
    rank's dump with an empty one (they did: a hang's dump was lost to the next DataLoader epoch).
    """
    env = env_with_root({"FLIGHTREC": "1", "FLIGHTREC_DIR": str(tmp_path), "FLIGHTREC_DUMP_ON_EXIT": "1",
                         "RANK": "0", "WORLD_SIZE": "1", "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
    probe = subprocess.run(command(JOBS, "dataloader_workers"), capture_output=True, text=True, timeout=120, cwd=ROOT,
                           env=env)
    assert probe.returncode == 0, probe.stderr[-3000:]
    got = facts(probe.stdout)
    assert got["dumped_before"], probe.stderr[-3000:]
    rows, parent = got["rows"], got["pid"]
    forked = [r for r in rows if r[0] == "fork"]
    spawned = [r for r in rows if r[0] == "spawn"]
    assert len(forked) == len(spawned) == 4
    assert all(pid != parent and armed == 0 and watchdogs == 0 for _, pid, armed, watchdogs, _ in forked), forked
    assert all(recorded == 0 for *_, recorded in spawned), spawned  # armed there, but nothing to record
    dump = load_dump(tmp_path, 0)
    assert dump["pid"] == parent and dump["reason"] == "exit"
    assert [e["op"] for e in entries(dump)] == ["all_reduce"] * 4
    assert "Traceback" not in probe.stderr


def test_destroy_and_exit_while_the_watchdog_ticks(tmp_path: Path) -> None:
    """25 init/destroy cycles under a watchdog ticking every millisecond, then exit with it running."""
    for attempt in range(2):
        out = tmp_path / str(attempt)
        proc = subprocess.run(command(JOBS, "destroy_and_exit", out), capture_output=True, text=True, timeout=90,
                              cwd=ROOT, env=env_with_root({"OMP_NUM_THREADS": "1", "RANK": "0", "PATH": "/usr/bin:/bin"}))
        assert proc.returncode == 0, proc.stderr[-3000:]
        for bad in ("Traceback", "Exception ignored", "terminate called", "watchdog error"):
            assert bad not in proc.stderr, proc.stderr[-3000:]
        got = facts(proc.stdout)
        assert got["enabled"] and got["watchdog_alive"], got
        assert (got["known"], got["retired"]) == (0, 50)  # destroyed groups let go, each kept as a row (at most 1,024)
        dump = load_dump(out, 0)
        assert dump["reason"] == "exit"
        # each of the 25 incarnations of group "0" numbers 1..21; the 24 re-created over keep labels of their own
        by_group: dict[str, list[int]] = {}
        for e in entries(dump):
            if e["kind"] == "coll" and e["group"].split("@")[0] == "0":
                by_group.setdefault(e["group"], []).append(e["seq"])
        assert by_group.pop("0") == list(range(1, 22))
        assert len(by_group) >= 1 and all(seqs == list(range(22 - len(seqs), 22)) for seqs in by_group.values())
