"""Restart attempts (analyzers/reading/attempts.py) and several folders read as one job (analyzers/reading/loader.py).

The folders are made from dumps recorded by real gloo runs (fixtures/golden): split across folders,
or rewritten as another torchelastic restart attempt of the job.
"""

from __future__ import annotations

import gzip
import json
import shutil
import uuid
from pathlib import Path
from typing import Any

import fsspec
import pytest
from click.testing import CliRunner

import analyzers
from analyzers.cli import analyze_command, show_command
from analyzers.reading.loader import AttemptNotFound
from analyzers.reading.read import rank_from_name
from flightrec.format.names import dump_filename
from flightrec.identity import restart_attempt

GOLDEN = Path(__file__).resolve().parents[2] / "fixtures" / "golden"
S = 1_000_000_000
PER_FOLDER = ("folder", "folders")  # the only report fields that name the folders read


def _read(path: Path) -> dict[str, Any]:
    return json.loads(gzip.decompress(path.read_bytes()))


def _as_attempt(src: str, folder: Path, attempt: int, armed_shift_s: float = 0.0) -> None:
    """Write golden `src`'s dumps into `folder` as restart attempt `attempt`, named as the recorder names them."""
    folder.mkdir(parents=True, exist_ok=True)
    for path in sorted((GOLDEN / src).glob("rank-*.json.gz")):
        dump = _read(path)
        dump["attempt"] = attempt
        dump["armed_wall_ns"] += int(armed_shift_s * S)
        (folder / dump_filename(dump["rank"], attempt)).write_bytes(gzip.compress(json.dumps(dump).encode()))


def _armed_span_s(src: str) -> float:
    """How much later `src`'s processes were armed than compute_hang's (seconds, may be negative)."""
    newest = max(_read(p)["armed_wall_ns"] for p in (GOLDEN / "compute_hang").glob("rank-*"))
    return (min(_read(p)["armed_wall_ns"] for p in (GOLDEN / src).glob("rank-*")) - newest) / S


def _without_folders(report: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in report.items() if k not in PER_FOLDER}


def test_names_of_attempts(monkeypatch: pytest.MonkeyPatch) -> None:
    assert dump_filename(3) == dump_filename(3, 0) == "rank-00003.json.gz"
    assert dump_filename(3, 2) == "rank-00003.attempt-2.json.gz"
    assert rank_from_name("rank-00003.attempt-2.json.gz") == 3 and rank_from_name("rank-00003.attempt-x.json.gz") is None
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    assert restart_attempt() == 0
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "2")
    assert restart_attempt() == 2


def test_the_latest_attempt_is_analysed_the_others_listed_and_any_can_be_picked(tmp_path: Path) -> None:
    folder = tmp_path / "dumps"
    shutil.copytree(GOLDEN / "compute_hang", folder)  # attempt 0: dumps without the field (older recorder)
    _as_attempt("healthy", folder, 1)  # the restart, armed ~30 s later: it completed
    files0 = [f"rank-{r:05d}.json.gz" for r in range(4)]
    latest = analyzers.load(str(folder)).report()
    assert latest["verdict"] == "healthy"
    assert latest["attempts"] == {"analysed": 1, "others": [{"attempt": 0, "ranks": [0, 1, 2, 3], "files": files0}]}
    assert latest["jobs"]["ignored"] == []  # the other attempt is not "another job" (its store differs, even)
    first = analyzers.load(str(folder), attempt=0).report()
    assert first["verdict"] == "hang" and [(c["rank"], c["kind"]) for c in first["root_causes"]] == [(2, "not_entered")]
    assert first["attempts"]["analysed"] == 0 and [o["attempt"] for o in first["attempts"]["others"]] == [1]
    alone = analyzers.load(str(GOLDEN / "compute_hang")).report()
    assert _without_folders(first) | {"attempts": None} == _without_folders(alone) | {"attempts": None}
    assert alone["attempts"] == {"analysed": 0, "others": []}

    with pytest.raises(AttemptNotFound, match=r"no dump of restart attempt 5 \(attempts present: 0 \(4 dumps\), 1 \(4 dumps\)\)"):
        analyzers.load(str(folder), attempt=5)
    result = CliRunner().invoke(analyze_command, [str(folder), "--attempt", "5"])
    assert result.exit_code == 2 and f"{folder}: no dump of restart attempt 5" in result.output
    assert "FLIGHTREC=1" not in result.output  # the dumps are there: no hint about arming the recorder
    text = CliRunner().invoke(analyze_command, [str(folder), "--attempt", "0"]).output
    assert ("warning: dumps of other torchelastic restart attempts are here too (attempt 1: rank(s) 0-3); "
            "this report is of attempt 0 (--attempt N analyses another)") in text
    shown = CliRunner().invoke(show_command, [str(folder), "--rank", "2", "--attempt", "0"])
    assert shown.exit_code == 0 and "all_reduce" in shown.output
    assert CliRunner().invoke(show_command, [str(folder), "--rank", "2", "--attempt", "3"]).exit_code == 2


