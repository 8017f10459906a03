"""`flightrec --help` and `flightrec dump-now` import neither torch nor the analyzer (issue 23: they
must answer instantly; benchmarks/startup.py times them), and the help lists the analysis commands
with their own summaries."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

# Kept as a `-c` string on purpose: the child imports nothing but the command before it counts what
# the command imported. It only prints facts; the tests below assert on them.
CHECK = """
import sys
from click.testing import CliRunner
from flightrec.cli.commands import main
result = CliRunner().invoke(main, sys.argv[1:])
heavy = sorted(m for m in ("torch", "analyzers", "pandas", "networkx") if m in sys.modules)
import json
print(json.dumps({"exit_code": result.exit_code, "heavy": heavy, "output": result.output}))
"""


def _run(*argv: str) -> dict[str, Any]:
    """The command's exit code, output, and the heavy modules imported by the time it returned."""
    done = subprocess.run([sys.executable, "-c", CHECK, *argv], capture_output=True, text=True, timeout=120,
                          cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, check=True)
    got = json.loads(done.stdout)
    assert got["exit_code"] == 0, got["output"]
    return got


def test_help_imports_nothing_heavy_and_says_how_to_record() -> None:
    got = _run("--help")
    assert got["heavy"] == [], got
    out = got["output"]
    assert "FLIGHTREC=1" in out and "analyze" in out and "show" in out and "export" in out


def test_dump_now_imports_nothing_heavy(tmp_path: Path) -> None:
    assert _run("dump-now", str(tmp_path), "--wait", "0")["heavy"] == []
    assert (tmp_path / ".flightrec-dump-request").exists()


def test_help_summaries_are_the_commands_own() -> None:
    from analyzers import cli as analysis_cli
    from flightrec.cli.commands import _LAZY, SUMMARIES

    for name, attr in _LAZY.items():
        real = getattr(analysis_cli, attr).get_short_help_str(limit=1000)
        assert real == SUMMARIES[name], (name, real)
    listing = _run("--help")["output"].split("Commands:")[1]
    assert not any(line.rstrip().endswith("...") for line in listing.splitlines())  # no summary cut short
