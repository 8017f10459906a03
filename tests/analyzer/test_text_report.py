"""The default text report at scale: short, grouped, plain; `-v` keeps everything."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from analyzers.cli import analyze_command
from analyzers.reporting.render import group_gaps
from analyzers.textutil import rank_text, who
from fixtures import synth


@pytest.fixture(scope="module")
def big_job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """1,024 ranks (TP 8 x PP 4 x DP 32), one rank stalled, every ring wrapped."""
    return synth.write_folder(tmp_path_factory.mktemp("big") / "job", 1024, 120, "stall", "flightrec")


def test_default_output_of_a_1024_rank_hang_fits_a_screen(big_job: Path) -> None:
    result = CliRunner().invoke(analyze_command, [str(big_job), "-q"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert len(lines) <= 32, result.output
    assert lines[0].startswith("HANG: rank ") and " never reached " in lines[0]
    gaps = result.output.split("evidence gaps")[1].split("next:")[0]
    assert gaps.count("ring wrapped") <= 3  # grouped: one line per way of wrapping, not one per rank
    assert "(-v" in result.output  # says how to see the rest
    assert max(len(line) for line in lines[:-2]) <= 260


def test_verbose_output_keeps_every_wait_and_gap(big_job: Path) -> None:
    short = CliRunner().invoke(analyze_command, [str(big_job), "-q"]).output
    full = CliRunner().invoke(analyze_command, [str(big_job), "-q", "-v"]).output
    assert len(full.splitlines()) > len(short.splitlines())
    for left_out in ("(-v", "more position", "more rank", "more root cause"):  # nothing left out
        assert left_out not in full.split("next:")[0]
    waiting = full.split("waiting ranks")[1].split("\n\n")[0].splitlines()[1:]
    assert len(waiting) > 3 and all(" -> " in line for line in waiting)


def test_gaps_that_differ_only_in_rank_and_numbers_are_told_once() -> None:
    gaps = [f"rank {r}: its clock is {r * 3} ms off" for r in (1, 2, 3, 7)] + ["no dump for rank(s) 9"]
    assert group_gaps(gaps) == ["ranks 1-3, 7: its clock is 3 ms off (figures of rank 1; -v for each)",
                                "no dump for rank(s) 9"]
    assert group_gaps(["rank 4: alone"]) == ["rank 4: alone"]


def test_rank_lists_stay_one_phrase_at_any_size() -> None:
    assert who([5]) == "rank 5" and who([0, 2, 3]) == "ranks 0, 2-3"
    assert who(range(3, 1024, 8)) == "128 ranks (every 8th from 3 to 1019)"
    assert rank_text([r for r in range(3, 1024, 8) if r != 515]) == "127 ranks: every 8th from 3 to 1019, except 515"
    scattered = [1, 5, 9, *range(100, 2000, 100)]
    assert rank_text(scattered).startswith(f"{len(scattered)} ranks: 1, 5, 9, 100")


def test_gaps_left_out_are_counted_in_plain_words() -> None:
    """A real PyTorch gloo dump folder has more gaps than the default shows: '... 4 more', not '4 mores'."""
    folder = Path(__file__).resolve().parents[2] / "fixtures" / "golden" / "torch_fr_gloo"
    output = CliRunner().invoke(analyze_command, [str(folder), "-q"]).output
    left = [line for line in output.splitlines() if line.strip().startswith("...") and "(-v" in line]
    assert left and all(" more (-v " in line for line in left), output
