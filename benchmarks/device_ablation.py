"""Where flightrec's host time per device collective goes, on one GPU (issue 24, 26): run it when a GPU
is lent, after `gpu_check.py --build` (so the C parts are built for that machine).

    python benchmarks/device_ablation.py [--json OUT]            # ~1-2 minutes on one GPU

World size 1 NCCL, all_reduce of 16 floats, blocks of 200 calls with `torch.cuda.synchronize()` between
blocks (untimed). Each variant runs in a fresh process: blocks of the original calls, then flightrec
armed and blocks of the wrapped calls, then disarmed and the original again (the figure is wrapped
minus the mean of the two original medians, and their spread says how far the machine moved):

- `primitives`: what each device call the path makes costs from Python, no recorder (capture query,
  event record from a pool, event creation, query, elapsed_time, Work.is_completed, a Work's wrap).
- `full`: flightrec as armed by `FLIGHTREC=1`.
- `no_events`: device events off (`device_timing.disabled`): the capture query stays.
- `no_watchdog`: the watchdog asleep during the blocks (`poll_s` 1 h): what the training thread pays
  alone; then the watchdog's work for those ops is timed by hand (`poll_works` + `resolve`, per op).
- `no_watchdog_no_events`: both.
- `python`: `FLIGHTREC_FASTPATH=0` (the Python wrapper), and a cProfile of it by function.

Without a GPU (`--cpu`) the same runs on gloo with CPU tensors, to check the script itself.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VARIANTS = ("primitives", "full", "no_events", "no_watchdog", "no_watchdog_no_events", "python")

CHILD = r'''
import cProfile, io, json, os, pstats, statistics, sys, tempfile, time
import torch, torch.distributed as dist

variant, cpu = sys.argv[1], sys.argv[2] == "cpu"
BLOCKS, CALLS = 15, 200
store = tempfile.mktemp(prefix="ablation-store-")
dist.init_process_group("gloo" if cpu else "nccl", init_method="file://" + store, rank=0, world_size=1)
dev = torch.device("cpu") if cpu else torch.device("cuda", 0)
if not cpu:
    torch.cuda.set_device(dev)
x = torch.ones(16, device=dev)
sync_device = (lambda: None) if cpu else torch.cuda.synchronize
out = {}

def per_call_us(fn, blocks=BLOCKS, calls=CALLS):
    times = []
    for _ in range(blocks):
        sync_device()
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter_ns() - t0) / calls / 1e3)
    sync_device()
    return statistics.median(times)

def blocking():
    dist.all_reduce(x)

def waited():
    dist.all_reduce(x, async_op=True).wait()

for _ in range(3):
    per_call_us(blocking, 2)
    per_call_us(waited, 2)
before = {"sync": per_call_us(blocking), "async": per_call_us(waited)}

if variant == "primitives":
    prim = {}
    if not cpu:
        check = torch.cuda.is_current_stream_capturing
        prim["is_current_stream_capturing"] = per_call_us(check)
        prim["torch._C._cuda_isCurrentStreamCapturing"] = per_call_us(torch._C._cuda_isCurrentStreamCapturing)
        pool = [torch.Event(device="cuda", enable_timing=True) for _ in range(BLOCKS * CALLS + 10)]
        for e in pool:
            e.record()
        sync_device()
        it = iter(pool)
        prim["torch.Event.record (pooled)"] = per_call_us(lambda: next(it).record())
        cpool = [torch.cuda.Event(enable_timing=True) for _ in range(BLOCKS * CALLS + 10)]
        for e in cpool:
            e.record()
        sync_device()
        it2 = iter(cpool)
        prim["torch.cuda.Event.record (pooled)"] = per_call_us(lambda: next(it2).record())
        prim["torch.Event() created"] = per_call_us(lambda: torch.Event(device="cuda", enable_timing=True), 5)
        fresh = [torch.Event(device="cuda", enable_timing=True) for _ in range(5 * CALLS + 10)]
        it3 = iter(fresh)
        prim["torch.Event first record"] = per_call_us(lambda: next(it3).record(), 5)
        a, b = pool[0], pool[1]
        prim["event.query"] = per_call_us(a.query)
        prim["event.elapsed_time"] = per_call_us(lambda: a.elapsed_time(b))
        prim["torch.cuda.current_stream"] = per_call_us(torch.cuda.current_stream)
    w = dist.all_reduce(x, async_op=True)
    w.wait()
    prim["work.is_completed"] = per_call_us(w.is_completed)
    prim["all_reduce(async_op=True), no wait"] = per_call_us(lambda: dist.all_reduce(x, async_op=True))
    prim["time.monotonic_ns"] = per_call_us(time.monotonic_ns)
    out["primitives_us"] = prim
    out["before_us"] = before
    print("RESULT " + json.dumps(out))
    sys.exit(0)

import flightrec
import flightrec.arming as control
from flightrec.record import fastpath, cpp_reader

options = {"dir": tempfile.mkdtemp(prefix="ablation-dumps-"), "timeout_s": 300}
if variant.startswith("no_watchdog"):
    options["poll_s"] = 3600.0
flightrec.enable(**options)
rec = control.current().recorder
if variant.endswith("no_events"):
    rec.device_timing.disabled = True
for _ in range(2):
    per_call_us(blocking, 2)
    per_call_us(waited, 2)
if variant.startswith("no_watchdog"):  # what the watchdog would have done for the warm-up's ops
    rec.poll_works(); rec.device_timing.resolve(rec.entries())
wrapped = {}
watchdog = {}
for mode, fn in (("sync", blocking), ("async", waited)):
    wrapped[mode] = per_call_us(fn)
    if variant.startswith("no_watchdog"):
        sync_device()
        pending = rec.device_timing.unread(rec.entries())
        tables = len(rec.by_work) + len(rec.polled)
        t0 = time.perf_counter_ns()
        rec.poll_works()
        t1 = time.perf_counter_ns()
        resolved = rec.device_timing.resolve(rec.entries())
        t2 = time.perf_counter_ns()
        ops = BLOCKS * CALLS
        watchdog[mode] = {"ops": ops, "open_events": pending, "polled_works": tables, "resolved": resolved,
                          "poll_works_us_per_op": (t1 - t0) / ops / 1e3, "resolve_us_per_op": (t2 - t1) / ops / 1e3}
if variant == "python":
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(2000):
        blocking()
    profile.disable()
    sync_device()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(22)
    out["profile_sync"] = text.getvalue()[-6000:]
out["paths"] = {"c_hot_path": fastpath.available(), "torch_reader": cpp_reader.load() is not None,
                "device_ops_timed": sum(1 for e in rec.entries() if e.t_dev_start_ns is not None)}
flightrec.disable()
after = {"sync": per_call_us(blocking), "async": per_call_us(waited)}
out.update(before_us=before, wrapped_us=wrapped, after_us=after, watchdog=watchdog,
           added_us={m: wrapped[m] - (before[m] + after[m]) / 2 for m in wrapped},
           drift_us={m: after[m] - before[m] for m in wrapped})
print("RESULT " + json.dumps(out))
dist.destroy_process_group()
'''


def run_child(variant: str, cpu: bool, timeout: float) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    env.pop("FLIGHTREC", None)
    if variant == "python":
        env["FLIGHTREC_FASTPATH"] = "0"
    start = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-c", CHILD, variant, "cpu" if cpu else "cuda"], capture_output=True,
                              text=True, env=env, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            got = json.loads(line[len("RESULT "):])
            got["seconds"] = round(time.monotonic() - start, 1)
            return got
    return {"error": f"rc {done.returncode}: {(done.stdout + done.stderr)[-3000:]}"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", default=None, help="write the results here")
    parser.add_argument("--cpu", action="store_true", help="gloo on CPU tensors: checks the script, not the device")
    parser.add_argument("--only", default=",".join(VARIANTS))
    parser.add_argument("--child-timeout-s", type=float, default=90.0)
    a = parser.parse_args()
    if not a.cpu:
        import torch

        if not torch.cuda.is_available():
            print("no CUDA device (use --cpu to check the script)", file=sys.stderr)
            return 2
    results = {}
    for variant in a.only.split(","):
        results[variant] = got = run_child(variant, a.cpu, a.child_timeout_s)
        if "error" in got:
            print(f"{variant}: {got['error']}", flush=True)
        elif variant == "primitives":
            print(f"primitives (us per call; all_reduce sync {got['before_us']['sync']:.2f}, async+wait "
                  f"{got['before_us']['async']:.2f}):", flush=True)
            for name, us in got["primitives_us"].items():
                print(f"  {name:40s} {us:8.2f}")
        else:
            added, drift = got["added_us"], got["drift_us"]
            print(f"{variant:24s} added sync {added['sync']:+7.2f} us, async {added['async']:+7.2f} us "
                  f"(original moved {drift['sync']:+.2f} / {drift['async']:+.2f}); {got['paths']}", flush=True)
            for mode, w in got.get("watchdog", {}).items():
                print(f"  watchdog by hand after {w['ops']} {mode} ops: poll_works {w['poll_works_us_per_op']:.2f} us/op, "
                      f"resolve {w['resolve_us_per_op']:.2f} us/op ({w['open_events']} open events, "
                      f"{w['polled_works']} works polled, {w['resolved']} resolved)")
            if "profile_sync" in got:
                print(got["profile_sync"])
    if a.json:
        with open(a.json, "w") as handle:
            json.dump(results, handle, indent=1)
    return 0 if all("error" not in r for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
