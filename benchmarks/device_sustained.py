"""Back-to-back device ops on the stand-in (benchmarks/standin.py): what the device path costs when ops
come faster than the watchdog's tick, and where it goes (issue 38).

    python benchmarks/device_sustained.py [--ops 100000] [--rounds 2] [--json OUT]   # ~1 minute on 2 cores

`overhead.py --device cpu-standin` times blocks of 200 calls between other variants' blocks, so the
watchdog catches up in between. Here one process issues `--ops` all_reduces of a `meta` tensor on the
stand-in backend without a pause (after a warm-up of a fifth as many), the way a loop of tiny
collectives would on NCCL, and the figure is µs per call. Variants, each in a fresh process, rounds
alternating: `off` (no recorder), `flightrec` (as `FLIGHTREC=1` arms it, 0.5 s watchdog tick; the
stand-in's Works polled in issue order, as NCCL's and HCCL's are: `standin.polled_as_nccl`), `op_by_op`
(the same, each Work polled on its own, as a custom backend's are), `no_gc` (flightrec, Python's cyclic GC off: what the objects the device path keeps alive until the
watchdog's next poll cost in collections), `watchdog_asleep` (flightrec, the watchdog ticking once
an hour and no catch-up when many ops wait to be polled (`Recorder.poll_soon` unplugged): the training
thread's own share; the ops are never polled, so their records pile up, which costs too). Each line
gives the cyclic GC's collections per generation during the timed ops.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VARIANTS = ("off", "flightrec", "op_by_op", "no_gc", "watchdog_asleep")

CHILD = r'''
import gc, json, os, sys, time
sys.path.insert(0, sys.argv[3])
import torch, torch.distributed as dist
from benchmarks import standin
variant, ops, work = sys.argv[1], int(sys.argv[2]), sys.argv[4]
standin.register()
if variant != "off":
    import flightrec
    from flightrec.arming import current
    extra = {"poll_s": 3600.0} if variant == "watchdog_asleep" else {}
    assert flightrec.enable(dir=os.path.join(work, "dumps"), timeout_s=300, **extra)
    standin.install_events(current().recorder)
    if variant == "watchdog_asleep":
        current().recorder.poll_soon = None  # no catch-up of the ops waiting to be polled either
if variant == "no_gc":
    gc.disable()
dist.init_process_group("gloo", init_method="file://" + os.path.join(work, "store"), rank=0, world_size=1)
group = dist.new_group(backend=standin.BACKEND)
if variant not in ("off", "op_by_op"):
    standin.polled_as_nccl(current().recorder, group)
tensor = torch.ones(16, device=standin.DEVICE)
all_reduce = dist.all_reduce
for _ in range(ops // 5):
    all_reduce(tensor, group=group)
before = [g["collections"] for g in gc.get_stats()]
start = time.perf_counter()
for _ in range(ops):
    all_reduce(tensor, group=group)
took = time.perf_counter() - start
collections = [g["collections"] - b for g, b in zip(gc.get_stats(), before)]
recorded = sum(1 for e in current().recorder.ring.snapshot() if e.device == standin.DEVICE) if variant != "off" else 0
dist.destroy_process_group()
print("RESULT " + json.dumps({"us_per_op": took / ops * 1e6, "gc_collections": collections, "device_ops_in_ring": recorded}),
      flush=True)
if variant != "off":
    flightrec.disable()
'''


def run_child(variant: str, ops: int, timeout_s: float, work: str) -> dict[str, object]:
    """One variant in a fresh process; its store and dumps under `work` (a folder of its own)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLIGHTREC", "TORCHELASTIC"))}
    env["OMP_NUM_THREADS"] = "1"
    os.makedirs(work)
    out = subprocess.run([sys.executable, "-c", CHILD, variant, str(ops), ROOT, work], capture_output=True, text=True,
                         timeout=timeout_s, env=env)
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])  # type: ignore[no-any-return]
    raise RuntimeError(f"{variant} child failed (rc {out.returncode}): {out.stderr[-2000:]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--timeout-s", type=float, default=180.0, help="per child")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    got: dict[str, list[dict[str, object]]] = {v: [] for v in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="flightrec-sustained-") as work:
        for r in range(args.rounds):
            for variant in VARIANTS if r % 2 == 0 else tuple(reversed(VARIANTS)):
                got[variant].append(run_child(variant, args.ops, args.timeout_s, os.path.join(work, f"{variant}-{r}")))
    unrecorded = [v for v in VARIANTS[1:] for x in got[v] if not x["device_ops_in_ring"]]
    if unrecorded:
        print(f"flightrec recorded no device op in: {sorted(set(unrecorded))}", file=sys.stderr)
        return 1
    base = statistics.median(float(x["us_per_op"]) for x in got["off"])  # type: ignore[arg-type]
    print(f"{args.ops} back-to-back all_reduces of a meta tensor on the stand-in backend, {args.rounds} rounds "
          "(median; each variant in a fresh process)")
    print(f"{'variant':18} {'us/op':>7} {'added':>7}  gc collections (gen 0/1/2) per round")
    figures = {}
    for variant in VARIANTS:
        us = statistics.median(float(x["us_per_op"]) for x in got[variant])  # type: ignore[arg-type]
        figures[variant] = {"us_per_op": us, "added_us": us - base, "rounds": got[variant]}
        gcs = "  ".join("/".join(str(c) for c in x["gc_collections"]) for x in got[variant])  # type: ignore[attr-defined]
        print(f"{variant:18} {us:7.2f} {us - base:+7.2f}  {gcs}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"ops": args.ops, "rounds": args.rounds, "figures": figures}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
