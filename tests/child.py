"""A job function of a worker module run in a child interpreter, and the facts it prints back.

Why: a test that needs a fresh process (the start-up hook, signals, `os.abort`, exit hooks, fork)
used to run a `python -c` string, whose checks no linter read and whose failures came back as a bare
exit code. The job now lives in a worker module (`python -m tests.<folder>.<module> JOB ARGS...`),
prints what it saw as one JSON line (`emit`), and the parent test asserts on it (`facts`).

Standard library only: a worker module imports this before anything else, and some jobs check what
was imported before they ran (no torch until the job imports it).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def command(module: str, job: str, *args: object) -> list[str]:
    """The command line that runs `job` of worker module `module` (dotted) with `args` as strings."""
    return [sys.executable, "-m", module, job, *map(str, args)]


def env_with_root(env: Mapping[str, str] | None = None, **extra: str) -> dict[str, str]:
    """`env` (default: this process's environment) plus `extra`, with the checkout first on PYTHONPATH:
    `-m tests...` must import this checkout's tests and flightrec whatever the child's working folder."""
    out = dict(os.environ if env is None else env, **extra)
    rest = [p for p in out.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(ROOT)]
    out["PYTHONPATH"] = os.pathsep.join([str(ROOT), *rest])
    return out


def emit(**facts: Any) -> None:
    """Print the job's facts as one JSON line (the parent reads the last line)."""
    print(json.dumps(facts), flush=True)


def facts(stdout: str) -> dict[str, Any]:
    """The facts a job printed with `emit`: its last line of output."""
    lines = stdout.strip().splitlines()
    assert lines, "the job printed nothing"
    return json.loads(lines[-1])


def dispatch(jobs: Mapping[str, Callable[..., object]], argv: Sequence[str] | None = None) -> None:
    """A worker module's `__main__`: run the job named by the first argument with the rest."""
    name, *args = sys.argv[1:] if argv is None else argv
    if name not in jobs:
        raise SystemExit(f"no job {name!r}; jobs: {', '.join(sorted(jobs))}")
    jobs[name](*args)
