"""`flightrec demo`: a 4-rank gloo job where one rank stalls, its dumps, and their analysis.

The demo writes into `--out` and never deletes what it did not write: a folder it made (it leaves
`MARKER` there) has its earlier dumps and job files removed before a new run; any other folder must be
new or empty, else the demo refuses and touches nothing.
"""

from __future__ import annotations

import re
from pathlib import Path

import click

MARKER = ".flightrec-demo"  # left in the folder: "written by flightrec demo", so a rerun may clear it
# What a demo run writes: the dumps (and a dump's temporary file), the held-GIL stacks files, the
# launcher's log and error file, the dump-request file, the marker.
DEMO_FILES = re.compile(
    r"rank-\d{5,}\.json\.gz|rank-\d{5,}\.stacks\.txt|\.rank-\d{5,}\.json\.gz\.\d+\.tmp|\.job\.log|\.torchelastic-error\.json"
    r"|\.flightrec-dump-request|" + re.escape(MARKER)
)


def prepare_folder(folder: Path) -> None:
    """Make `folder` ready for a demo run, deleting only the files an earlier demo run wrote there.

    Raises click.ClickException (nothing deleted) when it holds anything else, or dumps without the
    demo's marker (e.g. a real job's FLIGHTREC_DIR).
    """
    if folder.exists() and not folder.is_dir():
        raise click.ClickException(f"{folder} is not a folder; choose another --out")
    folder.mkdir(parents=True, exist_ok=True)
    present = sorted(folder.iterdir())
    foreign = [p.name for p in present if p.is_symlink() or not p.is_file() or not DEMO_FILES.fullmatch(p.name)]
    if foreign:
        shown = ", ".join(foreign[:5]) + (f", ... ({len(foreign)} in all)" if len(foreign) > 5 else "")
        raise click.ClickException(
            f"{folder} holds files the demo did not write ({shown}); nothing was deleted: "
            "choose a new or empty folder with --out"
        )
    if present and not (folder / MARKER).is_file():
        raise click.ClickException(
            f"{folder} holds dumps or job files that no earlier `flightrec demo` run left there (no {MARKER} file); "
            "nothing was deleted: choose a new or empty folder with --out"
        )
    for p in present:  # an earlier demo run's files, every one matched above
        p.unlink()
    (folder / MARKER).write_text("written by `flightrec demo`: its files here are replaced on the next demo run\n")


def run_demo(out: str, ranks: int, stall_rank: int, timeout_s: float = 3.0) -> int:
    from . import components

    launch = components.demo_launcher().launch  # fixtures/launch.py; a wheel ships it inside flightrec/_demo/
    script = components.path("_demo/jobs/train.py")  # fixtures/jobs/train.py, likewise
    folder = Path(out)
    prepare_folder(folder)
    click.echo(f"launching {ranks} gloo ranks with torchrun; rank {stall_rank} stalls in compute at step 3 "
               f"(FLIGHTREC=1, FLIGHTREC_TIMEOUT={timeout_s:g})")
    result = launch(script, ranks, folder, ["--fault", "compute_hang", "--fault-rank", str(stall_rank)],
                    env={"FLIGHTREC_TIMEOUT": str(timeout_s)}, wait_for_ranks=list(range(ranks)),
                    timeout_s=60 + timeout_s)
    if result.timed_out or len(result.dumps) < ranks:
        click.echo(f"the job did not dump as expected ({len(result.dumps)} dumps); its log:\n{result.output[-4000:]}",
                   err=True)
        return 1
    click.echo(f"the job hung; {len(result.dumps)} dumps written in {result.elapsed_s:.1f}s, job stopped:")
    for path in result.dumps:
        click.echo(f"  {path} ({path.stat().st_size} bytes)")
    try:
        analyze_command = components.analyzer("cli").analyze_command
    except components.MissingDependency as exc:
        click.echo(f"\nto analyze them: {exc}; then: flightrec analyze {folder}")
        return 0
    except ImportError as exc:
        click.echo(f"the analyzer could not be loaded: {exc}", err=True)
        return 1
    click.echo(f"\n$ flightrec analyze {folder}\n")
    try:
        analyze_command.main([str(folder)], standalone_mode=False)
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0
