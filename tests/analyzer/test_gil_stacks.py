"""A rank that left no dump, with and without flightrec's held-GIL stacks file (flightrec/watch/gil_watch.py)."""

from __future__ import annotations

import os
from pathlib import Path

import analyzers
from analyzers.analysis import NO_DUMP_TEXT
from fixtures.builders import WALL_BASE_NS, missing_dump

MAIN, WATCHDOG = 0x7F00000000AA, 0x7F00000000BB
BLOCK = (f"Timeout (0:00:02)!\nThread 0x{WATCHDOG:016x} (most recent call first):\n"
         '  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap\n\n'
         f"Thread 0x{MAIN:016x} (most recent call first):\n"
         '  File "/usr/lib/python3.11/site-packages/mylib/ops.py", line 7 in fused\n'
         '  File "/job/train.py", line 42 in step\n'
         '  File "/job/train.py", line 90 in main\n')


def _stacks(folder: Path, blocks: int, written_ns: int, rank: int = 3) -> Path:
    """rank-0000N.stacks.txt as the recorder writes it: its header, then `blocks` faulthandler writes."""
    path = folder / f"rank-{rank:05d}.stacks.txt"
    path.write_text(f"# flightrec-stacks/1 rank={rank} attempt=0 pid=77 main=0x{MAIN:016x} watchdog=0x{WATCHDOG:016x} "
                    "limit_s=2 opened_unix_s=1750000000.000\n# written by faulthandler ...\n" + BLOCK * blocks)
    os.utime(path, ns=(written_ns, written_ns))
    return path


def _cause(folder: Path) -> dict:
    report = analyzers.load(str(folder)).report()
    assert report["verdict"] == "hang" and len(report["root_causes"]) == 1, report["root_causes"]
    return report["root_causes"][0]


def test_no_stacks_file_reads_as_dead_as_before(tmp_path: Path) -> None:
    cause = _cause(missing_dump(tmp_path / "job"))
    assert (cause["rank"], cause["kind"], cause["gil_stacks"]) == (3, "missing_dump", None)
    assert NO_DUMP_TEXT in cause["detail"] and "alive" not in cause["detail"]


def test_stacks_written_while_peers_wait_mean_alive_holding_the_gil(tmp_path: Path) -> None:
    folder = missing_dump(tmp_path / "job")
    _stacks(folder, 2, WALL_BASE_NS + 3600 * 10**9)
    report = analyzers.load(str(folder)).report()
    (cause,) = report["root_causes"]
    assert (cause["rank"], cause["kind"]) == (3, "not_entered")
    assert "alive, not answering: holding the GIL at /job/train.py:42 in step" in cause["detail"]
    assert cause["site"] == "/job/train.py:42 in step" and cause["victims"] == [0, 1, 2]
    # the last write's stack, outermost first, like every stack of the report
    assert cause["stack"] == ["/job/train.py:90 in main", "/job/train.py:42 in step",
                              "/usr/lib/python3.11/site-packages/mylib/ops.py:7 in fused"]
    assert cause["gil_stacks"]["file"] == "rank-00003.stacks.txt" and cause["gil_stacks"]["writes"] == 2
    assert not report["gaps"] or all("stacks.txt" not in g for g in report["gaps"])  # never "unreadable"
    from analyzers.reporting.render import text_report

    first = text_report(report).splitlines()[0]
    assert first.startswith("HANG: rank 3 is alive, not answering: holding the GIL at train.py:42 in step"), first


def test_stacks_written_before_the_peers_waited_say_nothing_of_now(tmp_path: Path) -> None:
    folder = missing_dump(tmp_path / "job")
    _stacks(folder, 1, WALL_BASE_NS - 3600 * 10**9)
    cause = _cause(folder)
    assert (cause["rank"], cause["kind"]) == (3, "missing_dump")
    assert NO_DUMP_TEXT in cause["detail"] and "before its peers began waiting" in cause["detail"]


def test_a_stacks_file_that_never_fired_is_no_evidence_and_no_problem(tmp_path: Path) -> None:
    folder = missing_dump(tmp_path / "job")
    _stacks(folder, 0, WALL_BASE_NS + 3600 * 10**9)
    _stacks(folder, 0, WALL_BASE_NS + 3600 * 10**9, rank=1)  # a rank with a dump: its watchdog ran
    analysis = analyzers.load(str(folder))
    report = analysis.report()
    assert [(c["rank"], c["kind"]) for c in report["root_causes"]] == [(3, "missing_dump")]
    assert not analysis.problems and "stacks" not in " ".join(report.get("notes", []))
