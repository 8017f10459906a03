"""`flightrec demo`: a 4-rank gloo job where one rank stalls, its dumps, and their analysis."""

from __future__ import annotations

import shutil
from pathlib import Path

import click


def run_demo(out: str, ranks: int, stall_rank: int, timeout_s: float = 3.0) -> int:
    from fixtures.launch import launch

    folder = Path(out)
    if folder.exists():
        shutil.rmtree(folder)
    script = Path(__file__).resolve().parent.parent / "fixtures" / "jobs" / "train.py"
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
        from analyzers.cli import analyze_command
    except ImportError:
        return 0
    click.echo(f"\n$ flightrec analyze {folder}\n")
    try:
        analyze_command.main([str(folder)], standalone_mode=False)
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0
