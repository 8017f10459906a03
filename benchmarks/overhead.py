"""Time flightrec adds per collective, against no recorder and against PyTorch's built-in recorder.

world_size=1 gloo all_reduce of 16 floats, sync and async. flightrec's cost is measured inside one
process by interleaving blocks of calls to the original and the wrapped function. PyTorch's recorder
is switched by TORCH_FR_BUFFER_SIZE (2000 vs 0), which only takes effect per process, so each round
runs those two processes side by side, each pinned to its own CPU (same thread placement) and paced
block by block (same moment), then flightrec alone unpinned. Prints medians in microseconds and ratios (docs/overhead.md).

    python benchmarks/overhead.py [--rounds 6] [--block 400] [--blocks 40]
    python benchmarks/overhead.py --device cpu-standin|cuda [--json OUT] [--quick] [--dry-run] [--standin-events c|python]   # the device path
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def measure(block: int, blocks: int, paced: bool = False) -> dict[str, list[float]]:
    """Runs inside a child: per-call µs of each variant, one value per block. `paced`: before each
    block, say "ready" and wait for the parent's go, so that two children side by side run their
    blocks of the same variant at the same moment (the parent pairs them)."""
    sys.path.insert(0, ROOT)
    import torch
    import torch.distributed as dist

    import flightrec

    assert flightrec.enable(dir=os.path.join(ROOT, ".bench-dumps"), timeout_s=300)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    wrapped = dist.all_reduce
    original = wrapped.__flightrec_wrapped__
    t = torch.ones(16)

    from flightrec.arming import current
    from flightrec.record.ops import SPEC_BY_API
    from flightrec.record.wrapping import leaf_wrapper

    group = current().recorder.groups.get(dist.group.WORLD)

    work_type = dist.distributed_c10d.Work
    patched_wait = work_type.wait
    raw_wait = getattr(patched_wait, "__flightrec_wrapped__", patched_wait)

    def unrecorded(fn):  # noqa: ANN001, ANN202
        """The baseline runs as without flightrec: Work.wait (which PyTorch's blocking collectives
        call too) unwrapped, and its calls kept out of the recorder's C++-op detection (they still
        advance the group's backend counter: without this, the next wrapped call would record them
        all as C++-issued collectives, as it must in a real job, and bill their cost to flightrec)."""
        def run(body):  # noqa: ANN001, ANN202
            if fn is not original:
                return body()
            group.busy += 1  # the watchdog does not scan a busy group
            work_type.wait = raw_wait
            try:
                return body()
            finally:
                work_type.wait = patched_wait
                group.last_pg_seq = group.backend_seq()
                group.busy -= 1
        return run

    def sync_loop(fn):  # noqa: ANN001
        def body():  # noqa: ANN202
            start = time.perf_counter_ns()
            for _ in range(block):
                fn(t)
            return (time.perf_counter_ns() - start) / block / 1e3
        return unrecorded(fn)(body)

    def async_loop(fn):  # noqa: ANN001
        def body():  # noqa: ANN202
            start = time.perf_counter_ns()
            for _ in range(block):
                fn(t, async_op=True).wait()
            return (time.perf_counter_ns() - start) / block / 1e3
        return unrecorded(fn)(body)

    def no_op(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        return None

    # Its own API name: the no-op never moves the backend counter, and the recorder learns each
    # API's counter step (0 here, 1 for the real all_reduce).
    spec = dataclasses.replace(SPEC_BY_API["all_reduce"], api="all_reduce_no_op")
    bookkeeping = leaf_wrapper(current().recorder, spec.bind_positions(original), no_op)

    has_c = hasattr(wrapped, "enabled")  # the C hot path (flightrec/record/_fastpath.c) is in use

    def python_only(loop, fn):  # noqa: ANN001, ANN202
        """The same wrappers with their C hot path off: every call and wait takes the Python wrapper."""
        def run(f):  # noqa: ANN001, ANN202
            fn.enabled = patched_wait.enabled = 0
            try:
                return loop(f)
            finally:
                fn.enabled = patched_wait.enabled = 1
        return run

    from flightrec.record import cpp_reader, fastpath

    has_peek = has_c and cpp_reader.fastpath_capsule() is not None  # flightrec build-ext was run for this torch

    def without_peek(loop, fn):  # noqa: ANN001, ANN202
        """The C hot path reading tensors and the counter through torch's Python bindings instead."""
        def run(f):  # noqa: ANN001, ANN202
            fastpath.use_torch_reader(False)
            fast_reader, group.read_seq = group.read_seq, group.pg._get_sequence_number_for_group
            try:
                return loop(f)
            finally:
                group.read_seq = fast_reader
                fastpath.use_torch_reader(True)
        return run

    for _ in range(5):  # warm up
        sync_loop(original), sync_loop(wrapped), async_loop(original), async_loop(wrapped)
    out: dict[str, list[float]] = {}
    for i in range(blocks):
        order = [("sync_base", sync_loop, original), ("sync_flightrec", sync_loop, wrapped),
                 ("async_base", async_loop, original), ("async_flightrec", async_loop, wrapped),
                 ("bookkeeping", sync_loop, bookkeeping)]
        if has_c:
            order += [("sync_python", python_only(sync_loop, wrapped), wrapped),
                      ("async_python", python_only(async_loop, wrapped), wrapped),
                      ("bookkeeping_python", python_only(sync_loop, bookkeeping), bookkeeping)]
        if has_peek:
            order += [("sync_nopeek", without_peek(sync_loop, wrapped), wrapped),
                      ("async_nopeek", without_peek(async_loop, wrapped), wrapped),
                      ("bookkeeping_nopeek", without_peek(sync_loop, bookkeeping), bookkeeping)]
        if i % 2:
            order.reverse()
        for name, loop, fn in order:
            if paced:
                print("ready", flush=True)
                sys.stdin.readline()
            out.setdefault(name, []).append(loop(fn))
    recorder = current().recorder
    c_plus_plus = sum(1 for e in recorder.ring.snapshot() if e.source == "c++")
    assert c_plus_plus == 0, f"{c_plus_plus} baseline calls were recorded as C++ collectives"
    flightrec.disable()
    dist.destroy_process_group()
    return out


