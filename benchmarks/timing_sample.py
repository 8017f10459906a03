"""The error the timing sample adds (`--read sampled`, analyzers/reading/sample.py), against every entry.

A synthetic job with a slow rank (fixtures/synth.py, fault `straggler`: one rank 3 ms late at every
op) is analysed twice in child processes, reading every entry and reading the sample: time, peak
RSS, the stragglers named, the culprit's cost and lateness, the top costs, and the clock offsets.

    python benchmarks/timing_sample.py --ranks 16384      # the size the contract names
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

CHILD = r"""
import json, resource, sys, time
sys.path.insert(0, {root!r})
t = time.perf_counter()
import analyzers
report = analyzers.load({folder!r}, read={read!r}).report()
print(json.dumps({{"s": time.perf_counter() - t, "gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
                   "stragglers": report["stragglers"], "costs": report["costs"],
                   "offsets": report["clock_offsets_ms"], "verdict": report["verdict"]}}))
"""


def run(folder: str, read: str) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD.format(root=ROOT, folder=folder, read=read)], capture_output=True,
                         text=True, check=True, timeout=3600)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=16384)
    p.add_argument("--entries", type=int, default=2000)
    p.add_argument("--data", default=os.path.join(ROOT, ".bench-data"))
    a = p.parse_args()
    from fixtures import synth

    t = time.perf_counter()
    folder = str(synth.write_folder(os.path.join(a.data, f"flightrec-straggler-{a.ranks}x{a.entries}"), a.ranks,
                                    a.entries, "straggler"))
    print(f"{a.ranks} ranks x {a.entries} entries, one slow rank (rank {synth.Layout.of(a.ranks).culprit}); "
          f"written in {time.perf_counter() - t:.0f} s")
    full, sampled = run(folder, "full"), run(folder, "sampled")
    for name, r in (("every entry", full), ("sample", sampled)):
        names = [s["rank"] for s in r["stragglers"]]
        print(f"{name:>12}: {r['s']:6.1f} s, peak RSS {r['gb']:5.2f} GB, verdict {r['verdict']}, stragglers {names[:5]}")
    if full["stragglers"] and sampled["stragglers"]:
        f, s = full["stragglers"][0], sampled["stragglers"][0]
        for key in ("cost_ms", "cost_pct", "late_ms_when_late", "late_share"):
            if isinstance(f.get(key), (int, float)) and f[key]:
                print(f"  culprit's {key}: {f[key]} every entry, {s[key]} sample: {100 * (s[key] - f[key]) / f[key]:+.1f}%")
        print(f"  culprit's pattern: {f['pattern']} / {s['pattern']}")
    top_f = [c["rank"] for c in full["costs"][:10]]
    top_s = [c["rank"] for c in sampled["costs"][:10]]
    print(f"  top-10 costs: {len(set(top_f) & set(top_s))} ranks in common")
    common = set(full["offsets"]) & set(sampled["offsets"])
    if common:
        diffs = sorted(abs(full["offsets"][r] - sampled["offsets"][r]) for r in common)
        print(f"  clock offsets: median difference {diffs[len(diffs) // 2]:.3f} ms, largest {diffs[-1]:.3f} ms "
              f"({len(common)} ranks)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
