"""The dump's summary member (flightrec/format/dump_file.py) and the hang verdict read from summaries alone.

A summary read must reach the verdict, root causes, waits, cycles and victims of a full read, on
every hand-made scenario, on simulated jobs with known truth and on wrapped synthetic rings; where
nothing blocks it must say it cannot tell (never `healthy` or `slow`, which need every rank's timing).
"""

from __future__ import annotations

import gzip
import json
import zlib
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import analyzers
import flightrec.format.dump_file as dumpfile
from analyzers.cli import analyze_command
from analyzers.reading.rankdump import RankDump
from analyzers.reading.read import read_path
from fixtures import builders, sim, synth

BLOCKED = ("hang", "deadlock", "crash", "desync")
SIM_SEEDS = range(0, 480, 2)


def _key(report: dict[str, Any]) -> tuple[Any, ...]:
    return (report["verdict"],
            [(c["rank"], c["kind"], c.get("group"), c.get("seq"), c.get("victims")) for c in report["root_causes"]],
            report["victims"], report["cycles"], [(w["rank"], w.get("group"), w.get("seq")) for w in report["waits"]])


def _agree(folder: Path) -> None:
    full = analyzers.load(folder).report()
    summary = analyzers.load(folder, read="summary").report()
    assert summary["read"] == "summary" and full["read"] == "full"
    if full["verdict"] in BLOCKED:
        assert _key(summary) == _key(full), folder
    else:  # nobody waits: healthy or slow is a matter of timing the summaries do not carry
        assert summary["verdict"] == "inconclusive" and summary["stragglers"] == [], folder


def test_the_file_is_one_json_object_in_two_gzip_members(tmp_path: Path) -> None:
    folder = builders.compute_hang(tmp_path / "hang")
    path = folder / "rank-00000.json.gz"
    raw = path.read_bytes()
    inflate = zlib.decompressobj(31)
    head = inflate.decompress(raw)
    assert inflate.eof and inflate.unused_data[:2] == b"\x1f\x8b"  # a second member follows
    assert head.endswith(b",")
    summary = json.loads(head[:-1] + b"}")
    assert "entries" not in summary and "templates" not in summary and summary["recent"]["entries"]
    whole = json.loads(gzip.decompress(raw))  # any gzip reader gets the whole dump
    assert whole["entries"] and whole["templates"] and whole["recent"]["entries"]


def test_recent_keeps_the_newest_ops_and_every_older_one_in_flight() -> None:
    completed = [True] * 100
    completed[3] = completed[50] = False
    got = dumpfile.recent_positions(completed)
    assert got == [3, 50, *range(100 - dumpfile.RECENT_ENTRIES, 100)]
    assert dumpfile.recent_positions([True] * 5) == list(range(5))
    many = dumpfile.recent_positions([False] * 1000)
    assert len(many) == dumpfile.RECENT_IN_FLIGHT + dumpfile.RECENT_ENTRIES and many == sorted(many)


def test_a_summary_read_inflates_the_first_member_only(tmp_path: Path) -> None:
    folder = synth.write_folder(tmp_path / "synth", 64, 300, "stall")
    path = folder / "rank-00000.json.gz"
    summary, full = read_path(str(path), summary=True), read_path(str(path))
    assert isinstance(summary, RankDump) and isinstance(full, RankDump)
    assert summary.meta["summary_only"] and not full.meta["summary_only"]
    assert len(summary.entries["id"]) == dumpfile.RECENT_ENTRIES < len(full.entries["id"]) == 300
    assert list(summary.entries["id"]) == list(full.entries["id"][-dumpfile.RECENT_ENTRIES:])
    assert summary.meta["progress"] == full.meta["progress"] and summary.meta["recorded"] == full.meta["recorded"]
    # a body cut short does not touch the summary; a full read of it says what is wrong
    cut = tmp_path / "cut" / path.name
    cut.parent.mkdir()
    cut.write_bytes(path.read_bytes()[:-200])
    assert isinstance(read_path(str(cut), summary=True), RankDump)
    assert "truncated" in read_path(str(cut)).reason


