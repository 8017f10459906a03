"""Which torch releases the recorder and the analyzer are shown to work with: one venv per release.

CI tests the pinned torch only; this is run for each flightrec release (docs/compat.md). Per torch
version it makes (or reuses) a virtual environment under `--root` with that torch from the package
index, puts this checkout on its path and the `flightrec.pth` start-up hook in its site-packages (what
an install does), and runs there, each under a hard timeout:

- `reader`: `flightrec build-ext`, the optional torch reader compiled against that torch's C++ headers
  (into the checkout, keyed by the torch build), so that the tests below run with it as an install would;
- `units`: the recorder's own unit tests (tests/recorder/test_recorder_units.py) with that torch;
- `api`: the recorder API job (tests/recorder/test_api_coverage.py: every c10d API, recorded entries, by
  the C hot path with and without the torch reader and by the Python wrapper, compared field by field);
- `stall`: torchrun jobs where one rank stalls, in Python (compute_hang) and under DDP (ddp_stall);
- `crash`: a torchrun job where one rank dies (crash);
- `torch_fr`: PyTorch's own recorder of that version dumped by a stalled gloo job (fixtures/make_torch_fr.py),
  read by the analyzer; "n/a" where that torch has no recorder for gloo.

The torchrun jobs' dumps are analyzed here (the analyzer does not depend on the job's torch) and checked
against what fixtures/run.py's scenario expects. Prints a version x check table in Markdown.

    python benchmarks/compat.py [--versions 2.1.2 2.4.1 2.13.0 newest] [--root /tmp/flightrec-compat]
                                [--out docs/compat.md]

Never installs into the running interpreter's environment. The machine's pip configuration (which may
cap torch with a constraints file) is not read for the venvs, so that "newest" is the newest release the
index serves; PIP_* variables still apply.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from fixtures.launch import kill_tree  # noqa: E402

DEFAULT_VERSIONS = ("2.1.2", "2.4.1", "2.13.0", "newest")
CHECKS = ("reader", "units", "api", "stall", "crash", "torch_fr")
SCENARIOS = {"stall": ("compute_hang", "ddp_stall"), "crash": ("crash",)}
TESTS = {"units": "tests/recorder/test_recorder_units.py", "api": "tests/recorder/test_api_coverage.py"}
# Released torch wheels for Linux x86_64 were built against numpy 1.x up to 2.2; they run with it.
VENV_PACKAGES = ("numpy<2", "pytest", "click", "hypothesis")
INSTALL_TIMEOUT_S = 1800.0
TEST_TIMEOUT_S = 900.0
SCENARIO_TIMEOUT_S = 150.0
TORCH_FR_TIMEOUT_S = 200.0


@dataclass
class Result:
    ok: bool | None  # None: not applicable on this version
    note: str = ""
    seconds: float = 0.0


@dataclass
class Row:
    version: str
    installed: str = ""
    results: dict[str, Result] = field(default_factory=dict)
    setup_s: float = 0.0


def _pip_env() -> dict[str, str]:
    env = dict(os.environ)
    # The machine's pip configuration may cap torch (a constraints file): a venv may hold any release.
    env["PIP_CONFIG_FILE"] = os.devnull
    env.pop("PYTHONPATH", None)
    return env


def newest_version() -> str:
    """The newest torch release the package index serves (`pip index versions`), without installing it."""
    out = subprocess.run([sys.executable, "-m", "pip", "index", "versions", "torch"], capture_output=True, text=True,
                         env=_pip_env(), timeout=300, check=True).stdout
    match = re.search(r"Available versions:\s*([^\n]+)", out)
    if not match:
        raise SystemExit(f"`pip index versions torch` named no versions:\n{out}")
    releases = [v.strip() for v in match.group(1).split(",") if re.fullmatch(r"\d+\.\d+\.\d+", v.strip())]
    return max(releases, key=lambda v: tuple(int(p) for p in v.split(".")))


def venv_python(root: Path, version: str) -> Path:
    return root / f"torch-{version}" / "bin" / "python"


def make_venv(root: Path, version: str) -> tuple[Path, str]:
    """A venv with torch==version and this checkout (with its start-up hook); reused when it exists."""
    python = venv_python(root, version)
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(python.parent.parent)], check=True, timeout=300)
    probe = subprocess.run([str(python), "-c", "import torch; print(torch.__version__)"], capture_output=True,
                           text=True, env=_pip_env(), timeout=300)
    if probe.returncode != 0 or not probe.stdout.strip().startswith(version):
        subprocess.run([str(python), "-m", "pip", "install", "-q", f"torch=={version}", *VENV_PACKAGES],
                       env=_pip_env(), timeout=INSTALL_TIMEOUT_S, check=True)
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, timeout=120, check=True).stdout.strip()
    # An install puts flightrec on the path and flightrec.pth in site-packages; the checkout's .pth sorts first.
    Path(site, "flightrec-checkout.pth").write_text(f"{ROOT}\n")
    shutil.copy(ROOT / "flightrec.pth", Path(site, "flightrec.pth"))
    installed = subprocess.run([str(python), "-c", "import torch; print(torch.__version__)"], capture_output=True,
                               text=True, env=_pip_env(), timeout=300, check=True).stdout.strip()
    return python, installed


def _bounded(command: list[str], timeout_s: float, env: dict[str, str] | None = None,
             cwd: Path = ROOT) -> tuple[int | None, str]:
    """Run `command` in its own session; on timeout kill its whole process tree. (returncode|None, output)."""
    proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
        return proc.returncode, out
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid)
        out, _ = proc.communicate(timeout=30)
        return None, out
    finally:
        if proc.poll() is None:
            kill_tree(proc.pid)


def run_tests(python: Path, path: str) -> Result:
    started = time.monotonic()
    env = _pip_env()
    env.pop("FLIGHTREC", None)
    code, out = _bounded([str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", path], TEST_TIMEOUT_S, env)
    tail = [line for line in out.strip().splitlines() if line.strip()][-1:] or ["no output"]
    summary = tail[0].strip("= ")
    if code is None:
        return Result(False, f"timed out after {TEST_TIMEOUT_S:.0f}s", time.monotonic() - started)
    failed = [line.split(" ", 1)[1].split(" - ")[0] for line in out.splitlines() if line.startswith("FAILED ")]
    note = summary + (f" ({'; '.join(failed[:4])})" if failed else "")
    return Result(code == 0, note, time.monotonic() - started)


def run_reader(python: Path) -> Result:
    """Build the torch reader for the venv's torch (what `flightrec build-ext` does after an install)."""
    started = time.monotonic()
    env = _pip_env()
    env.pop("FLIGHTREC", None)
    code, out = _bounded([str(python), "-m", "flightrec", "build-ext"], TEST_TIMEOUT_S, env)
    lines = [line for line in out.strip().splitlines() if line.strip()]
    if code is None:
        return Result(False, f"timed out after {TEST_TIMEOUT_S:.0f}s", time.monotonic() - started)
    error = next((line.strip() for line in lines if " error: " in line), lines[-1] if lines else "no output")
    note = (lines[-1] if lines else "") if code == 0 else error[:300]
    return Result(code == 0, note.replace(str(ROOT) + "/", ""), time.monotonic() - started)