def _launch(fr_buffer: int, block: int, blocks: int, core: int | None, paced: bool = False) -> subprocess.Popen[str]:
    """A child measuring with PyTorch's recorder on (`fr_buffer` entries) or off, pinned to `core`."""
    env = dict(os.environ, TORCH_FR_BUFFER_SIZE=str(fr_buffer), OMP_NUM_THREADS="1")
    env.pop("FLIGHTREC", None)
    pin = f"import os; os.sched_setaffinity(0, {{{core}}}); " if core is not None else ""
    code = f"{pin}import sys, json; sys.path.insert(0, {ROOT!r}); from benchmarks.overhead import measure; " \
           f"print(json.dumps(measure({block}, {blocks}, {paced})))"
    return subprocess.Popen([sys.executable, "-c", code], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=tempfile.TemporaryFile("w+"), text=True)


def _failed(proc: subprocess.Popen[str]) -> RuntimeError:
    proc.kill()
    proc.wait()
    proc.stderr.seek(0)  # type: ignore[union-attr]
    return RuntimeError(f"benchmark child failed ({proc.returncode}):\n{proc.stderr.read()[-2000:]}")  # type: ignore[union-attr]


def _collect(proc: subprocess.Popen[str]) -> dict[str, list[float]]:
    try:
        out, _ = proc.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    if proc.returncode != 0:
        raise _failed(proc)
    return json.loads(out.strip().splitlines()[-1])


def _collect_paced(procs: dict[str, subprocess.Popen[str]]) -> dict[str, dict[str, list[float]]]:
    """Let paced children run each block together: go when every one of them is ready."""
    results: dict[str, dict[str, list[float]]] = {}
    while len(results) < len(procs):
        ready = []
        for name, proc in procs.items():
            if name in results:
                continue
            line = proc.stdout.readline()  # type: ignore[union-attr]
            if not line:
                raise _failed(proc)
            if line.strip() == "ready":
                ready.append(proc)
            else:
                results[name] = json.loads(line)
                proc.wait(timeout=60)
        for proc in ready:
            proc.stdin.write("\n")  # type: ignore[union-attr]
            proc.stdin.flush()  # type: ignore[union-attr]
    return results


