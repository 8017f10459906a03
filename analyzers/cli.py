"""Click commands `analyze` and `show`; `flightrec/cli.py` registers them into the `flightrec` group.

Why here and not in flightrec/: the recorder must stay importable without pandas or networkx; only
these commands pull the analyzer in. Exit codes: 0 analyzed (whatever the verdict), 2 unusable input.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from .columns import concat_entries
from .loader import UnusableInput, discover
from .rankdump import RankDump
from .read import rank_from_name, read_path

EXIT_UNUSABLE = 2


def _fail(message: str) -> None:
    click.echo(f"flightrec: {message}", err=True)
    sys.exit(EXIT_UNUSABLE)


@click.command("analyze")
@click.argument("folder", type=click.Path(path_type=Path))
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True, help="Report format.")
@click.option("--dot", "dot", type=click.Path(dir_okay=False, path_type=Path), default=None, help="Also write the wait-for graph (Graphviz DOT) to FILE.")
@click.option("--workers", type=click.IntRange(min=1), default=None, help="Reader processes (default: chosen from the folder size).")
def analyze_command(folder: Path, fmt: str, dot: Path | None, workers: int | None) -> None:
    """Name the stalled, dead, mismatched or deadlocked ranks of the dumps in FOLDER."""
    from .analysis import load
    from .render import text_report, to_dot

    try:
        analysis = load(folder, workers=workers)
    except UnusableInput as exc:
        _fail(str(exc))
        return
    for problem in analysis.problems:
        click.echo(f"flightrec: skipped {problem.line()}", err=True)
    report = analysis.report()
    if dot is not None:
        dot.write_text(to_dot(analysis.graph, report))
    if fmt == "json":
        click.echo(json.dumps(report, indent=2, default=str))
    else:
        click.echo(text_report(report, analysis.graph))


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
        _fail(str(exc))
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


@click.group("flightrec-analyzers")
def main() -> None:
    """Offline analysis of flightrec and PyTorch flight-recorder dumps."""


main.add_command(analyze_command)
main.add_command(show_command)
