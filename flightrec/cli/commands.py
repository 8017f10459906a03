"""The `flightrec` command. Analysis commands load lazily so `dump-now` needs neither torch nor pandas."""

from __future__ import annotations

import os
import sys
import time

import click

from ..watch.dump_requests import request_via_file
from .live_view import rank_ranges

_LAZY = {"analyze": "analyze_command", "show": "show_command", "export": "export_command"}
# what `flightrec --help` lists for them, without importing pandas to ask (tests/recorder/test_cli_startup.py
# checks these against the commands' own docstrings)
SUMMARIES = {
    "analyze": "Name the stalled, dead, mismatched or deadlocked ranks of the dumps in FOLDER (a path or an fsspec URL; several folders, one per node's local disk, are read as one job).",
    "export": "Write every rank's entries of FOLDER (a path or an fsspec URL), with the analyzer's derived columns, as Parquet (--out) and/or as a timeline for Perfetto (--trace).",
    "show": "List one rank's recorded entries as a table (FOLDER...: one or more folders of one job).",
}


class _LazyGroup(click.Group):
    """Analysis commands live in the analyzer (pandas, networkx; flightrec/cli/components.py finds it): import
    them only when called."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(self._available()))

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        command = super().get_command(ctx, name)
        if command is None and name in _LAZY:
            from . import components

            try:
                analysis_cli = components.analyzer("cli")
            except components.MissingDependency as exc:
                raise click.ClickException(f"`flightrec {name}`: {exc}") from exc
            except ImportError as exc:
                raise click.ClickException(f"the analyzer could not be loaded: {exc}") from exc
            command = getattr(analysis_cli, _LAZY[name], None)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The command list of `--help`, the analysis commands from SUMMARIES: listing them must not
        import the analyzer (pandas, networkx: most of a second)."""
        rows = []
        for name in self.list_commands(ctx):
            if name in _LAZY:
                rows.append((name, SUMMARIES[name]))
                continue
            command = super().get_command(ctx, name)
            if command is not None and not command.hidden:
                rows.append((name, command.get_short_help_str(limit=1000)))  # whole, wrapped: never cut
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    @staticmethod
    def _available() -> list[str]:
        """Listed whenever the analyzer's code is here: without its dependencies, they say what to install."""
        from .components import analyzer_present

        return sorted(_LAZY) if analyzer_present() else []


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="flightrec")
def main() -> None:
    """Flight recorder and hang analyzer for torch.distributed jobs.

    Record: run the unmodified job with FLIGHTREC=1 in its environment (e.g. FLIGHTREC=1 torchrun ...);
    each rank dumps into FLIGHTREC_DIR (default ./flightrec-dumps) when an op hangs or fails. Then:
    flightrec analyze FLIGHTREC_DIR.
    """


@main.command("dump-now")
@click.argument("folder", type=click.Path(file_okay=False))
@click.option("--reason", default="manual", show_default=True, help="Reason written into the dumps.")
@click.option("--wait", "wait_s", type=click.FloatRange(min=0), default=5.0, show_default=True,
              help="Seconds to wait for the ranks' dumps, then say how many answered (0: only ask).")
def dump_now(folder: str, reason: str, wait_s: float) -> None:
    """Make every rank of the job that dumps into FOLDER write its dump now (works while ranks are blocked)."""
    import os
    import time

    from ..watch.dump_requests import answered, dump_stamps

    existed = os.path.isdir(folder)
    before = dump_stamps(folder)
    try:
        path = request_via_file(folder, reason)
    except OSError as exc:
        raise click.ClickException(f"cannot write the request into {folder}: {exc}") from exc
    click.echo(f"requested a dump from every rank writing to {folder} ({path})")
    if wait_s <= 0:
        return
    start = time.monotonic()
    ranks: list[int] = []
    world: int | None = None
    while time.monotonic() - start < wait_s:
        time.sleep(0.2)
        ranks, world = answered(folder, before)
        if world is not None and len(ranks) >= world:
            break
    took = time.monotonic() - start
    if not ranks:
        why = ("the folder did not exist: no job has written there" if not existed else
               "is a job running with FLIGHTREC=1 and FLIGHTREC_DIR set to this folder?")
        click.echo(f"no rank answered within {wait_s:g} s: {why} (the request stays: ranks that start "
                   "polling later do not take it as theirs)", err=True)
        sys.exit(1)
    of = f" of {world}" if world else ""
    missing = sorted(set(range(world)) - set(ranks)) if world else []
    click.echo(f"{len(ranks)}{of} ranks answered in {took:.1f} s" + (f"; no answer yet from {rank_ranges(missing)}" if missing else "")
               + f": flightrec analyze {folder}")