def test_a_damaged_summary_is_named_with_its_file(tmp_path: Path) -> None:
    """A first member that is not the open top of a JSON object: the file is named, with what is wrong."""
    path = tmp_path / "rank-00001.json.gz"
    path.write_bytes(gzip.compress(b'{"format":"flightrec-dump","schema_version":6,"ra,')
                     + gzip.compress(b'"templates":{},"entries":{}}'))
    got = read_path(str(path), summary=True)
    assert not isinstance(got, RankDump) and got.file == path.name and "invalid" in got.reason, got


def test_a_dump_written_in_one_member_is_read_whole(tmp_path: Path) -> None:
    job = builders.Job(2)
    job.collective("0")
    path = tmp_path / "rank-00000.json.gz"
    path.write_bytes(gzip.compress(json.dumps(job.dump(0)).encode()))
    got = read_path(str(path), summary=True)
    assert isinstance(got, RankDump) and not got.meta["summary_only"] and len(got.entries["id"]) == 1


@pytest.mark.parametrize("name", sorted(builders.SCENARIOS))
def test_scenarios_get_the_same_verdict_from_summaries(tmp_path: Path, name: str) -> None:
    _agree(builders.SCENARIOS[name](tmp_path / name))


def test_simulated_jobs_get_the_same_verdict_from_summaries(tmp_path: Path) -> None:
    for seed in SIM_SEEDS:
        _agree(sim.write(sim.scenario(seed), tmp_path / str(seed)))


@pytest.mark.parametrize("fault", ["stall", "mismatch"])
def test_wrapped_synthetic_rings_get_the_same_verdict_from_summaries(tmp_path: Path, fault: str) -> None:
    folder = synth.write_folder(tmp_path / fault, 64, 300, fault)  # 32 recent ops of 300 kept: progress counters decide
    _agree(folder)
    report = analyzers.load(folder, read="summary").report()
    assert synth.check(report, 64, fault) == []


def test_short_summaries_still_decide_hangs_and_deadlocks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With 4 recent ops per rank, every wait and cycle still comes out right from the counters; only mismatches
    among older completed ops (a finding, not what blocks) are left to the full read."""
    monkeypatch.setattr(dumpfile, "RECENT_ENTRIES", 4)
    for seed in range(0, 300, 3):
        folder = sim.write(sim.scenario(seed), tmp_path / str(seed))
        full = analyzers.load(folder).report()
        summary = analyzers.load(folder, read="summary").report()
        if full["verdict"] not in ("hang", "deadlock", "crash"):
            continue
        blocking = [c for c in full["root_causes"] if c["kind"] != "mismatch"]
        assert (summary["verdict"], summary["cycles"]) == (full["verdict"], full["cycles"]), seed
        assert [(c["rank"], c["kind"]) for c in summary["root_causes"]] == [(c["rank"], c["kind"]) for c in blocking], seed


def test_cli_reads_summaries_and_says_so(tmp_path: Path) -> None:
    folder = builders.cascade(tmp_path / "cascade")
    result = CliRunner().invoke(analyze_command, [str(folder), "--read", "summary", "--format", "json", "-q"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["read"] == "summary" and [c["rank"] for c in report["root_causes"]] == [5]
    assert any("summaries" in g for g in report["gaps"])


def test_auto_reads_everything_when_nothing_blocks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--read auto` on a big folder: summaries first; a job where nobody waits is read whole for its timing."""
    import analyzers.reading.loader as loader

    monkeypatch.setattr(loader, "AUTO_SUMMARY_FILES", 2)
    for make, read in ((builders.cascade, "summary"), (builders.healthy, "full")):
        folder = make(tmp_path / make.__name__)
        result = CliRunner().invoke(analyze_command, [str(folder), "--format", "json", "-q"])
        assert result.exit_code == 0, result.output
        assert json.loads(result.output)["read"] == read, make.__name__
