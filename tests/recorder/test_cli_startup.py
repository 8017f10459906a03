"""`flightrec --help` and `flightrec dump-now` import neither torch nor the analyzer (issue 23: they
must answer instantly; benchmarks/startup.py times them), and the help lists the analysis commands
with their own summaries."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CHECK = """
import sys
from click.testing import CliRunner
from flightrec.cli.commands import main
result = CliRunner().invoke(main, sys.argv[1:])
assert result.exit_code == 0, result.output
heavy = sorted(m for m in ("torch", "analyzers", "pandas", "networkx") if m in sys.modules)
print(",".join(heavy) or "none")
print(result.output)
"""


def _run(*argv: str) -> str:
    done = subprocess.run([sys.executable, "-c", CHECK, *argv], capture_output=True, text=True, timeout=120,
                          cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, check=True)
    return done.stdout


def test_help_imports_nothing_heavy_and_says_how_to_record() -> None:
    out = _run("--help")
    assert out.splitlines()[0] == "none", out
    assert "FLIGHTREC=1" in out and "analyze" in out and "show" in out and "export" in out


def test_dump_now_imports_nothing_heavy(tmp_path: Path) -> None:
    assert _run("dump-now", str(tmp_path), "--wait", "0").splitlines()[0] == "none"
    assert (tmp_path / ".flightrec-dump-request").exists()


def test_help_summaries_are_the_commands_own() -> None:
    from analyzers import cli as analysis_cli
    from flightrec.cli.commands import _LAZY, SUMMARIES

    for name, attr in _LAZY.items():
        real = getattr(analysis_cli, attr).get_short_help_str(limit=1000)
        assert real == SUMMARIES[name], (name, real)
    listing = _run("--help").split("Commands:")[1]
    assert not any(line.rstrip().endswith("...") for line in listing.splitlines())  # no summary cut short
