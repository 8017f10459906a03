"""Folders that are mostly not dumps: thousands of foreign files, symlinks, pipes, folders, devices."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from click.testing import CliRunner

import analyzers
from analyzers.cli import analyze_command

GOLDEN = Path(__file__).resolve().parents[2] / "fixtures" / "golden"


def test_thousands_of_foreign_files_links_and_special_files(tmp_path: Path) -> None:
    folder = tmp_path / "dumps"
    shutil.copytree(GOLDEN / "healthy", folder)
    for i in range(3000):
        (folder / f"notes-{i}.txt").write_text(f"line {i}\n")
    (folder / "photo_20240101").write_bytes(b"\xff\xd8\xff\xe0 not a dump")  # digits that are no rank
    (folder / "rank-00001-copy.json.gz").symlink_to(folder / "rank-00001.json.gz")  # a link to a dump
    (folder / "rank-00005.json.gz").symlink_to(tmp_path / "nowhere")  # dangling
    (folder / "loop").symlink_to(folder / "loop")  # a link to itself
    (folder / "rank-00006.json.gz").symlink_to("/dev/zero")  # endless if it were read
    os.mkfifo(folder / "rank-00007.json.gz")  # would block a reader forever
    (folder / "subdir").mkdir()
    (folder / ".rank-00002.json.gz.4242.tmp").write_bytes(b"\x1f\x8b half")  # a killed writer's leftover

    began = time.monotonic()
    result = CliRunner().invoke(analyze_command, [str(folder), "--format", "json"])
    took = time.monotonic() - began
    assert result.exit_code == 0, result.output[-2000:]
    assert took < 60, f"{took:.1f}s for 3000 foreign files"
    report = analyzers.load(folder).report()
    assert report["verdict"] == "healthy" and report["ranks"]["dumped"] == [0, 1, 2, 3]
    skipped = {u["file"]: u for u in report["unreadable_files"]}
    assert len([f for f in skipped if f.startswith("notes-")]) == 3000
    assert skipped["photo_20240101"]["rank"] is None and skipped["photo_20240101"]["reason"].startswith("not a dump")
    # special files are named and never opened; the link to a dump is one more copy of rank 1
    assert skipped["rank-00006.json.gz"]["reason"] == "not a regular file (device); not read"
    assert skipped["rank-00007.json.gz"]["reason"] == "not a regular file (named pipe); not read"
    assert skipped["rank-00005.json.gz"]["reason"].startswith("cannot read file")  # dangling
    assert skipped["loop"]["reason"].startswith("cannot read file")
    assert "subdir" not in skipped and "rank-00001-copy.json.gz" not in skipped
    assert report["ranks"]["unreadable"] == [5, 6, 7]
    lines = [ln for ln in result.stderr.splitlines() if ln.startswith("flightrec: skipped ")]
    assert len(lines) == len(skipped)  # one line per file skipped
