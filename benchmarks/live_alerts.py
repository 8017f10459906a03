"""Live straggler alerts (docs/live.md) on real 4-rank torchrun jobs, run many times: how many slow ranks
were named within one window of their onset, how many healthy controls stayed quiet.

Each slow job runs steps of 50 ms compute plus an all_reduce; from step 60 on rank 2 computes 15 ms longer,
and the job ends one window (6 s) after that, so an alert at all is an alert within a window of the onset
(plus one publishing round). Each healthy control is the same job with no slow rank.

    python benchmarks/live_alerts.py --runs 50            # 50 slow jobs and 50 healthy controls
    python benchmarks/live_alerts.py --runs 50 --slow-runs 10
    python benchmarks/live_alerts.py --runs 10 --healthy-only --busy   # 4 ranks spinning on 2 cores
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from fixtures.launch import launch  # noqa: E402

JOB = os.path.join(ROOT, "fixtures", "jobs", "paced.py")
WINDOW_S = 6
ENV = {"FLIGHTREC_STRAGGLER_WINDOW_S": str(WINDOW_S), "FLIGHTREC_TIMEOUT": "60"}
STEP_S = 0.055  # a healthy step: 50 ms compute and the all_reduce
ONSET = 60


def run(slow_ms: float, busy: bool = False) -> tuple[list[str], float]:
    """(the job's straggler lines, seconds it ran); `busy`: compute spins the CPU, 4 ranks on fewer cores."""
    steps = ONSET + int(WINDOW_S / STEP_S)
    with tempfile.TemporaryDirectory() as out:
        result = launch(JOB, 4, out, ["--slow-ms", str(slow_ms), "--steps", str(steps), "--onset", str(ONSET)]
                        + (["--busy"] if busy else []),
                        env=ENV, timeout_s=120)
        if result.timed_out or result.returncode != 0:
            raise SystemExit(f"the job failed:\n{result.output[-3000:]}")
        return [line for line in result.output.splitlines() if "straggler:" in line], result.elapsed_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10, help="healthy controls (and slow jobs, unless --slow-runs)")
    parser.add_argument("--slow-runs", type=int, default=None, help="slow jobs (default: --runs)")
    parser.add_argument("--healthy-only", action="store_true")
    parser.add_argument("--busy", action="store_true", help="healthy controls spin the CPU: an oversubscribed host")
    args = parser.parse_args()
    started = time.monotonic()
    named = wrong = 0
    slow_runs = 0 if args.healthy_only else (args.runs if args.slow_runs is None else args.slow_runs)
    if slow_runs:
        for i in range(slow_runs):
            lines, took = run(15.0)
            ok = bool(lines) and all(re.search(r"straggler: rank 2 \(", line) for line in lines)
            named += ok
            wrong += any(not re.search(r"straggler: rank 2 \(", line) for line in lines)
            print(f"slow    {i + 1:3d}: {'named' if ok else 'MISSED'} ({took:.0f} s) {lines[:1]}", flush=True)
    false_alarms = 0
    for i in range(args.runs):
        lines, took = run(0.0, args.busy)
        false_alarms += bool(lines)
        print(f"healthy {i + 1:3d}: {'FALSE ALARM ' + lines[0] if lines else 'quiet'} ({took:.0f} s)", flush=True)
    if slow_runs:
        print(f"slow rank named within one window ({WINDOW_S} s) of its onset: {named} of {slow_runs}; "
              f"another rank named: {wrong} runs")
    print(f"healthy controls{' (oversubscribed: compute spins the CPU)' if args.busy else ''} with an alert: "
          f"{false_alarms} of {args.runs}")
    print(f"({time.monotonic() - started:.0f} s; {os.cpu_count()} CPUs)")


if __name__ == "__main__":
    main()
