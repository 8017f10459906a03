"""The recorder under faults, in real processes: it never harms the job and loses no dump."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

import analyzers
from tests.child import command, env_with_root, facts
from tests.helpers import entries, load_dump, run_ranks, wait_for
from tests.reliability import workers

ROOT = Path(__file__).resolve().parents[2]
ENV = env_with_root(OMP_NUM_THREADS="1")
ENV.pop("FLIGHTREC", None)
JOBS = "tests.reliability.one_rank_jobs"


def _job(name: str, *args: object, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run a job of tests/reliability/one_rank_jobs.py to its end."""
    return subprocess.run(command(JOBS, name, *args), capture_output=True, text=True, timeout=timeout, env=ENV,
                          cwd=ROOT)


def test_kill_9_between_write_and_rename_keeps_the_previous_dump(tmp_path: Path) -> None:
    out, marker = tmp_path / "dumps", tmp_path / "in-window"
    proc = subprocess.Popen(command(JOBS, "killed_mid_write", out, marker), env=ENV, cwd=ROOT,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert wait_for(marker.exists, 60), proc.stderr.read() if proc.poll() is not None else "no window"
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        proc.kill()
    tmp = Path(marker.read_text())
    assert tmp.exists() and tmp.name.startswith(".rank-00000.json.gz.")  # the new dump, complete but unnamed
    first = load_dump(out, 0)
    assert first["reason"] == "api:first" and len(entries(first)) == 3  # the previous dump, intact
    report = analyzers.load(out).report()  # the analyzer never reads the leftover
    assert report["ranks"]["dumped"] == [0] and not report["unreadable_files"]
    # the next process of that rank removes the leftover of the dead writer
    again = _job("dump_once", out)
    assert again.returncode == 0, again.stderr[-2000:]
    assert facts(again.stdout)["dumped"], again.stderr[-2000:]
    assert sorted(p.name for p in out.iterdir()) == ["rank-00000.json.gz"]


def test_kill_9_at_random_moments_of_big_dumps_never_leaves_a_broken_file(tmp_path: Path) -> None:
    """No test hook: SIGKILL lands wherever the loop of ~1 MB dumps happens to be."""
    out = tmp_path / "dumps"
    proc = subprocess.Popen(command(JOBS, "dumping_in_a_loop", out), env=ENV, cwd=ROOT, stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        assert wait_for(lambda: (out / "rank-00000.json.gz").exists(), 30)
        time.sleep(1.3)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        proc.kill()
    dump = load_dump(out, 0)  # always a whole dump, never a torn one
    assert len(entries(dump)) == 20000
    assert analyzers.load(out).report()["ranks"]["dumped"] == [0]


def test_full_read_only_and_missing_folder(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    out, result = tmp_path / "dumps", str(tmp_path / "result")
    run_ranks(workers.broken_folder, 2, str(out), result, timeout_s=90)
    err = capfd.readouterr().err
    for rank in range(2):
        report = json.loads(Path(f"{result}.{rank}").read_text())
        assert report["sigxfsz"], "SIGXFSZ must stay ignored, or a full disk would kill the job"
        for phase in ("full", "read_only"):
            assert report[phase]["failed"] == [None, None, None], (phase, report[phase])
            assert report[phase]["later"], f"{phase}: no dump once repaired"
        assert all(report["missing"]["failed"]), "a deleted folder is recreated by the next dump"
        # nothing recorded while dumps failed was lost: the last dump holds every op since
        dump = load_dump(out, rank)
        assert dump["reason"] == "api:missing-later"
        ops = [e for e in entries(dump) if e["op"] == "all_reduce"]
        assert len(ops) == report["missing"]["ops"] == 3 * 17
        assert [e["seq"] for e in entries(dump) if e["group"] == "0"] == list(range(1, len(entries(dump)) + 1))
        assert any("could not write a dump" in text for text in dump["recorder_errors"])
    # one warning per rank for all eight failed attempts, not one per attempt
    assert err.count("could not write a dump") == 2, err[-3000:]
    assert "Traceback" not in err


def test_store_host_death_every_survivor_dumps_on_its_own_timeout(tmp_path: Path) -> None:
    result = str(tmp_path / "result")
    codes = run_ranks(workers.store_host_dies, 3, str(tmp_path), result, timeout_s=90, allow_failure=True)
    assert codes == [-signal.SIGKILL, 0, 0], codes
    for rank in (1, 2):
        first = json.loads(Path(f"{result}.{rank}").read_text())
        dump = first["dump"]
        assert dump["reason"] == "timeout", dump["reason"]
        # the timeout (1 s), plus at most one store call the watchdog was in when the host died
        assert first["after_s"] < 1.0 + 7.0 + 3.0, first["after_s"]
        stuck = [e for e in entries(dump) if e["state"] == "started"]
        assert [(e["op"], e["peer"]) for e in stuck] == [("recv", 3 - rank)]
    report = analyzers.load(tmp_path).report()
    assert report["ranks"]["dumped"] == [1, 2] and 0 in report["ranks"]["missing"]


def test_threads_hundreds_of_groups_and_reused_group_names(tmp_path: Path) -> None:
    threads, per_thread, many, cycles = 4, 150, 300, 20
    result = str(tmp_path / "result")
    run_ranks(workers.threads_and_groups, 2, str(tmp_path), result, threads, per_thread, many, cycles,
              timeout_s=180)
    dumps = [load_dump(tmp_path, r) for r in range(2)]
    stats = [json.loads(Path(f"{result}.{r}").read_text()) for r in range(2)]
    sigs = []
    for dump, stat in zip(dumps, stats, strict=True):
        rows = entries(dump)
        by_group: dict[str, list[int]] = {}
        for row in rows:
            if row["kind"] == "coll":
                by_group.setdefault(row["group"], []).append(row["seq"])
        assert all(seq == list(range(1, len(seq) + 1)) for seq in by_group.values()), "seq gap or repeat"
        per_group = sorted(len(seq) for seq in by_group.values())
        assert per_group.count(per_thread) >= threads  # every thread's group, whole
        # the reused name (one per cycle, same hash): each destroyed group keeps its 2 ops under a label
        # of its own (`<name>@<digest>`, `.2`, ...), the next one numbers from 1 again
        reused = {name: seq for name, seq in by_group.items() if "@" in name}
        assert len(reused) == cycles and all(seq == [1, 2] for seq in reused.values()), reused
        assert len({name.split("@")[0] for name in reused}) == 1
        assert all(row["state"] == "completed" for row in rows)
        sigs.append(sorted((row["group"], row["seq"], row["op"]) for row in rows if row["kind"] == "coll"))
        # registry: one row per live group; destroyed ones let go (their sockets too), rows bounded
        assert stat["live_after_many"] == 1 + threads + many
        assert stat["live_at_end"] == 1 + threads + many and stat["retired"] == cycles
        assert stat["pending"] == 0
    assert sigs[0] == sigs[1]  # the same collectives at the same positions on both ranks
    report = analyzers.load(tmp_path).report()
    assert report["verdict"] == "healthy", report["root_causes"]
    print(f"\n{many} process groups created in {stats[0]['created_s']:.1f}s (gloo, lazy init)")



def test_a_thousand_live_groups_number_each_group_on_its_own(tmp_path: Path) -> None:
    """1,000 groups at once (2,000 do not fit gloo on 2 cores even without the recorder: 3 threads
    and ~4 descriptors per group); the registry holds one row per live group, numbering stays right."""
    many, used = 1000, 20
    result = str(tmp_path / "result")
    run_ranks(workers.a_thousand_groups, 2, str(tmp_path), result, many, used, timeout_s=150)
    dumps = [load_dump(tmp_path, r) for r in range(2)]
    stats = [json.loads(Path(f"{result}.{r}").read_text()) for r in range(2)]
    sigs = []
    for dump, stat in zip(dumps, stats, strict=True):
        seqs: dict[str, list[int]] = {}
        for row in entries(dump):
            seqs.setdefault(row["group"], []).append(row["seq"])
        assert sorted(len(s) for s in seqs.values()) == sorted(i % 3 + 1 for i in range(used)), seqs
        assert all(s == list(range(1, len(s) + 1)) for s in seqs.values())
        assert stat["live"] == 1 + many and stat["pending"] == 0
        sigs.append(sorted((g, tuple(s)) for g, s in seqs.items()))
    assert sigs[0] == sigs[1]
    print(f"\n{many} process groups created in {stats[0]['created_s']:.1f}s (gloo, lazy init)")


def test_a_really_full_disk(tmp_path: Path) -> None:
    """ENOSPC from a 256 KiB tmpfs, where the machine lets root mount one (skipped elsewhere)."""
    mount = tmp_path / "tiny"
    mount.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)],
                                           capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (not root, or no mount permission in this container)")
    try:
        folder, filler = mount / "dumps", mount / "filler"
        with open(filler, "wb", buffering=0) as handle:  # fill it up
            try:
                while True:
                    handle.write(b"\0" * 4096)
            except OSError:
                pass
        proc = _job("no_space", folder, filler)
        assert proc.returncode == 0, proc.stderr[-3000:]
        got = facts(proc.stdout)
        results = got["results"]
        assert got["enabled"] and results[:3] == [None, None, None] and results[3], results
        assert proc.stderr.count("could not write a dump") == 1, proc.stderr[-2000:]
        assert "No space left" in proc.stderr
        dump = load_dump(folder, 0)
        assert dump["reason"] == "api:freed" and len(entries(dump)) == 16
        assert not [p for p in folder.iterdir() if p.name.endswith(".tmp")]  # failed writes left nothing
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def test_a_group_name_reused_by_other_members_numbers_alike_on_every_member(tmp_path: Path) -> None:
    """Issue 21.7: rank 1 was in the destroyed group "1", rank 2 was not; both must number the new
    group's collectives from 1, and the old group's entries keep a label of their own."""
    from fixtures.launch import free_port

    run_ranks(workers.group_name_reused_by_other_members, 3, str(tmp_path), free_port(), timeout_s=60)
    ones = [(row["group"], row["seq"], row["state"]) for row in entries(load_dump(tmp_path, 1))
            if row["op"] == "all_reduce"]
    twos = [(row["group"], row["seq"], row["state"]) for row in entries(load_dump(tmp_path, 2))
            if row["op"] == "all_reduce"]
    old = {g for g, _, _ in ones if g.startswith("1@")}
    assert len(old) == 1 and [s for g, s, _ in ones if g in old] == [1, 2, 3]
    assert [(g, s) for g, s, _ in ones if g == "1"] == [("1", 1), ("1", 2)]
    assert [(g, s) for g, s, _ in twos if g == "1"] == [("1", 1)]
    report = analyzers.load(tmp_path).report()
    assert report["verdict"] == "hang", report["summary"]
    assert [c["ranks"] for c in report["root_causes"]] == [[2]], report["root_causes"]
