"""Click commands `analyze` and `show`; `flightrec/cli/commands.py` registers them into the `flightrec` group.

Why here and not in flightrec/: the recorder must stay importable without pandas or networkx; only
these commands pull the analyzer in. Exit codes: 0 analyzed (whatever the verdict), 2 unusable input.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from .constants import CRASH, DEADLOCK, DESYNC, HANG
from .reading.cluster import ClusterUnavailable
from .reading.columns import concat_entries
from .reading.loader import AUTO_SAMPLED_FILES, AttemptNotFound, UnusableInput, discover
from .reading.rankdump import RankDump
from .reading.read import rank_from_name, read_path
from .textutil import ranges

EXIT_UNUSABLE = 2
BLOCKED = (HANG, DEADLOCK, CRASH, DESYNC)  # verdicts the summaries decide; the others need the timing


NO_DUMPS_HINT = ("did the job run with FLIGHTREC=1 in its environment? Each rank dumps into FLIGHTREC_DIR "
                 "(default ./flightrec-dumps) when an op hangs or fails, at exit with FLIGHTREC_DUMP_ON_EXIT=1, or on "
                 "`flightrec dump-now DIR`")


def _fail(message: str, hint: str | None = None) -> None:
    click.echo(f"flightrec: {message}" + (f"\n  {hint}" if hint else ""), err=True)
    sys.exit(EXIT_UNUSABLE)


def _no_files(folders: tuple[str | Path, ...], command: str) -> None:
    """A dump file given where a folder is expected: say so, with the command to run on its folder."""
    for given in folders:
        path = Path(str(given))
        if "://" not in str(given) and path.is_file():
            parent = str(path.parent)
            rank = rank_from_name(path.name)
            hint = f"flightrec {command} {parent}" + (f" --rank {rank}" if command == "show" and rank is not None else "")
            _fail(f"{given} is a file, not a folder: pass the folder of the job's dumps, e.g. {hint}")


@click.command("analyze")
@click.argument("folders", metavar="FOLDER...", nargs=-1, required=True)
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True, help="Report format.")
@click.option("--dot", "dot", type=click.Path(dir_okay=False, path_type=Path), default=None, help="Also write the wait-for graph (Graphviz DOT) to FILE.")
@click.option("--html", "html", type=click.Path(dir_okay=False, path_type=Path), default=None, help="Also write a self-contained HTML postmortem (verdict, root causes, plots) to FILE.")
@click.option("--workers", type=click.IntRange(min=1), default=None, help="Reader processes (default: chosen from the folder size).")
@click.option("--hosts", "hosts", is_flag=True, help="Print only the hosts of the root-cause ranks, one per line (to drain or inspect, for scripts).")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar on stderr (it is only drawn on a terminal anyway).")
@click.option("--verbose", "-v", is_flag=True, help="Text report: every root cause, wait, gap and stack frame (default: ~30 lines).")
@click.option("--progress", "force_progress", is_flag=True, hidden=True, help="Draw the progress bar even when stderr is not a terminal.")
@click.option("--attempt", "attempt", type=click.IntRange(min=0), default=None, help="Analyse this torchelastic restart attempt (default: the latest in the folders).")
@click.option("--read", "read", type=click.Choice(["auto", "summary", "sampled", "full"]), default="auto", show_default=True,
              help="full: every entry; summary: each dump's summary (counters, threads, recent ops), enough for a hang "
                   "verdict, not for timing; sampled: the summaries and a bounded timing sample of every ring; auto: "
                   "summaries from 2,048 dumps on, and if nothing hangs, everything (sampled from 32,768 dumps on).")
@click.option("--dask", "dask", metavar="ADDRESS", default=None,
              help="Read the files, and time each group's collectives, as tasks on this Dask scheduler (needs the dask "
                   "extra; every worker reads the same paths or URLs).")
def analyze_command(folders: tuple[str, ...], fmt: str, dot: Path | None, workers: int | None, html: Path | None = None,
                    quiet: bool = False, force_progress: bool = False, hosts: bool = False, verbose: bool = False,
                    attempt: int | None = None, read: str = "auto", dask: str | None = None) -> None:
    """Name the stalled, dead, mismatched or deadlocked ranks of the dumps in FOLDER (a path or an fsspec URL;
    several folders, one per node's local disk, are read as one job)."""
    from .analysis import load
    from .reading.progress import ReadProgress
    from .reporting.render import text_report, to_dot

    _no_files(folders, "analyze")
    bar = ReadProgress(enabled=not quiet, force=force_progress)
    try:
        analysis = load(list(folders), workers=workers, progress=bar.progress, on_count=bar.on_count, attempt=attempt,
                        read=read, dask=dask)
        if read == "auto" and analysis.from_summaries and analysis.verdict not in BLOCKED:
            bar.close()  # nothing blocks: healthy or slow is told by every rank's timing
            bar = ReadProgress(enabled=not quiet, force=force_progress)
            again = "sampled" if len(analysis.dumps) >= AUTO_SAMPLED_FILES else "full"
            analysis = load(list(folders), workers=workers, progress=bar.progress, on_count=bar.on_count,
                            attempt=attempt, read=again, dask=dask)
        report = analysis.report()
    except ClusterUnavailable as exc:
        bar.close()
        _fail(str(exc))
        return
    except UnusableInput as exc:
        bar.close()
        _fail(str(exc), None if isinstance(exc, AttemptNotFound) else NO_DUMPS_HINT)
        return
    bar.close()
    for problem in analysis.problems:
        click.echo(f"flightrec: skipped {problem.line()}", err=True)
    if dot is not None:
        dot.write_text(to_dot(analysis.graph, report))
    if html is not None:
        from .reporting.html_report import render_html

        page = render_html(analysis)
        html.write_text(page, encoding="utf-8")
        click.echo(f"flightrec: wrote the HTML postmortem to {html} ({len(page.encode()):,} bytes)", err=True)
    if hosts:
        _print_hosts(report)
    elif fmt == "json":
        click.echo(json.dumps(report, indent=2, default=str))
    else:
        click.echo(text_report(report, analysis.graph, verbose=verbose, folder=" ".join(folders)))


def _print_hosts(report: dict[str, Any]) -> None:
    """The hosts of the ranks the report names (root causes, then slow ranks), each once, in the report's
    order; a rank whose host is unknown, or only inferred from a peer's dump, is said on stderr (with
    why), so that a script never drains a machine unawares; nothing named is said there too."""
    named = [r for c in report["root_causes"] for r in c.get("ranks") or [c["rank"]]]
    named += [s["rank"] for s in report.get("stragglers") or []]
    places = report.get("hosts") or {}
    seen: list[str] = []
    for rank in dict.fromkeys(named):
        place = places.get(str(rank)) or {}
        host = place.get("host")
        if host is None:
            click.echo(f"flightrec: rank {rank}: host unknown ({place.get('host_detail') or 'no dump names it'})", err=True)
            continue
        if place.get("host_from") == "peers":
            click.echo(f"flightrec: rank {rank}: host {host} inferred ({place.get('host_detail')})", err=True)
        if host not in seen:
            seen.append(host)
    if not named:
        click.echo(f"flightrec: the report names no rank (verdict {report['verdict']}): no host to print", err=True)
    for host in seen:
        click.echo(host)


@click.command("show")
@click.argument("folders", metavar="FOLDER...", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--rank", "rank", type=int, required=True, help="Global rank whose entries to list.")
@click.option("--group", "group", default=None, help="Only this process group (its name, e.g. 0).")
@click.option("--attempt", "attempt", type=click.IntRange(min=0), default=None, help="That torchelastic restart attempt's dump (default: the latest).")
def show_command(folders: tuple[Path, ...], rank: int, group: str | None, attempt: int | None = None) -> None:
    """List one rank's recorded entries as a table (FOLDER...: one or more folders of one job)."""
    from .reading.sites import to_user_sites
    from .reporting.render import entry_table

    _no_files(folders, "show")
    try:
        files = [f for folder in dict.fromkeys(folders) for f in discover(folder)]
    except UnusableInput as exc:
        _fail(str(exc), NO_DUMPS_HINT)
        return
    named = [f for f in files if rank_from_name(f.name) == rank]
    got, problems = _rank_dump(named, files, rank, attempt)
    if got is not None:
        _warn_if_stale(got, files)
        table = to_user_sites(concat_entries([got.entries]), {rank: got})
        click.echo(entry_table(table, rank, group, got.meta.get("wall_offset_ns")))
        return
    have = sorted({r for r in (rank_from_name(f.name) for f in files) if r is not None})
    where = " ".join(map(str, folders))
    _fail(f"rank {rank}: no readable dump in {where}" + (f" ({'; '.join(problems)})" if problems else ""),
          f"ranks with a dump file there: {ranges(have)}" if have else None)


def _warn_if_stale(got: RankDump, files: list[Path]) -> None:
    """Warn as `analyze` does when the rank's dump is stale next to its peers' (one rule: jobs.find_stale);
    the peers are read by their summaries only."""
    from .reading.jobs import find_stale

    peers: dict[int, RankDump] = {got.rank: got}
    for path in files:
        if rank_from_name(path.name) not in (None, got.rank):
            peer = read_path(str(path), summary=True)
            if isinstance(peer, RankDump) and peer.meta.get("job_id") == got.meta.get("job_id"):
                peers.setdefault(peer.rank, peer)
    stale = find_stale(peers).stale.get(got.rank)
    if stale is not None:
        click.echo(f"flightrec: warning: rank {got.rank}: {stale.text()}; "
                   "`flightrec analyze` takes it as no current state", err=True)


def _rank_dump(named: list[Path], files: list[Path], rank: int, attempt: int | None) -> tuple[RankDump | None, list[str]]:
    """The rank's dump of `attempt` (default: its latest restart attempt) and the problems of its files.
    Every file named for the rank is read (one per attempt); a full scan only if the names do not say."""
    from .reading.attempts import NoSuchAttempt, attempt_of, split_attempts

    problems: list[str] = []
    found: list[RankDump] = []
    for path in named or files:
        got = read_path(str(path))
        if isinstance(got, RankDump) and got.rank == rank:
            found.append(got)
            if not named and (attempt is None or attempt_of(got) == attempt):
                break
        elif not isinstance(got, RankDump) and path in named:
            problems.append(got.line())
    if not found:
        return None, problems
    try:
        kept = split_attempts(found, attempt).kept
    except NoSuchAttempt as exc:
        return None, problems + [str(exc)]
    return sorted(kept, key=lambda d: str(d.file))[0], problems


@click.command("export")
@click.argument("folders", metavar="FOLDER...", nargs=-1, required=True)
@click.option("--out", "out", type=click.Path(dir_okay=False, path_type=Path), default=None, help="Parquet file for the entries; the groups go to OUT's name with .groups.parquet.")
@click.option("--trace", "trace", type=click.Path(dir_okay=False, path_type=Path), default=None, help="Chrome trace-event JSON timeline (Perfetto, chrome://tracing) of every rank's ops, waits and root causes (gzip if FILE ends with .gz).")
@click.option("--trace-last", "trace_last", type=click.IntRange(min=1), default=None, help="Only each rank's N most recent entries in the --trace timeline (default: all).")
@click.option("--workers", type=click.IntRange(min=1), default=None, help="Reader processes (default: chosen from the folder size).")
@click.option("--attempt", "attempt", type=click.IntRange(min=0), default=None, help="Analyse this torchelastic restart attempt (default: the latest in the folders).")
def export_command(folders: tuple[str, ...], out: Path | None, workers: int | None, trace: Path | None = None,
                   attempt: int | None = None, trace_last: int | None = None) -> None:
    """Write every rank's entries of FOLDER (a path or an fsspec URL), with the analyzer's derived columns, as Parquet (--out) and/or as a timeline for Perfetto (--trace)."""
    from .analysis import load

    if out is None and trace is None:
        raise click.UsageError("nothing to write: give --out FILE (Parquet), --trace FILE (timeline), or both")
    _no_files(folders, "export")
    try:
        analysis = load(list(folders), workers=workers, attempt=attempt)
    except UnusableInput as exc:
        _fail(str(exc), None if isinstance(exc, AttemptNotFound) else NO_DUMPS_HINT)
        return
    for problem in analysis.problems:
        click.echo(f"flightrec: skipped {problem.line()}", err=True)
    if out is not None:
        from .reporting.export import export

        done = export(analysis, out)
        click.echo(f"wrote {done.entries} entries to {done.entries_path} and {done.groups} groups to {done.groups_path}")
    if trace is not None:
        from .reporting.trace_events import write_trace

        click.echo(write_trace(analysis, trace, last_ops=trace_last).line())


@click.group("flightrec-analyzers")
def main() -> None:
    """Offline analysis of flightrec and PyTorch flight-recorder dumps."""


main.add_command(analyze_command)
main.add_command(show_command)
main.add_command(export_command)
