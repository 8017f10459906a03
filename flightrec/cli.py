"""The `flightrec` command. Analysis commands load lazily so `dump-now` needs neither torch nor pandas."""

from __future__ import annotations

import sys

import click

from .triggers import request_via_file

_LAZY = {"analyze": "analyze_command", "show": "show_command", "export": "export_command"}
# what `flightrec --help` lists for them, without importing pandas to ask (tests/recorder/test_cli_startup.py
# checks these against the commands' own docstrings)
SUMMARIES = {
    "analyze": "Name the stalled, dead, mismatched or deadlocked ranks of the dumps in FOLDER...",
    "export": "Write every rank's entries of FOLDER (a path or an fsspec URL), with the...",
    "show": "List one rank's recorded entries as a table.",
}


class _LazyGroup(click.Group):
    """Analysis commands live in `analyzers` (pandas, networkx): import them only when called."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(self._available()))

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        command = super().get_command(ctx, name)
        if command is None and name in _LAZY:
            try:
                from analyzers import cli as analysis_cli
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
                rows.append((name, command.get_short_help_str(formatter.width - 6 - max(len(n) for n in self.list_commands(ctx)))))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    @staticmethod
    def _available() -> list[str]:
        import importlib.util

        if importlib.util.find_spec("analyzers") is None:
            return []
        return ["analyze", "export", "show"]


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
def dump_now(folder: str, reason: str) -> None:
    """Make every rank of the job that dumps into FOLDER write its dump now (works while ranks are blocked)."""
    try:
        path = request_via_file(folder, reason)
    except OSError as exc:
        raise click.ClickException(f"cannot write the request into {folder}: {exc}") from exc
    click.echo(f"requested a dump from every rank writing to {folder} ({path})")


@main.command("build-ext")
@click.option("--out", type=click.Path(file_okay=False), default=None,
              help="Folder for the built file (default: next to the package, else ~/.cache/flightrec).")
def build_ext(out: str | None) -> None:
    """Build the recorder's reader of torch's C++ objects for the installed torch (~2 µs less per collective)."""
    from pathlib import Path

    from . import peek

    existing = peek.find() if out is None else None
    if existing is not None:
        click.echo(f"already built for torch {peek.torch.__version__}: {existing}")
        return
    try:
        path = peek.build(Path(out) if out else None)
    except peek.BuildError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"built for torch {peek.torch.__version__}: {path}")


@main.command("demo")
@click.option("--out", default="./flightrec-demo", show_default=True, help="Dump folder.")
@click.option("--ranks", default=4, show_default=True, help="World size.")
@click.option("--stall-rank", default=2, show_default=True, help="The rank that stalls.")
def demo(out: str, ranks: int, stall_rank: int) -> None:
    """Run a small gloo job where one rank stalls, collect the dumps, and analyze them."""
    from .demo import run_demo

    sys.exit(run_demo(out, ranks, stall_rank))


if __name__ == "__main__":
    main()
