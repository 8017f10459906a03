"""A stall that recovered (one rank held every other one long, once, and the job went on) is named as
such and never read as a hang (analyzers/diagnosis/stalls.py)."""

from __future__ import annotations

from pathlib import Path

import analyzers
from analyzers.reporting.render import text_report
from fixtures import builders


def _report(folder: Path) -> tuple[dict, str]:
    analysis = analyzers.load(str(folder))
    report = analysis.report()
    return report, text_report(report, analysis.graph)


def test_a_stall_after_a_timeout_dump_is_named_on_the_first_screen(tmp_path: Path) -> None:
    report, text = _report(builders.recovered_stall(tmp_path))
    assert report["verdict"] == "healthy", report["summary"]
    (stall,) = report["recovered_stalls"]
    assert stall["rank"] == 0 and (stall["group"], stall["seq"], stall["op"]) == ("0", 13, "barrier")
    assert stall["waiters"] == [1, 2, 3] and stall["timeout_s"] == 2.0 and stall["hang_dump"] is True
    assert abs(stall["held_s"] - 5.0) < 0.01 and stall["site"] == "train.py:88 in main"
    first_screen = text.splitlines()[:8]
    assert ("  rank 0 held every rank 5.0 s at barrier #13 (train.py:88); the timeout dump was a false alarm: "
            "FLIGHTREC_TIMEOUT is 2 s") in first_screen, text
    assert "held the others 5.0 s" in first_screen[0]


def test_a_one_off_long_wait_without_a_timeout_dump_is_named_the_same_way(tmp_path: Path) -> None:
    report, text = _report(builders.recovered_stall(tmp_path, hang_dump=False, timeout_s=600.0))
    assert report["verdict"] == "healthy"
    assert [(s["rank"], s["waiters"], s["hang_dump"]) for s in report["recovered_stalls"]] == [(0, [1, 2, 3], False)]
    assert "rank 0 held every rank 5.0 s at barrier #13 (train.py:88); once, far longer than" in text


def test_the_records_alone_tell_a_stall_the_rings_no_longer_hold(tmp_path: Path) -> None:
    report, text = _report(builders.recovered_stall(tmp_path, entries=False))
    (stall,) = report["recovered_stalls"]
    assert (stall["rank"], stall["seq"], stall["waiters"], stall["held_s"]) == (0, 13, [1, 2, 3], 5.0)
    assert "rank 0 held every rank 5.0 s at barrier #13 (train.py:88)" in text


def test_short_waits_are_no_stall(tmp_path: Path) -> None:
    """A 0.5 s hold (under a second, under the timeout) is jitter or a slow step, not a stall."""
    report, _ = _report(builders.recovered_stall(tmp_path, hang_dump=False, timeout_s=600.0, stall_s=0.5))
    assert report["recovered_stalls"] == []
    report, _ = _report(builders.healthy(tmp_path / "healthy"))
    assert report["recovered_stalls"] == []
