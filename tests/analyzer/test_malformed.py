"""Bad inputs: every file problem is one line naming the file, the other ranks are still analyzed."""

from __future__ import annotations

import gzip
import json
import os
import pickle
from pathlib import Path

import pytest
from click.testing import CliRunner

import analyzers
from analyzers.cli import analyze_command
from fixtures.builders import Job
from flightrec.format.packed import plain


class Evil:
    """A pickle payload that would create a marker file if it were ever unpickled with pickle.load."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _job_folder(tmp_path: Path, world: int = 4, **kw) -> Path:
    job = Job(world)
    job.collective("0", "all_reduce")
    job.collective("0", "all_reduce", ranks=list(range(world - 1)), state="started")
    return job.write(tmp_path / "dumps", **kw)


def _unreadable(report: dict) -> dict[str, str]:
    return {u["file"]: u["reason"] for u in report["unreadable_files"]}


def test_truncated_gzip_and_bad_json_are_reported_and_skipped(tmp_path):
    folder = _job_folder(tmp_path)
    whole = (folder / "rank-00001.json.gz").read_bytes()
    (folder / "rank-00001.json.gz").write_bytes(whole[: len(whole) // 2])
    text = gzip.decompress((folder / "rank-00002.json.gz").read_bytes())
    (folder / "rank-00002.json.gz").write_bytes(gzip.compress(text[: len(text) // 2]))
    report = analyzers.load(folder).report()
    reasons = _unreadable(report)
    assert "truncated gzip" in reasons["rank-00001.json.gz"]
    assert reasons["rank-00002.json.gz"].startswith("truncated gzip JSON")
    assert report["ranks"]["unreadable"] == [1, 2] and report["ranks"]["dumped"] == [0, 3]
    assert any(g.startswith("rank-00001.json.gz: ") for g in report["gaps"])
    # rank 0 still waits for 3 (never entered) and for the unreadable 1 and 2
    kinds = {(c["rank"], c["kind"]) for c in report["root_causes"]}
    assert kinds == {(1, "missing_dump"), (2, "missing_dump"), (3, "not_entered")}
    assert "unreadable" in next(c["detail"] for c in report["root_causes"] if c["rank"] == 1)


def test_invalid_json(tmp_path):
    folder = _job_folder(tmp_path)
    (folder / "rank-00003.json.gz").write_bytes(gzip.compress(b"{not json at all"))
    reasons = _unreadable(analyzers.load(folder).report())
    assert reasons["rank-00003.json.gz"].startswith("invalid gzip JSON")


@pytest.mark.parametrize("version", [1, 5, 7])  # 1 to 5: never released steps towards 6
def test_wrong_schema_version(tmp_path, version):
    job = Job(2)
    job.collective("0", "all_reduce")
    job.set(1, schema_version=version)
    folder = job.write(tmp_path / "d")
    report = analyzers.load(folder).report()
    assert _unreadable(report) == {"rank-00001.json.gz": f"unsupported flightrec schema_version {version} (this analyzer reads 6)"}
    assert report["ranks"]["unreadable"] == [1]


def test_foreign_files(tmp_path):
    folder = _job_folder(tmp_path)
    (folder / "notes.txt").write_text("hello")
    (folder / "other.json").write_text(json.dumps({"format": "something-else"}))
    (folder / "list.json").write_text("[1, 2]")
    (folder / "empty_7").write_bytes(b"")
    (folder / ".rank-00000.json.gz.123.tmp").write_bytes(b"partial")  # recorder temp files are ignored
    report = analyzers.load(folder).report()
    reasons = _unreadable(report)
    assert set(reasons) == {"notes.txt", "other.json", "list.json", "empty_7"}
    assert reasons["notes.txt"].startswith("not a dump")
    assert "foreign JSON file (format 'something-else'" in reasons["other.json"]
    assert reasons["empty_7"] == "empty file"
    assert report["ranks"]["unreadable"] == [7]
    assert report["verdict"] == "hang"


def test_unequal_columns(tmp_path):
    job = Job(2)
    job.collective("0", "all_reduce")
    folder = job.write(tmp_path / "d")
    dump = job.dump(1)
    dump["entries"]["seq"] = [*plain(dump["entries"]["seq"]), 9]
    (folder / "rank-00001.json.gz").write_bytes(gzip.compress(json.dumps(dump).encode()))
    assert "different lengths" in _unreadable(analyzers.load(folder).report())["rank-00001.json.gz"]


def test_pickle_that_would_run_code_does_not(tmp_path):
    marker = tmp_path / "PWNED"
    folder = tmp_path / "fr"
    folder.mkdir()
    (folder / "nccl_trace_rank_1").write_bytes(pickle.dumps(Evil(marker), protocol=2))
    payload = {"version": "2.10", "pg_config": {}, "pg_status": {}, "entries": [], "hook": Evil(marker)}
    (folder / "nccl_trace_rank_2").write_bytes(pickle.dumps(payload))
    (folder / "nccl_trace_rank_0").write_bytes(pickle.dumps({"version": "2.10", "pg_config": {}, "pg_status": {}, "entries": []}))
    report = analyzers.load(folder).report()
    assert not marker.exists()
    reasons = _unreadable(report)
    assert reasons["nccl_trace_rank_1"].startswith("refused pickle: pickle refers to")
    assert "system" in reasons["nccl_trace_rank_1"]
    assert reasons["nccl_trace_rank_2"].startswith("refused pickle")
    assert report["ranks"]["unreadable"] == [1, 2] and report["ranks"]["dumped"] == [0]


def test_truncated_pickle(tmp_path):
    folder = tmp_path / "fr"
    folder.mkdir()
    good = pickle.dumps({"version": "2.10", "pg_config": {}, "pg_status": {}, "entries": []})
    (folder / "nccl_trace_rank_0").write_bytes(good)
    (folder / "nccl_trace_rank_1").write_bytes(good[:20])
    reasons = _unreadable(analyzers.load(folder).report())
    assert reasons["nccl_trace_rank_1"].startswith("truncated or corrupt pickle")


def test_unusable_inputs_exit_2(tmp_path):
    runner = CliRunner()
    empty = tmp_path / "empty"
    empty.mkdir()
    result = runner.invoke(analyze_command, [str(empty)])
    assert result.exit_code == 2
    assert "empty folder" in result.stderr and "Traceback" not in result.output

    result = runner.invoke(analyze_command, [str(tmp_path / "nope")])
    assert result.exit_code == 2 and "no such folder" in result.stderr

    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "rank-00000.json.gz").write_bytes(b"\x1f\x8b garbage")
    (bad / "README").write_text("x")
    result = runner.invoke(analyze_command, [str(bad)])
    assert result.exit_code == 2
    assert "no readable dump" in result.stderr and "rank-00000.json.gz: " in result.stderr


def test_skipped_files_are_one_line_each_on_stderr(tmp_path):
    folder = _job_folder(tmp_path)
    (folder / "rank-00003.json.gz").write_bytes(b"\x1f\x8b\x08\x00broken")
    result = CliRunner().invoke(analyze_command, [str(folder)])
    assert result.exit_code == 0
    lines = [ln for ln in result.stderr.splitlines() if ln]
    assert len(lines) == 1 and lines[0].startswith("flightrec: skipped rank-00003.json.gz: ")


def test_mismatched_versions_are_a_gap(tmp_path):
    job = Job(2)
    job.collective("0", "all_reduce")
    job.set(1, flightrec_version="0.2.0")
    report = analyzers.load(job.write(tmp_path / "d")).report()
    assert report["verdict"] == "healthy"
    assert any(g.startswith("mismatched dump versions") for g in report["gaps"])


def test_unknown_rank_file_names_no_rank(tmp_path):
    folder = _job_folder(tmp_path)
    dump = Job(4).dump(0)
    dump["rank"] = -1
    (folder / "rank-unknown-4242.json.gz").write_bytes(gzip.compress(json.dumps(dump).encode()))
    report = analyzers.load(folder).report()
    assert {u["file"]: u["rank"] for u in report["unreadable_files"]} == {"rank-unknown-4242.json.gz": None}
    assert report["ranks"]["unreadable"] == []
