"""The commands the report and the CLI suggest work for the folder at hand: `show` is suggested only for
a rank that has a dump, `show` warns of a stale dump as `analyze` does, and a dump file given where a
folder is expected is named with the command to run instead."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from analyzers.cli import main
from fixtures.builders import Job


def _hang(stale_rank: int | None = None) -> Job:
    job = Job(4)
    for _ in range(3):
        job.collective("0")
    job.collective("0", ranks=[0, 1, 3], state="started")  # rank 2 never reaches it
    if stale_rank is not None:
        newest = job.dump(0)["dump_time_ns"]
        job.set(stale_rank, dump_time_ns=newest - 120 * 10**9)
    return job


def _run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_next_suggests_show_only_for_a_rank_with_a_dump(tmp_path: Path) -> None:
    folder = _hang().write(tmp_path / "d", skip=[2])  # the culprit left no dump
    code, out, _ = _run("analyze", str(folder))
    assert code == 0 and "rank 2" in out.splitlines()[0], out
    assert "--rank 2" not in out, out
    code, out, _ = _run("analyze", str(_hang().write(tmp_path / "e")))
    assert f"flightrec show {tmp_path / 'e'} --rank 2" in out, out


def test_show_warns_of_a_stale_dump_as_analyze_does(tmp_path: Path) -> None:
    folder = _hang(stale_rank=2).write(tmp_path / "d")
    code, out, _ = _run("analyze", str(folder))
    assert "stale" in out.splitlines()[1], out
    code, out, err = _run("show", str(folder), "--rank", "2")
    assert code == 0 and "all_reduce" in out and "warning: rank 2: its dump is stale" in err, err
    code, out, err = _run("show", str(folder), "--rank", "1")
    assert code == 0 and "stale" not in err, err


def test_a_dump_file_instead_of_a_folder_names_the_folder_to_pass(tmp_path: Path) -> None:
    folder = _hang().write(tmp_path / "d")
    file = folder / "rank-00001.json.gz"
    code, _, err = _run("analyze", str(file))
    assert code == 2 and f"{file} is a file, not a folder" in err and f"flightrec analyze {folder}" in err, err
    assert "FLIGHTREC=1" not in err  # not the unrelated "did the job run with FLIGHTREC=1" hint
    code, _, err = _run("show", str(file), "--rank", "1")
    assert code == 2 and f"flightrec show {folder} --rank 1" in err, err


def test_html_without_matplotlib_says_which_extra_draws_the_plots(tmp_path: Path, monkeypatch) -> None:
    """docs/configuration.md says `--html` writes the page without matplotlib and names the extra for the plots."""
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed: its import fails
    folder = _hang().write(tmp_path / "d")
    code, _, err = _run("analyze", str(folder), "--html", str(tmp_path / "r.html"))
    page = (tmp_path / "r.html").read_text()
    assert code == 0 and "pip install 'flightrec[notebook]'" in page.replace("&#x27;", "'"), page[-2000:]
    config = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
    assert "without it the page is written" in config and "TORCH_FR_BUFFER_SIZE=2000" in config