def test_the_newest_run_decides_when_an_older_job_restarted(tmp_path: Path) -> None:
    """A shared folder: an older job's attempt 1 is not newer than a later job's attempt 0."""
    folder = tmp_path / "dumps"
    shutil.copytree(GOLDEN / "compute_hang", folder)
    _as_attempt("healthy", folder, 1, armed_shift_s=-_armed_span_s("healthy") - 3600)  # armed an hour earlier
    report = analyzers.load(str(folder)).report()
    assert report["verdict"] == "hang" and report["attempts"]["analysed"] == 0


@pytest.mark.parametrize("workers", [None, 2])
def test_a_job_split_across_folders_reads_as_the_whole_folder(tmp_path: Path, workers: int | None) -> None:
    whole = analyzers.load(str(GOLDEN / "cascade")).report()
    parts = [tmp_path / "node0", tmp_path / "node1"]
    for part in parts:
        part.mkdir()
    for path in (GOLDEN / "cascade").glob("rank-*.json.gz"):
        shutil.copy2(path, parts[rank_from_name(path.name) % 2] / path.name)
    split = analyzers.load([str(p) for p in parts], workers=workers).report()
    assert _without_folders(split) == _without_folders(whole)
    assert split["folders"] == [str(p) for p in parts] and split["folder"] == " ".join(map(str, parts))
    result = CliRunner().invoke(analyze_command, [*map(str, parts), "--format", "json"])
    assert result.exit_code == 0 and _without_folders(json.loads(result.output)) == _without_folders(whole)


def test_the_same_name_in_two_folders_is_two_candidates(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(GOLDEN / "compute_hang", a)
    b.mkdir()
    shutil.copy2(a / "rank-00003.json.gz", b / "rank-00003.json.gz")
    report = analyzers.load([a, b]).report()
    assert report["gaps"] == [f"rank 3: several dumps; used {a}/rank-00003.json.gz, ignored {b}/rank-00003.json.gz"]
    assert report["verdict"] == "hang" and [c["rank"] for c in report["root_causes"]] == [2]
    same = analyzers.load([a, str(a) + "/"]).report()  # one folder named twice is read once
    assert not any("several dumps" in g for g in same["gaps"]) and same["folders"] == [str(a)]


def test_a_missing_or_empty_folder_among_several_is_named(tmp_path: Path) -> None:
    good, empty, missing = GOLDEN / "compute_hang", tmp_path / "empty", tmp_path / "missing"
    empty.mkdir()
    with pytest.raises(analyzers.UnusableInput, match=f"^{missing}: no such folder$"):
        analyzers.load([good, missing])
    with pytest.raises(analyzers.UnusableInput, match=f"^{empty}: empty folder, no dump files$"):
        analyzers.load([good, empty])
    result = CliRunner().invoke(analyze_command, [str(good), str(missing)])
    assert result.exit_code == 2 and f"{missing}: no such folder" in result.output
    assert CliRunner().invoke(analyze_command, []).exit_code == 2  # a folder is required


def test_a_local_folder_and_a_url_read_as_one_job(tmp_path: Path) -> None:
    local = tmp_path / "node0"
    local.mkdir()
    fs = fsspec.filesystem("memory")
    root = f"/flightrec-test-{uuid.uuid4().hex}"
    try:
        for path in (GOLDEN / "cascade").glob("rank-*.json.gz"):
            if rank_from_name(path.name) < 4:
                shutil.copy2(path, local / path.name)
            else:
                fs.pipe_file(f"{root}/{path.name}", path.read_bytes())
        report = analyzers.load([str(local), f"memory://{root}"]).report()
    finally:
        fs.rm(root, recursive=True)
    assert _without_folders(report) == _without_folders(analyzers.load(str(GOLDEN / "cascade")).report())
