"""What the start-up hook costs a Python process that does not use flightrec (FLIGHTREC unset).

Every interpreter on the machine reads `flightrec.pth` at start-up, so it must cost nothing
measurable there. Measures, in children with FLIGHTREC unset: the hook's whole work as `site` does it
(`site.addpackage`: open, read and run the .pth line), against the start-up of `python -c pass`
measured in the same run; and which modules the hook leaves imported (none may be flightrec's or
torch's). Prints microseconds and the ratio (docs/overhead.md, "Start-up hook").

    python benchmarks/startup.py [--starts 30]
"""

from __future__ import annotations

import argparse
import json
import os
import site
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_HOOK_COST = """
import json, site, statistics, sys, time
folder, name, calls = sys.argv[1], sys.argv[2], int(sys.argv[3])
before = set(sys.modules)
site.addpackage(folder, name, set())
imported = sorted(m for m in set(sys.modules) - before if m.startswith(("flightrec", "torch")))
per_call = []
for _ in range(20):
    start = time.perf_counter_ns()
    for _ in range(calls):
        site.addpackage(folder, name, set())
    per_call.append((time.perf_counter_ns() - start) / calls / 1e3)
print(json.dumps({"us": statistics.median(per_call), "imported": imported}))
"""


HOOK = "flightrec.pth"


def installed_hook() -> str:
    """The folder of the flightrec.pth this interpreter reads at start-up, else the repo's."""
    for folder in [*site.getsitepackages(), site.getusersitepackages()]:
        if os.path.isfile(os.path.join(folder, HOOK)):
            return folder
    return ROOT


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "FLIGHTREC"}


def hook_cost(folder: str, name: str, calls: int = 2000) -> dict[str, object]:
    done = subprocess.run([sys.executable, "-c", _HOOK_COST, folder, name, str(calls)], env=_env(),
                          capture_output=True, text=True, timeout=120, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def start_up_us(starts: int) -> float:
    """Median wall time of `python -c pass`, hook included (it is part of every start-up)."""
    times = []
    for _ in range(starts):
        start = time.perf_counter_ns()
        subprocess.run([sys.executable, "-c", "pass"], env=_env(), check=True, timeout=60)
        times.append((time.perf_counter_ns() - start) / 1e3)
    return statistics.median(times)


CLI_TARGETS_S = {"--help": 0.3, "dump-now": 0.3, "analyze (4 ranks)": 1.0}


def cli_seconds(starts: int) -> dict[str, float]:
    """Median wall time of `flightrec --help`, `flightrec dump-now DIR` and `flightrec analyze` of a
    4-rank golden folder, each in a fresh interpreter (`python -m flightrec`, this checkout)."""
    import tempfile

    folder = tempfile.mkdtemp(prefix="flightrec-startup-")
    golden = os.path.join(ROOT, "fixtures", "golden", "compute_hang")
    commands = {"--help": ["--help"], "dump-now": ["dump-now", folder, "--wait", "0"], "analyze (4 ranks)": ["analyze", golden, "-q"]}
    env = {**_env(), "PYTHONPATH": ROOT}
    out = {}
    for name, argv in commands.items():
        times = []
        for _ in range(starts):
            start = time.perf_counter()
            subprocess.run([sys.executable, "-m", "flightrec", *argv], env=env, check=True, timeout=120,
                           capture_output=True, cwd=ROOT)
            times.append(time.perf_counter() - start)
        out[name] = statistics.median(times)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--starts", type=int, default=30)
    args = parser.parse_args()
    folder = installed_hook()
    cost = hook_cost(folder, HOOK)
    start_up = start_up_us(args.starts)
    hook_us = float(cost["us"])  # type: ignore[arg-type]
    print(f"start-up hook: {os.path.join(folder, HOOK)}")
    print(f"FLIGHTREC unset: the hook costs {hook_us:.1f} us per start-up (open, read and run the .pth line); "
          f"`python -c pass` takes {start_up / 1e3:.1f} ms: {hook_us / start_up:.2e} of it")
    print(f"modules the hook imported: {cost['imported'] or 'none'}")
    verdict = "met" if not cost["imported"] and hook_us / start_up < 0.01 else "NOT met"
    print(f"target: no torch or flightrec import, under 1% of start-up -> {verdict}")
    for name, seconds in cli_seconds(max(3, args.starts // 6)).items():
        target = CLI_TARGETS_S[name]
        print(f"flightrec {name}: {seconds:.2f} s ({seconds / (start_up / 1e6):.0f}x `python -c pass`); "
              f"target < {target} s -> {'met' if seconds < target else 'NOT met'}")


if __name__ == "__main__":
    main()