def run_scenarios(python: Path, names: tuple[str, ...], work: Path) -> Result:
    from fixtures.run import SCENARIOS as ALL
    from fixtures.run import analyze, check, dumped_ranks, run_scenario

    started = time.monotonic()
    notes, ok = [], True
    for name in names:
        scenario = ALL[name]
        out = work / name
        try:
            job = run_scenario(scenario, out, python=str(python))
            problems = ([f"job ran past {scenario.timeout_s:.0f}s"] if job.timed_out else [])
            problems += check(scenario, analyze(out), dumped_ranks(out))
        except Exception as exc:  # noqa: BLE001 - one broken check must not hide the others
            problems = [f"{type(exc).__name__}: {exc}"]
        ok = ok and not problems
        notes.append(f"{name}: " + ("ok" if not problems else "; ".join(problems)))
    return Result(ok, "; ".join(notes), time.monotonic() - started)


def run_torch_fr(python: Path, work: Path) -> Result:
    """PyTorch's own recorder of that version, dumped by a stalled 4-rank gloo job, read by the analyzer."""
    started = time.monotonic()
    has = subprocess.run([str(python), "-c", "import torch; print(hasattr(torch._C._distributed_c10d, "
                          "'_dump_fr_trace_json'))"], capture_output=True, text=True, timeout=300, env=_pip_env())
    if has.stdout.strip() != "True":
        return Result(None, "no built-in recorder for gloo in this torch", time.monotonic() - started)
    import analyzers

    dirs = [work / "torch_fr_pickle", work / "torch_fr_json"]
    code, out = _bounded([str(python), "fixtures/make_torch_fr.py", *map(str, dirs)], TORCH_FR_TIMEOUT_S, _pip_env())
    if code != 0:
        last = out.strip().splitlines()[-1:] or ["no output"]
        return Result(False, f"the job did not dump (exit {code}): {last[0][:200]}", time.monotonic() - started)
    notes, ok = [], True
    for folder in dirs:
        try:
            report = analyzers.load(str(folder)).report()
            causes = {(c["rank"], c["kind"]) for c in report["root_causes"]}
            good = report["verdict"] == "hang" and causes == {(3, "not_entered")}
            notes.append(f"{folder.name.split('_')[-1]}: {report['verdict']}, causes {sorted(causes)}")
        except Exception as exc:  # noqa: BLE001
            good = False
            notes.append(f"{folder.name}: {type(exc).__name__}: {exc}")
        ok = ok and good
    return Result(ok, "; ".join(notes), time.monotonic() - started)


