"""Click commands `analyze` and `show`; `flightrec/cli.py` registers them into the `flightrec` group.

Why here and not in flightrec/: the recorder must stay importable without pandas or networkx; only
these commands pull the analyzer in. Exit codes: 0 analyzed (whatever the verdict), 2 unusable input.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from .columns import concat_entries
from .loader import UnusableInput, discover
from .rankdump import RankDump
from .read import rank_from_name, read_path

EXIT_UNUSABLE = 2


NO_DUMPS_HINT = ("did the job run with FLIGHTREC=1 in its environment? Each rank dumps into FLIGHTREC_DIR "
                 "(default ./flightrec-dumps) when an op hangs or fails, at exit with FLIGHTREC_DUMP_ON_EXIT=1, or on "
                 "`flightrec dump-now DIR`")


def _fail(message: str, hint: str | None = None) -> None:
    click.echo(f"flightrec: {message}" + (f"\n  {hint}" if hint else ""), err=True)
    sys.exit(EXIT_UNUSABLE)


@click.command("analyze")
@click.argument("folder")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True, help="Report format.")
@click.option("--dot", "dot", type=click.Path(dir_okay=False, path_type=Path), default=None, help="Also write the wait-for graph (Graphviz DOT) to FILE.")
@click.option("--html", "html", type=click.Path(dir_okay=False, path_type=Path), default=None, help="Also write a self-contained HTML postmortem (verdict, root causes, plots) to FILE.")
@click.option("--workers", type=click.IntRange(min=1), default=None, help="Reader processes (default: chosen from the folder size).")
@click.option("--hosts", "hosts", is_flag=True, help="Print only the hosts of the root-cause ranks, one per line (to drain or inspect, for scripts).")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar on stderr (it is only drawn on a terminal anyway).")
@click.option("--progress", "force_progress", is_flag=True, hidden=True, help="Draw the progress bar even when stderr is not a terminal.")
def analyze_command(folder: str, fmt: str, dot: Path | None, workers: int | None, html: Path | None = None,
                    quiet: bool = False, force_progress: bool = False, hosts: bool = False) -> None:
    """Name the stalled, dead, mismatched or deadlocked ranks of the dumps in FOLDER (a path or an fsspec URL)."""
    from .analysis import load
    from .progress import ReadProgress
    from .render import text_report, to_dot

    bar = ReadProgress(enabled=not quiet, force=force_progress)
    try:
        analysis = load(folder, workers=workers, progress=bar.progress, on_count=bar.on_count)
    except UnusableInput as exc:
        bar.close()
        _fail(str(exc), NO_DUMPS_HINT)
        return
    bar.close()
    for problem in analysis.problems:
        click.echo(f"flightrec: skipped {problem.line()}", err=True)
    report = analysis.report()
    if dot is not None:
        dot.write_text(to_dot(analysis.graph, report))
    if html is not None:
        from .html_report import render_html

        html.write_text(render_html(analysis), encoding="utf-8")
    if hosts:
        _print_hosts(report)
    elif fmt == "json":
        click.echo(json.dumps(report, indent=2, default=str))
    else:
        click.echo(text_report(report, analysis.graph))


def _print_hosts(report: dict[str, Any]) -> None:
    """The root causes' hosts, each once, in the report's order; a rank whose host is unknown (no dump)
    is said on stderr, so that a script never drains the wrong machine."""
    seen: list[str] = []
    for cause in report["root_causes"]:
        for rank in cause.get("ranks") or [cause["rank"]]:
            host = cause.get("host") if rank == cause["rank"] else None
            if host is None:
                click.echo(f"flightrec: rank {rank}: host unknown ({cause['kind']}, no dump names it)", err=True)
            elif host not in seen:
                seen.append(host)
    for host in seen:
        click.echo(host)


@click.command("show")
@click.argument("folder", type=click.Path(path_type=Path))
@click.option("--rank", "rank", type=int, required=True, help="Global rank whose entries to list.")
@click.option("--group", "group", default=None, help="Only this process group (its name, e.g. 0).")
def show_command(folder: Path, rank: int, group: str | None) -> None:
    """List one rank's recorded entries as a table."""
    from .render import entry_table

    try:
        files = discover(folder)
    except UnusableInput as exc:
        _fail(str(exc), NO_DUMPS_HINT)
        return
    named = [f for f in files if rank_from_name(f.name) == rank]
    problems = []
    for path in named or files:  # the rank's own file first; a full scan only if the names do not say
        got = read_path(str(path))
        if isinstance(got, RankDump) and got.rank == rank:
            click.echo(entry_table(concat_entries([got.entries]), rank, group))
            return
        if not isinstance(got, RankDump) and path in named:
            problems.append(got.line())
    _fail(f"rank {rank}: no readable dump in {folder}" + (f" ({'; '.join(problems)})" if problems else ""))


@click.command("export")
@click.argument("folder")
@click.option("--out", "out", type=click.Path(dir_okay=False, path_type=Path), required=True, help="Parquet file for the entries; the groups go to OUT's name with .groups.parquet.")
@click.option("--workers", type=click.IntRange(min=1), default=None, help="Reader processes (default: chosen from the folder size).")
def export_command(folder: str, out: Path, workers: int | None) -> None:
    """Write every rank's entries of FOLDER (a path or an fsspec URL), with the analyzer's derived columns, and the group table as Parquet."""
    from .analysis import load
    from .export import export

    try:
        analysis = load(folder, workers=workers)
    except UnusableInput as exc:
        _fail(str(exc), NO_DUMPS_HINT)
        return
    for problem in analysis.problems:
        click.echo(f"flightrec: skipped {problem.line()}", err=True)
    done = export(analysis, out)
    click.echo(f"wrote {done.entries} entries to {done.entries_path} and {done.groups} groups to {done.groups_path}")


@click.group("flightrec-analyzers")
def main() -> None:
    """Offline analysis of flightrec and PyTorch flight-recorder dumps."""


main.add_command(analyze_command)
main.add_command(show_command)
main.add_command(export_command)
