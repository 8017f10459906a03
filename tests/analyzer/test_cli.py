"""The `analyze` and `show` commands (the contract of `flightrec analyze` / `flightrec show`)."""

from __future__ import annotations

import json
import subprocess
import sys

from click.testing import CliRunner

from analyzers.cli import analyze_command, main, show_command

from .conftest import GOLDEN, ROOT

REQUIRED = {"schema", "verdict", "ranks", "root_causes", "waits", "cycles", "mismatches", "gaps"}


def test_text_report_says_what_happened_first(scenario):
    """The first line in plain words, then labelled lines: where to act, where it is, who waits and where."""
    result = CliRunner().invoke(analyze_command, [str(scenario("cascade"))])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == "HANG: rank 5 never reached all_reduce #3 of group 3 [4-5] (tp2); rank 4 waits for it (7 ranks held up in all)"
    assert lines[1] == 'evidence: 8 of 8 ranks dumped (job "builder")'  # the synthetic job's id
    text = result.output
    assert "root cause: rank 5 — never reached the op its peers wait in [not_entered]" in text
    assert "  where       host node0 (local rank 5, pid 4005)" in text
    # its own position's waiter first, then those behind it
    assert "  waited by   rank 4 in all_reduce #3 of group 3 [4-5] (tp2); ranks 2-3, 6-7 in barrier #3 of group 0" in text
    assert "  now at      data.py:41 in decode_shard (main thread)" in text
    assert '    File "data.py", line 88, in load_batch' in text
    waiting = text.split("waiting ranks")[1]
    assert "rank 4 -> rank 5 in all_reduce #3 of group 3 [4-5] (tp2), at train.py:101 in step" in waiting
    assert waiting.index("rank 4 -> rank 5") < waiting.index("rank 1 -> rank 5")  # nearest to the root first
    assert "flightrec show " in text and "--rank 5" in text  # next steps name the culprit
    for word in ("victims", "peer_request", "seq 3"):  # internal words stay in the JSON report
        assert word not in text


def test_json_report_contract(scenario):
    result = CliRunner().invoke(analyze_command, [str(scenario("missing_dump")), "--format", "json"])
    assert result.exit_code == 0
    report = json.loads(result.output)
    assert REQUIRED <= set(report)
    assert report["verdict"] in {"healthy", "hang", "desync", "deadlock", "crash"}
    assert set(report["ranks"]) == {"expected", "dumped", "missing", "unreadable", "stale", "evidence_age_s", "running"}
    for c in report["root_causes"]:
        assert {"rank", "kind", "group", "seq", "op", "detail"} <= set(c)
    for w in report["waits"]:
        assert {"rank", "group", "seq", "op", "waits_for"} <= set(w)


def test_json_report_mismatch_fields(scenario):
    report = json.loads(CliRunner().invoke(analyze_command, [str(scenario("mismatch_op")), "--format", "json"]).output)
    assert {"group", "seq", "ranks", "field", "values"} <= set(report["mismatches"][0])


def test_dot_output(scenario, tmp_path):
    dot = tmp_path / "waits.dot"
    result = CliRunner().invoke(analyze_command, [str(scenario("p2p_deadlock")), "--dot", str(dot)])
    assert result.exit_code == 0
    text = dot.read_text()
    assert text.startswith("digraph waits {") and "0 -> 1" in text and "1 -> 0" in text and "color=red" in text


def test_show_lists_a_rank(scenario):
    folder = scenario("cascade")
    result = CliRunner().invoke(show_command, [str(folder), "--rank", "4"])
    assert result.exit_code == 0
    header = result.output.splitlines()[0].split()
    assert header[:6] == ["id", "group", "seq", "kind", "op", "peer"]
    assert "started" in result.output
    only = CliRunner().invoke(show_command, [str(folder), "--rank", "4", "--group", "3"])
    assert only.exit_code == 0 and len(only.output.splitlines()) == 1 + 3


def test_show_missing_rank_exit_2(scenario):
    result = CliRunner().invoke(show_command, [str(scenario("missing_dump")), "--rank", "3"])
    assert result.exit_code == 2 and "rank 3: no readable dump" in result.stderr


def test_show_torch_fr(tmp_path):
    result = CliRunner().invoke(show_command, [str(GOLDEN / "torch_fr_gloo"), "--rank", "2"])
    assert result.exit_code == 0 and "all_gather" in result.output


def test_group_holds_both_commands():
    assert set(main.commands) == {"analyze", "show", "export"}
    assert analyze_command.name == "analyze" and show_command.name == "show"


def test_python_dash_m(scenario):
    folder = scenario("compute_hang")
    proc = subprocess.run(
        [sys.executable, "-m", "analyzers", "analyze", str(folder), "--format", "json"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["verdict"] == "hang"
    empty = folder.parent / "empty"
    empty.mkdir()
    proc = subprocess.run([sys.executable, "-m", "analyzers", "analyze", str(empty)], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 2 and "empty folder" in proc.stderr and "Traceback" not in proc.stderr


def test_root_causes_name_where_to_act_and_hosts_prints_them():
    """Issue 23: host, local rank and pid of each root cause; `--hosts` for scripts."""
    from tests.helpers import load_dump

    folder = GOLDEN / "compute_hang"
    dump = load_dump(folder, 2)
    report = json.loads(CliRunner().invoke(analyze_command, [str(folder), "--format", "json"]).output)
    (cause,) = report["root_causes"]
    assert (cause["rank"], cause["host"], cause["local_rank"], cause["pid"]) == (2, dump["host"], dump["local_rank"], dump["pid"])
    result = CliRunner().invoke(analyze_command, [str(folder), "--hosts"])
    assert result.exit_code == 0 and result.output.splitlines() == [dump["host"]]


def test_hosts_of_a_rank_without_dump_are_unknown_never_guessed():
    result = CliRunner().invoke(analyze_command, [str(GOLDEN / "crash"), "--hosts"])
    assert result.exit_code == 0 and result.stdout == ""
    assert "rank 1: host unknown" in result.stderr


def test_no_dumps_says_how_to_get_them(tmp_path):
    result = CliRunner().invoke(analyze_command, [str(tmp_path)])
    assert result.exit_code == 2 and "empty folder" in result.stderr
    assert "FLIGHTREC=1" in result.stderr and "FLIGHTREC_DIR" in result.stderr