def run_version(root: Path, version: str, checks: tuple[str, ...]) -> Row:
    row = Row(version)
    started = time.monotonic()
    try:
        python, row.installed = make_venv(root, version)
    except (subprocess.SubprocessError, OSError) as exc:
        row.results = {c: Result(False, f"venv: {exc}") for c in checks}
        return row
    row.setup_s = time.monotonic() - started
    work = root / "runs" / row.installed
    shutil.rmtree(work, ignore_errors=True)
    for check in checks:
        if check == "reader":
            result = run_reader(python)
        elif check in TESTS:
            result = run_tests(python, TESTS[check])
        elif check in SCENARIOS:
            result = run_scenarios(python, SCENARIOS[check], work)
        else:
            result = run_torch_fr(python, work)
        row.results[check] = result
        print(json.dumps({"torch": row.installed, "check": check, "ok": result.ok, "s": round(result.seconds, 1),
                          "note": result.note}), flush=True)
    return row


def _cell(result: Result | None) -> str:
    if result is None:
        return "not run"
    return {True: "pass", False: "FAIL", None: "n/a"}[result.ok]


def table(rows: list[Row], checks: tuple[str, ...]) -> str:
    head = "| torch | " + " | ".join(checks) + " | seconds |\n|---|" + "---|" * (len(checks) + 1) + "\n"
    body = "".join(
        f"| {r.installed or r.version} | " + " | ".join(_cell(r.results.get(c)) for c in checks)
        + f" | {sum(x.seconds for x in r.results.values()):.0f} |\n" for r in rows
    )
    notes = "".join(
        f"- torch {r.installed or r.version}, {c}: {x.note}\n" for r in rows for c in checks
        if (x := r.results.get(c)) is not None and x.note
    )
    return head + body + "\n" + notes


MARK_BEGIN, MARK_END = "<!-- compat-table: begin -->", "<!-- compat-table: end -->"


def write_between_markers(path: Path, text: str) -> None:
    """Replace the table between the markers in `path` (the page's prose stays), or write a new page."""
    block = f"{MARK_BEGIN}\n{text.rstrip()}\n{MARK_END}"
    old = path.read_text() if path.exists() else ""
    if MARK_BEGIN in old and MARK_END in old:
        head, rest = old.split(MARK_BEGIN, 1)
        path.write_text(head + block + rest.split(MARK_END, 1)[1])
    else:
        path.write_text(old + ("\n" if old else "") + block + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--versions", nargs="+", default=list(DEFAULT_VERSIONS),
                        help="torch releases; 'newest' is the newest the index serves")
    parser.add_argument("--checks", nargs="+", default=list(CHECKS), choices=CHECKS)
    parser.add_argument("--root", type=Path, default=Path("/tmp/flightrec-compat"), help="where the venvs live")
    parser.add_argument("--out", type=Path, help="also put the table (with the date) between the compat-table markers of this Markdown file")
    args = parser.parse_args(argv)
    versions = [newest_version() if v == "newest" else v for v in args.versions]
    args.root.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    rows = [run_version(args.root, v, tuple(args.checks)) for v in dict.fromkeys(versions)]
    elapsed = time.monotonic() - started
    text = (f"Run {datetime.date.today().isoformat()} on {os.cpu_count()} cores, Python "
            f"{sys.version.split()[0]}: {elapsed / 60:.1f} min in all (venv set-up "
            f"{sum(r.setup_s for r in rows) / 60:.1f} min of it).\n\n" + table(rows, tuple(args.checks)))
    print(text)
    if args.out:
        write_between_markers(args.out, text)
    return 0 if all(x.ok is not False for r in rows for x in r.results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
