"""Dump folders given as fsspec URLs (memory://, file://) and the CLI's progress bar."""

from __future__ import annotations

import io
import json
import uuid
from pathlib import Path

import fsspec
import pytest
from click.testing import CliRunner

import analyzers
from analyzers.cli import analyze_command
from analyzers.reading.progress import LABEL, ReadProgress
from fixtures import synth


@pytest.fixture
def memory_copy(scenario):
    """scenario name -> (local folder, memory:// URL holding the same files, plus a hidden file)."""
    made = []

    def make(name: str) -> tuple[Path, str]:
        local = scenario(name)
        fs = fsspec.filesystem("memory")
        root = f"/flightrec-test-{uuid.uuid4().hex}"
        for path in local.iterdir():
            fs.pipe_file(f"{root}/{path.name}", path.read_bytes())
        fs.pipe_file(f"{root}/.rank-00000.json.gz.99.tmp", b"half a file")
        made.append(root)
        return local, f"memory://{root}"

    yield make
    fs = fsspec.filesystem("memory")
    for root in made:
        fs.rm(root, recursive=True)


def _same(a: dict, b: dict) -> None:
    for key in ("verdict", "root_causes", "victims", "waits", "mismatches", "ranks"):
        assert a[key] == b[key], key


def test_memory_url_reads_like_the_local_folder(memory_copy):
    local, url = memory_copy("cascade")
    remote = analyzers.load(url).report()
    _same(remote, analyzers.load(local).report())
    assert remote["folder"] == url  # kept as given, not mangled into a path
    assert remote["verdict"] == "hang"


def test_file_url_is_a_local_path(scenario):
    local = scenario("compute_hang")
    _same(analyzers.load(f"file://{local}").report(), analyzers.load(local).report())


def test_unusable_urls_say_why():
    with pytest.raises(analyzers.UnusableInput, match="no such folder"):
        analyzers.load(f"memory:///nowhere-{uuid.uuid4().hex}")
    fs = fsspec.filesystem("memory")
    root = f"/empty-{uuid.uuid4().hex}"
    fs.mkdir(root)
    fs.pipe_file(f"{root}/.hidden", b"x")
    with pytest.raises(analyzers.UnusableInput, match="empty folder"):
        analyzers.load(f"memory://{root}")


def test_unreadable_remote_file_is_reported_not_fatal(memory_copy):
    _, url = memory_copy("compute_hang")
    fsspec.filesystem("memory").pipe_file(url[len("memory://"):] + "/rank-00001.json.gz", b"\x1f\x8bbroken")
    report = analyzers.load(url).report()
    assert [f["file"] for f in report["unreadable_files"]] == ["rank-00001.json.gz"]


def test_cli_with_a_memory_url(memory_copy):
    local, url = memory_copy("cascade")
    result = CliRunner().invoke(analyze_command, [url, "--format", "json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["root_causes"] == analyzers.load(local).report()["root_causes"]
    missing = CliRunner().invoke(analyze_command, [f"memory:///gone-{uuid.uuid4().hex}"])
    assert missing.exit_code == 2 and "no such folder" in missing.stderr


def test_progress_bar_only_when_asked_and_on_a_terminal(tmp_path):
    folder = synth.write_folder(tmp_path / "job", 16, 40, "stall", "flightrec")
    runner = CliRunner()
    plain = runner.invoke(analyze_command, [str(folder)])  # CliRunner's stderr is not a terminal
    assert plain.exit_code == 0 and LABEL not in plain.stderr
    quiet = runner.invoke(analyze_command, [str(folder), "--quiet", "--progress"])
    assert quiet.exit_code == 0 and LABEL not in quiet.stderr
    forced = runner.invoke(analyze_command, [str(folder), "--progress"])
    assert forced.exit_code == 0 and LABEL in forced.stderr and "16/16" in forced.stderr


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_follows_isatty(tmp_path):
    folder = synth.write_folder(tmp_path / "job", 16, 40, "stall", "flightrec")
    for stream, drawn in ((_Tty(), True), (io.StringIO(), False)):
        bar = ReadProgress(enabled=True, stream=stream)
        analyzers.load(folder, progress=bar.progress, on_count=bar.on_count)
        bar.close()
        assert (LABEL in stream.getvalue()) is drawn
    silent = _Tty()
    bar = ReadProgress(enabled=False, stream=silent)
    analyzers.load(folder, progress=bar.progress, on_count=bar.on_count)
    bar.close()
    assert silent.getvalue() == ""


def test_progress_counts_every_file_in_both_readers(tmp_path, memory_copy):
    folder = synth.write_folder(tmp_path / "job", 16, 40, "stall", "flightrec")
    for workers in (1, 2):
        seen: list[int] = []
        total: list[int] = []
        analyzers.load(folder, workers=workers, progress=seen.append, on_count=total.append)
        assert total == [16] and sum(seen) == 16
    _, url = memory_copy("cascade")
    seen = []
    analyzers.load(url, progress=seen.append)
    assert sum(seen) == 8  # 8 dumps; the hidden temp file is never read