@main.command("watch")
@click.argument("address")
@click.option("--interval", "interval_s", type=click.FloatRange(min=0.2), default=2.0, show_default=True,
              help="Seconds between refreshes.")
@click.option("--once", is_flag=True, help="Print one screen and exit.")
@click.option("--window", "window_s", type=click.FloatRange(min=1), default=60.0, show_default=True,
              help="Seconds a straggler's cost is measured over.")
@click.option("--share", type=click.FloatRange(min=0, max=1, min_open=True), default=0.05, show_default=True,
              help="Share of the window that makes a rank a straggler.")
def watch(address: str, interval_s: float, once: bool, window_s: float, share: float) -> None:
    """See a running job live from its store at ADDRESS (MASTER_ADDR:MASTER_PORT), or from a dump folder: each
    group's progress, who the others wait for, the slowest ranks by cost, ranks that stopped answering. Read-only."""
    from . import live_view

    if os.path.isdir(address):
        _watch_folder(address, interval_s, once)
        return
    try:
        store = live_view.connect(address)
    except Exception as exc:  # noqa: BLE001 - any connect failure is the user's address or network
        raise click.ClickException(f"cannot reach the job's store at {address}: {exc}") from exc
    while True:
        try:
            attempt, records = live_view.read_records(store)
        except Exception as exc:  # noqa: BLE001 - the job ended, or its store went away
            raise click.ClickException(f"the job's store at {address} stopped answering: {exc}") from exc
        text = live_view.screen(records, window_s, share, title=f"flightrec watch {address} attempt {attempt}: ")
        if once:
            click.echo(text)
            return
        click.clear()
        click.echo(text)
        time.sleep(interval_s)


def _watch_folder(folder: str, interval_s: float, once: bool) -> None:
    """The analyzer's first screen of a dump folder's newest dumps, re-read every refresh (read-only)."""
    from . import components

    try:
        analyzers = components.analyzer()
        render = components.analyzer("reporting.render")
    except (components.MissingDependency, ImportError) as exc:
        raise click.ClickException(f"`flightrec watch FOLDER` reads dumps with the analyzer: {exc}") from exc
    while True:
        try:
            text = render.text_report(analyzers.load(folder).report())
        except analyzers.UnusableInput as exc:
            text = f"{folder}: no dumps to read yet ({exc})"
        if once:
            click.echo(text)
            return
        click.clear()
        click.echo(f"flightrec watch {folder}, {time.strftime('%H:%M:%S')} (dumps: FLIGHTREC_SNAPSHOT_S, hangs)\n{text}")
        time.sleep(interval_s)


@main.command("build-ext")
@click.option("--out", type=click.Path(file_okay=False), default=None,
              help="Folder for the built file (default: next to the package, else ~/.cache/flightrec).")
def build_ext(out: str | None) -> None:
    """Build the recorder's reader of torch's C++ objects for the installed torch (~2 µs less per collective)."""
    from pathlib import Path

    from ..record import cpp_reader

    existing = cpp_reader.find() if out is None else None
    if existing is not None:
        click.echo(f"already built for torch {cpp_reader.torch.__version__}: {existing}")
        return
    try:
        path = cpp_reader.build(Path(out) if out else None)
    except cpp_reader.BuildError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"built for torch {cpp_reader.torch.__version__}: {path}")


@main.command("demo")
@click.option("--out", default="./flightrec-demo", show_default=True, help="Dump folder.")
@click.option("--ranks", default=4, show_default=True, help="World size.")
@click.option("--stall-rank", default=2, show_default=True, help="The rank that stalls.")
def demo(out: str, ranks: int, stall_rank: int) -> None:
    """Run a small gloo job where one rank stalls, collect the dumps, and analyze them."""
    from .demo import run_demo

    sys.exit(run_demo(out, ranks, stall_rank))


@main.command("notebook")
@click.argument("folder")
@click.option("--out", type=click.Path(dir_okay=False), default="postmortem.ipynb", show_default=True,
              help="The notebook file to write.")
@click.option("--force", is_flag=True, help="Replace --out if it exists.")
def notebook(folder: str, out: str, force: bool) -> None:
    """Write the post-mortem notebook, set to analyze FOLDER (a path or an fsspec URL), to --out."""
    from pathlib import Path

    from . import notebook as nb

    try:
        path = nb.write(folder, Path(out), force=force)
    except (nb.NotebookError, FileNotFoundError) as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"wrote {path} ({nb.PARAMETER} = {nb.folder_value(folder)!r}); open it in Jupyter and run all cells "
               "(it needs pip install 'flightrec[notebook]')")


if __name__ == "__main__":  # python -m flightrec.cli.commands
    main()