def _cores() -> list[int] | None:
    """Two CPUs to pin the side-by-side children to, or None where that is not possible."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return None
    return cpus[:2] if len(cpus) >= 2 else None


def run_round(round_: int, block: int, blocks: int, cores: list[int] | None) -> dict[str, dict[str, list[float]]]:
    """Three children: PyTorch's recorder off ("off") and on ("on") side by side, one per CPU (swapped
    every round), paced so that each block runs in both at the same moment, so that the machine's
    speed from one moment to the next is the same for both; then one with it
    off, alone and unpinned ("alone"), where gloo's worker thread can run on the other CPU. With
    fewer than two CPUs, "off" and "on" run one after the other, in alternating order."""
    settings = ("off", "on") if round_ % 2 == 0 else ("on", "off")
    buffer = {"off": 0, "on": 2000}
    if cores is None:
        out = {name: _collect(_launch(buffer[name], block, blocks, None)) for name in settings}
        out["alone"] = out["off"]
        return out
    procs = {name: _launch(buffer[name], block, blocks, core, paced=True)
             for name, core in zip(settings, cores, strict=True)}
    out = _collect_paced(procs)
    out["alone"] = _collect(_launch(0, block, blocks, None))
    return out


def _paired(result: dict[str, list[float]], variant: str, base: str) -> float:
    """Median of per-block differences: the two blocks ran next to each other in one process."""
    return statistics.median([w - b for w, b in zip(result[variant], result[base], strict=True)])


def _device_main(args: argparse.Namespace) -> int:
    """`--device`: the device path's host cost (benchmarks/overhead_device.py)."""
    sys.path.insert(0, ROOT)
    from benchmarks import overhead_device

    quick = (1, 4, 50) if args.quick else (4, 20, 200 if args.device == "cpu-standin" else 100)
    rounds, blocks, block = (given or default for given, default in zip((args.rounds, args.blocks, args.block), quick,
                                                                         strict=True))
    if args.device == "cpu-standin":
        if args.dry_run:
            print("--dry-run goes with --device cuda", file=sys.stderr)
            return 2
        return overhead_device.run_standin(rounds, blocks, block, args.json, events=args.standin_events)
    return overhead_device.run_cuda(rounds, blocks, block, args.json, args.budget_s, args.child_timeout_s, args.dry_run)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=None, help="default 6 (gloo), 4 (--device)")
    parser.add_argument("--block", type=int, default=None, help="calls per block; default 400 (gloo), 200 / 100 (--device)")
    parser.add_argument("--blocks", type=int, default=None, help="blocks per process; default 40 (gloo), 20 (--device)")
    parser.add_argument("--device", choices=("cpu-standin", "cuda"), default=None,
                        help="the device path's host cost: on CPU with a stand-in device, or on one GPU against "
                             "PyTorch's recorder on NCCL (benchmarks/overhead_device.py)")
    parser.add_argument("--json", default=None, metavar="OUT", help="with --device: write the figures to OUT")
    parser.add_argument("--standin-events", choices=("c", "python"), default="c",
                        help="with --device cpu-standin: the stand-in's events, C methods as torch.Event's (default) "
                             "or Python ones (as before 2026-12-07 night)")
    parser.add_argument("--quick", action="store_true", help="with --device: a tiny run (tests; figures unreliable)")
    parser.add_argument("--dry-run", action="store_true", help="with --device cuda: print the plan, start nothing")
    parser.add_argument("--budget-s", type=float, default=170.0,
                        help="with --device cuda: start no round after this many seconds (default 170)")
    parser.add_argument("--child-timeout-s", type=float, default=90.0,
                        help="with --device cuda: kill a variant's process after this many seconds (default 90)")
    args = parser.parse_args()
    for name in ("rounds", "block", "blocks"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1, not {getattr(args, name)}")
    for name in ("budget_s", "child_timeout_s"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive, not {getattr(args, name)}")
    if args.device is not None:
        sys.exit(_device_main(args))
    if args.json or args.quick or args.dry_run:
        parser.error("--json, --quick and --dry-run go with --device")
    args.rounds, args.block, args.blocks = args.rounds or 6, args.block or 400, args.blocks or 40
    cores = _cores()
    rounds = [run_round(r, args.block, args.blocks, cores) for r in range(args.rounds)]
    modes = ("sync", "async")

    def per_round(child: str, variant: str, m: str) -> list[float]:
        return [_paired(r[child], f"{m}_{variant}", f"{m}_base") for r in rounds]

    def median_base(child: str, m: str) -> list[float]:
        return [statistics.median(r[child][f"{m}_base"]) for r in rounds]

    # flightrec: paired blocks inside one process; PyTorch's recorder: the two side-by-side baselines
    flightrec = {m: per_round("off", "flightrec", m) for m in modes}
    alone = {m: per_round("alone", "flightrec", m) for m in modes}
    on_top = {m: per_round("on", "flightrec", m) for m in modes}
    # PyTorch's recorder: block by block, the "on" child's baseline minus the "off" child's, run at the
    # same moment (paced); the median per round
    torch_fr = {m: [statistics.median([on - off for on, off in zip(r["on"][f"{m}_base"], r["off"][f"{m}_base"], strict=True)])
                    for r in rounds] for m in modes}
    med = statistics.median
    how = f"side by side, pinned to CPUs {cores}" if cores else "one after the other (fewer than 2 CPUs to pin to)"
    print(f"all_reduce of 16 floats, world_size=1 gloo; {args.rounds} rounds x {args.blocks} blocks x {args.block} calls")
    print(f"A: PyTorch's recorder off and on in two processes {how}; B: flightrec alone, unpinned")
    print(f"{'':8} {'A baseline us':>14} {'A +flightrec':>13} {'A +torch FR':>12} {'A flightrec/torchFR':>20} "
          f"{'B baseline us':>14} {'B +flightrec':>13}")
    for m in modes:
        added, torch_added = med(flightrec[m]), med(torch_fr[m])
        ratio = f"{added / torch_added:.2f}" if torch_added > 0 else "inf"
        print(f"{m:8} {med(median_base('off', m)):14.2f} {added:13.2f} {torch_added:12.2f} {ratio:>20} "
              f"{med(median_base('alone', m)):14.2f} {med(alone[m]):13.2f}")
    for m in modes:
        print(f"per round, {m} (us): A flightrec " + " ".join(f"{d:.1f}" for d in flightrec[m])
              + " | A PyTorch's recorder " + " ".join(f"{d:.1f}" for d in torch_fr[m])
              + " | A flightrec on top of PyTorch's " + " ".join(f"{d:.1f}" for d in on_top[m])
              + " | B flightrec " + " ".join(f"{d:.1f}" for d in alone[m]))
    wins = sum(f < t for f, t in zip(flightrec["sync"], torch_fr["sync"], strict=True))
    print(f"rounds where flightrec added less than PyTorch's recorder (A, sync): {wins} of {args.rounds}")
    own = [r["alone"] for r in rounds]
    print(f"flightrec's bookkeeping alone (its wrapper around a no-op, hot loop, B): "
          f"{med(v for r in own for v in r['bookkeeping']):.2f} us per call")
    if "sync_python" in own[0]:
        python = {m: med(per_round("alone", "python", m)) for m in modes}
        print(f"the same wrapper with its C hot path off (pure Python), B: +{python['sync']:.2f} us sync, "
              f"+{python['async']:.2f} us async, bookkeeping {med(v for r in own for v in r['bookkeeping_python']):.2f} us")
    else:
        print("the C hot path (flightrec/record/_fastpath.c) is not in use: these are the pure-Python figures")
    if "sync_nopeek" in own[0]:
        nopeek = {m: med(per_round("off", "nopeek", m)) for m in modes}
        print(f"the C hot path without the torch reader (flightrec build-ext), A: +{nopeek['sync']:.2f} us sync, "
              f"+{nopeek['async']:.2f} us async, bookkeeping (B) {med(v for r in own for v in r['bookkeeping_nopeek']):.2f} us")
    else:
        print("the torch reader (flightrec build-ext) is not built for this torch: tensors and counters are read "
              "through torch's Python bindings")
    verdict = {True: "met", False: "NOT met"}
    print(f"target: sync added <= 5.00 us -> A {verdict[med(flightrec['sync']) <= 5.0]}, "
          f"B {verdict[med(alone['sync']) <= 5.0]}; no more than PyTorch's recorder adds (A) -> sync "
          f"{verdict[med(flightrec['sync']) <= max(med(torch_fr['sync']), 0)]}, async "
          f"{verdict[med(flightrec['async']) <= max(med(torch_fr['async']), 0)]}")


if __name__ == "__main__":
    main()
