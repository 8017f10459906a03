"""Host time flightrec's device path adds per collective (issue 24): `overhead.py --device cpu-standin | cuda`.

- `cpu-standin`, on any machine: the device path with a stand-in device (benchmarks/standin.py says what
  it models and what not), next to the gloo path, world size 1 (gloo also 2). In each process, blocks
  of calls to the original function and to the wrapped one alternate, so each added figure is a
  difference of blocks run next to each other (as in `overhead.py`'s gloo benchmark).
- `cuda`, on one GPU: world size 1 NCCL, four variants in fresh processes (PyTorch's recorder is set
  by environment variables read at init): (a) no recorder, (b) PyTorch's recorder, (c) flightrec,
  (d) both; rounds of the four interleaved, medians. Bounded: every child has a hard timeout and the
  whole run a budget (`gpu_check.py` calls it with `--json OUT`).

Everything goes through the public wrappers (real `torch.distributed` calls on a process group), so
it times whatever the device path is at run time.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODES = ("sync", "async")
RESULT = "RESULT "


# ---------------------------------------------------------------- in a child: timing blocks


class Unrecorded:
    """Blocks of the original function run as without flightrec: `Work.wait` (which blocking
    collectives call too) unwrapped, and their calls kept out of the recorder's C++-op detection: the
    groups are busy (not scanned) meanwhile and their counters taken as seen afterwards, or the next
    wrapped call would record them all as C++-issued collectives and bill them to flightrec."""

    def __init__(self, groups: Iterable[Any]) -> None:
        import torch.distributed.distributed_c10d as c10d

        self.work_type = c10d.Work
        self.patched = c10d.Work.wait
        self.raw = getattr(self.patched, "__flightrec_wrapped__", self.patched)
        self.groups = [g for g in groups if g is not None]

    def __enter__(self) -> None:
        for group in self.groups:
            group.busy += 1
        self.work_type.wait = self.raw

    def __exit__(self, *exc: object) -> None:
        self.work_type.wait = self.patched
        for group in self.groups:
            seq = group.backend_seq()
            if seq >= 0:
                group.last_pg_seq = seq
            group.busy -= 1


def _loop(fn: Callable[..., Any], tensor: Any, pg: Any, calls: int, mode: str) -> int:
    """ns for `calls` all_reduces: blocking, or async_op=True then wait()."""
    from torch.distributed import ReduceOp

    total = ReduceOp.SUM
    if mode == "sync":
        start = time.perf_counter_ns()
        for _ in range(calls):
            fn(tensor, total, pg)
        return time.perf_counter_ns() - start
    start = time.perf_counter_ns()
    for _ in range(calls):
        fn(tensor, total, pg, True).wait()
    return time.perf_counter_ns() - start


def block(fn: Callable[..., Any], tensor: Any, pg: Any, calls: int, mode: str, unrecorded: Unrecorded | None = None,
          settle: Callable[[], object] | None = None) -> Callable[[], float]:
    """One block of `calls` (µs per call); `settle` runs after it, untimed (CUDA: let the device catch up)."""
    def run() -> float:
        if unrecorded is not None:
            unrecorded.__enter__()
        try:
            took = _loop(fn, tensor, pg, calls, mode)
        finally:
            if unrecorded is not None:
                unrecorded.__exit__()
        if settle is not None:
            settle()
        return took / calls / 1e3
    return run


def interleave(variants: dict[str, Callable[[], float]], blocks: int, warmup: int = 3) -> dict[str, list[float]]:
    """Each variant's per-call µs, one value per block; variants alternate block by block, in reversed
    order every other block, so neighbours share the machine's speed of the moment."""
    names = list(variants)
    for _ in range(warmup):
        for name in names:
            variants[name]()
    out: dict[str, list[float]] = {name: [] for name in names}
    for i in range(blocks):
        for name in names if i % 2 == 0 else reversed(names):
            out[name].append(variants[name]())
    return out


def _die_with_parent() -> None:
    """A child the parent cannot reap (killed by its own caller's timeout) must not live on."""
    try:
        import ctypes
        import signal

        ctypes.CDLL(None).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG; Linux only
    except Exception:  # noqa: BLE001 - elsewhere the parent's timeouts are the bound
        pass


def _arm(dump_dir: str) -> Any:
    import flightrec
    from flightrec.arming import current

    if not flightrec.enable(dir=dump_dir, timeout_s=300):
        raise RuntimeError("flightrec.enable() refused its settings")
    return current().recorder


def _recorder_checks(rec: Any, device: str) -> dict[str, Any]:
    """What the recorder made of the run: device ops timed, nothing billed as a C++ op."""
    deadline = time.monotonic() + 5.0
    while rec.polled and time.monotonic() < deadline:
        time.sleep(0.05)  # the watchdog completes the ops
    rec.device_timing.resolve(rec.entries())  # events are read when a dump reads them: as one would here
    entries = rec.ring.snapshot()
    on_device = [e for e in entries if e.device == device]
    from flightrec.record import fastpath

    return {
        "device_ops": len(on_device),
        "with_device_times": sum(1 for e in on_device if e.t_dev_start_ns is not None and e.t_dev_end_ns is not None),
        "failed": sum(1 for e in entries if e.state == "failed"),
        "cpp_ops": sum(1 for e in entries if e.source == "c++"),
        "timing_disabled": bool(rec.device_timing.disabled),
        "open_events": rec.device_timing.unread(entries),
        "c_hot_path": fastpath.available(), "torch_reader": fastpath.uses_torch_reader(),
    }


def standin_child(rank: int, world_size: int, store: str, blocks: int, calls: int, dump_dir: str,
                  events: str = "c") -> dict[str, Any]:
    """World size 1: gloo path and device path (stand-in) interleaved; world size 2: the gloo path."""
    _die_with_parent()
    sys.path.insert(0, ROOT)
    import torch
    import torch.distributed as dist

    from benchmarks import standin

    rec = _arm(dump_dir)
    standin.register()
    timing = standin.install_events(rec, events)
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=world_size)
    wrapped = dist.all_reduce
    original = wrapped.__flightrec_wrapped__
    paths: dict[str, tuple[Any, Any]] = {"gloo": (dist.group.WORLD, torch.ones(16))}
    if world_size == 1:
        paths["device"] = (dist.new_group(backend=standin.BACKEND), torch.ones(16, device=standin.DEVICE))
        standin.polled_as_nccl(rec, paths["device"][0])
        paths["gloo_on_standin"] = (standin.gloo_path_group(rec), torch.ones(16))
    unrecorded = Unrecorded(rec.groups.get(pg) for pg, _ in paths.values())
    variants = {}
    for path, (pg, tensor) in paths.items():
        for mode in MODES:
            variants[f"{path}_{mode}_base"] = block(original, tensor, pg, calls, mode, unrecorded)
            variants[f"{path}_{mode}_flightrec"] = block(wrapped, tensor, pg, calls, mode)
    out: dict[str, Any] = {"blocks": interleave(variants, blocks)}
    checks = _recorder_checks(rec, standin.DEVICE)
    checks["standin_events"] = standin.events_created(timing)
    checks["standin_event_kind"] = standin.event_kind(timing)
    checks["timing_is_standin"] = rec.device_timing is timing
    out["checks"] = checks
    if world_size == 1:
        out["record_us"] = standin.record_cost_us(timing)
        if not (checks["device_ops"] and checks["with_device_times"] and checks["standin_events"]
                and checks["timing_is_standin"] and not checks["timing_disabled"]):
            raise RuntimeError(f"the device path did not run with stand-in events: {checks}")
    if checks["cpp_ops"]:
        raise RuntimeError(f"{checks['cpp_ops']} baseline calls were recorded as C++ collectives")
    _close(dist)
    return out


def _close(dist: Any) -> None:
    """Destroy the groups while flightrec is armed (its wrapper lets go of them), then disarm. The other
    way round, torch's excepthook (installed at init, chained to flightrec's) keeps the recorder and its
    groups alive until interpreter exit, where gloo's teardown aborts (seen: 4 of 10 world-size-2 pairs)."""
    dist.destroy_process_group()
    import flightrec

    flightrec.disable()


def cuda_child(flightrec_on: bool, torch_fr_on: bool, store: str, blocks: int, calls: int,
               dump_dir: str) -> dict[str, Any]:
    """World size 1 NCCL on GPU 0; with flightrec, its original function's blocks run alongside."""
    _die_with_parent()
    sys.path.insert(0, ROOT)
    import torch
    import torch.distributed as dist

    rec = _arm(dump_dir) if flightrec_on else None
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", init_method="file://" + store, rank=0, world_size=1)
    pg = dist.group.WORLD
    x = torch.ones(16, device=dev)
    fn = dist.all_reduce
    settle = torch.cuda.synchronize  # between blocks, untimed: the host never waits on a full launch queue
    variants = {mode: block(fn, x, pg, calls, mode, settle=settle) for mode in MODES}
    if rec is not None:
        unrecorded = Unrecorded([rec.groups.get(pg)])
        for mode in MODES:
            variants[f"{mode}_original"] = block(fn.__flightrec_wrapped__, x, pg, calls, mode, unrecorded, settle)
    out: dict[str, Any] = {"blocks": interleave(variants, blocks)}
    torch.cuda.synchronize()
    if rec is not None:
        out["checks"] = _recorder_checks(rec, "cuda")
        if out["checks"]["cpp_ops"]:
            raise RuntimeError(f"{out['checks']['cpp_ops']} baseline calls were recorded as C++ collectives")
    if torch_fr_on:  # never read with it off: that aborts the process (flightrec/record/torch_recorder.py)
        try:
            from flightrec.record import (
                torch_compat,  # NCCL's own recorder where this torch has one, else the generic one
            )

            dump = torch_compat.nccl_trace_dump() or torch._C._distributed_c10d._dump_fr_trace_json
            dumped = json.loads(dump(includeCollectives=True))
            out["torch_fr_entries"] = len(dumped.get("entries") or [])
        except Exception as exc:  # noqa: BLE001 - an older torch: say so, the timing stands
            out["torch_fr_entries"] = f"unreadable: {exc!r}"[:200]
    nccl = torch.cuda.nccl.version()
    out["versions"] = {"torch": torch.__version__, "cuda": torch.version.cuda, "gpu": torch.cuda.get_device_name(0),
                       "nccl": ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)}
    if rec is not None:
        _close(dist)
    else:
        dist.destroy_process_group()
    return out


# ---------------------------------------------------------------- in the parent: children, figures


class ChildFailed(RuntimeError):
    pass


def _launch(func: str, args: tuple[Any, ...], env: dict[str, str]) -> subprocess.Popen[str]:
    """A child running `func(*args)` of this module; its result is the last line starting with RESULT."""
    code = f"import sys, json; sys.path.insert(0, {ROOT!r}); from benchmarks.overhead_device import {func}; " \
           f"print({RESULT!r} + json.dumps({func}(*{args!r})))"
    errors = tempfile.TemporaryFile("w+")  # a file, not a pipe: a chatty child never blocks on it
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=errors, text=True,
                            cwd=ROOT)
    proc.errors_file = errors  # type: ignore[attr-defined]
    return proc


def _collect(procs: dict[str, subprocess.Popen[str]], timeout_s: float) -> dict[str, dict[str, Any]]:
    """Each child's result; every child is killed if one fails or the time is up."""
    deadline = time.monotonic() + timeout_s
    out: dict[str, dict[str, Any]] = {}
    try:
        for name, proc in procs.items():
            try:
                stdout, _ = proc.communicate(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                raise ChildFailed(f"{name}: no result within {timeout_s:.0f} s (killed)") from None
            lines = [line for line in stdout.splitlines() if line.startswith(RESULT)]
            if proc.returncode != 0 or not lines:
                errors = proc.errors_file  # type: ignore[attr-defined]
                errors.seek(0)
                raise ChildFailed(f"{name}: exited with {proc.returncode}:\n{errors.read()[-3000:]}")
            out[name] = json.loads(lines[-1][len(RESULT):])
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            proc.errors_file.close()  # type: ignore[attr-defined]
    return out


def _child_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", **extra)
    env.pop("FLIGHTREC", None)  # each child arms flightrec itself, or not at all
    return env


def machine(gpu: str | None = None) -> dict[str, Any]:
    """What ran it: the figures mean nothing without it."""
    model = ""
    try:
        with open("/proc/cpuinfo") as handle:
            model = next((line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")), "")
    except OSError:
        pass
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count() or 0
    import torch

    info: dict[str, Any] = {"cpu": model or platform.processor(), "cpus": usable, "platform": platform.platform(),
                            "python": platform.python_version(), "torch": torch.__version__}
    try:
        info["load_avg"] = [round(v, 2) for v in os.getloadavg()]
    except OSError:
        pass
    if gpu:
        info["gpu"] = gpu
    return info


def _machine_line(info: dict[str, Any]) -> str:
    gpu = f", {info['gpu']}" if "gpu" in info else ""
    load = f", load average {info['load_avg'][0]}" if "load_avg" in info else ""
    return f"machine: {info['cpus']} CPUs ({info['cpu']}){gpu}; {info['platform']}; python {info['python']}, " \
           f"torch {info['torch']}{load}"


def _diffs(blocks: dict[str, list[float]], variant: str, base: str) -> list[float]:
    return [v - b for v, b in zip(blocks[variant], blocks[base], strict=True)]


def _paired(blocks: dict[str, list[float]], variant: str, base: str) -> float:
    """Median of block-by-block differences (the two blocks ran next to each other)."""
    return statistics.median(_diffs(blocks, variant, base))


def _beyond(per_round: list[dict[str, dict[str, Any]]], device: str, gloo: str) -> dict[str, Any]:
    """What the device path adds beyond the gloo path, both timed on the stand-in's call in one process:
    per block pair, (device - its base) - (gloo path - its base), so all four blocks share a moment."""
    per_round_us, pooled = [], []
    for got in per_round:
        blocks = got["ws1"]["blocks"]
        diffs = [d - g for d, g in zip(_diffs(blocks, f"{device}_flightrec", f"{device}_base"),
                                       _diffs(blocks, f"{gloo}_flightrec", f"{gloo}_base"), strict=True)]
        per_round_us.append(statistics.median(diffs))
        pooled += diffs
    return {"us": statistics.median(per_round_us), "uncertainty_us": _uncertainty(pooled), "per_round_us": per_round_us}


def _uncertainty(diffs: list[float]) -> float:
    """Standard error of the median of `diffs`, from their median absolute deviation (robust to the odd
    slow block): what the machine's noise leaves unresolved."""
    if len(diffs) < 2:
        return float("nan")
    center = statistics.median(diffs)
    sigma = 1.4826 * statistics.median(abs(d - center) for d in diffs)
    return 1.2533 * sigma / len(diffs) ** 0.5


def _write_json(path: str | None, payload: dict[str, Any]) -> None:
    if path:
        with open(path, "w") as handle:
            json.dump(payload, handle, indent=1, default=str)


def run_standin(rounds: int, blocks: int, calls: int, json_path: str | None, timeout_s: float = 300.0,
                events: str = "c") -> int:
    """Each round: one process at world size 1 (gloo and stand-in), then a gloo pair at world size 2."""
    per_round: list[dict[str, dict[str, Any]]] = []
    with tempfile.TemporaryDirectory(prefix="flightrec-overhead-") as work:
        try:
            for r in range(rounds):
                procs = {"ws1": _launch("standin_child", (0, 1, f"{work}/s1-{r}", blocks, calls, work, events),
                                         _child_env())}
                got = _collect(procs, timeout_s)
                pair = {f"ws2 rank {rank}": _launch("standin_child", (rank, 2, f"{work}/s2-{r}", blocks, calls,
                                                                      f"{work}/d{rank}", events), _child_env())
                        for rank in (0, 1)}
                got.update(_collect(pair, timeout_s))
                per_round.append(got)
        except ChildFailed as exc:
            print(f"benchmark child failed: {exc}", file=sys.stderr)
            _write_json(json_path, {"device": "cpu-standin", "ok": False, "error": str(exc)[:4000]})
            return 1
    return _report_standin(per_round, rounds, blocks, calls, json_path)


def _report_standin(per_round: list[dict[str, dict[str, Any]]], rounds: int, blocks: int, calls: int,
                    json_path: str | None) -> int:
    med = statistics.median
    # (path, world size) -> the children that measured it
    rows = [("gloo", 1, ["ws1"]), ("gloo", 2, ["ws2 rank 0", "ws2 rank 1"]), ("gloo_on_standin", 1, ["ws1"]),
            ("device", 1, ["ws1"])]
    labels = {"gloo": ("no recorder (gloo, CPU tensors)", "flightrec, gloo path"),
              "gloo_on_standin": ("no recorder (stand-in, CPU tensors)", "flightrec, gloo path on the stand-in"),
              "device": ("no recorder (stand-in backend)", "flightrec, device path (stand-in)")}
    figures: dict[str, Any] = {}
    for path, ws, children in rows:
        for mode in MODES:
            base = med(med(got[c]["blocks"][f"{path}_{mode}_base"]) for got in per_round for c in children)
            added_each = [_paired(got[c]["blocks"], f"{path}_{mode}_flightrec", f"{path}_{mode}_base")
                          for got in per_round for c in children]
            added = med(added_each)
            # the ranks of a pair run in lockstep (same blocks, same noise): one rank's blocks give the spread
            pooled = [d for got in per_round for d in _diffs(got[children[0]]["blocks"], f"{path}_{mode}_flightrec",
                                                             f"{path}_{mode}_base")]
            figures[f"{path}_ws{ws}_{mode}"] = {"base_us": base, "flightrec_us": base + added, "added_us": added,
                                                "uncertainty_us": _uncertainty(pooled),
                                                "ratio": (base + added) / base, "added_per_round_us": added_each}
    first = per_round[0]["ws1"]
    record_us = med(got["ws1"]["record_us"] for got in per_round)
    from benchmarks import standin

    info = machine()
    print(f"device path on CPU with a stand-in device: all_reduce of 16 floats (meta tensors on the stand-in), "
          f"{rounds} rounds x {blocks} blocks x {calls} calls")
    print(_machine_line(info))
    print(standin.WHAT_IT_MODELS)
    print(standin.NOT_MODELLED)
    print(f"{'':36} {'world':>5}  {'sync us':>8} {'ratio':>6}  {'async us':>8} {'ratio':>6}")
    for path, ws, _ in rows:
        base_label, fr_label = labels[path]
        s, a = figures[f"{path}_ws{ws}_sync"], figures[f"{path}_ws{ws}_async"]
        print(f"{base_label:36} {ws:>5}  {s['base_us']:8.2f} {1.0:6.2f}  {a['base_us']:8.2f} {1.0:6.2f}")
        print(f"{fr_label:36} {ws:>5}  {s['flightrec_us']:8.2f} {s['ratio']:6.2f}  {a['flightrec_us']:8.2f} "
              f"{a['ratio']:6.2f}")
    for path, ws, _ in rows:
        for mode in MODES:
            f = figures[f"{path}_ws{ws}_{mode}"]
            unresolved = " -- not resolved: this machine's noise is larger" if not abs(
                f["added_us"]) > 2 * f["uncertainty_us"] else ""
            print(f"added per collective, {path} path, world {ws}, {mode}: {f['added_us']:+.2f} "
                  f"+- {f['uncertainty_us']:.2f} us{unresolved} (per round: "
                  f"{' '.join(f'{v:+.2f}' for v in f['added_per_round_us'])})")
    extra = {m: figures[f"device_ws1_{m}"]["added_us"] - figures[f"gloo_ws1_{m}"]["added_us"] for m in MODES}
    same_call = {m: _beyond(per_round, f"device_{m}", f"gloo_on_standin_{m}") for m in MODES}
    print(f"the device path's cost beyond the gloo path's, world 1: {extra['sync']:+.2f} us sync, "
          f"{extra['async']:+.2f} us async (of which the stand-in's own 2 record() calls, {first['checks']['standin_event_kind']} events: ~{2 * record_us:.2f} us)")
    print("the same, the gloo path timed on the stand-in's call (the same backend call, warm caches: the figure to "
          "read): " + ", ".join(f"{same_call[m]['us']:+.2f} +- {same_call[m]['uncertainty_us']:.2f} us {m}"
                                for m in MODES)
          + " (per round: " + " ".join(f"{v:+.2f}" for m in MODES for v in same_call[m]["per_round_us"]) + ")")
    checks = first["checks"]
    print(f"device path check (round 1): {checks['device_ops']} ops recorded on '{standin.DEVICE}' in the ring, "
          f"{checks['with_device_times']} with device start and end times from {checks['standin_events']} stand-in "
          f"events ({checks['standin_event_kind']}); {checks['failed']} failed, {checks['cpp_ops']} recorded as C++ ops; C hot path "
          f"{'on' if checks['c_hot_path'] else 'off'}, torch reader {'on' if checks['torch_reader'] else 'off'}")
    _write_json(json_path, {"device": "cpu-standin", "ok": True, "machine": info, "rounds": rounds, "blocks": blocks,
                            "calls_per_block": calls, "figures": figures, "device_minus_gloo_us": extra,
                            "device_minus_gloo_same_call_us": same_call,
                            "standin_record_us": record_us, "checks": checks,
                            "standin": {"models": standin.WHAT_IT_MODELS, "not_modelled": standin.NOT_MODELLED}})
    return 0


# (key, label, PyTorch's recorder buffer, flightrec on)
CUDA_VARIANTS = (("a", "no recorder", 0, False), ("b", "PyTorch's recorder", 2000, False),
                 ("c", "flightrec", 0, True), ("d", "flightrec + PyTorch's", 2000, True))


def _cuda_env(buffer: int) -> dict[str, str]:
    # both names: TORCH_FR_BUFFER_SIZE is the newer one, and either may be read
    return _child_env(TORCH_NCCL_TRACE_BUFFER_SIZE=str(buffer), TORCH_FR_BUFFER_SIZE=str(buffer))


def cuda_plan(rounds: int, blocks: int, calls: int, budget_s: float, child_timeout_s: float) -> dict[str, Any]:
    return {"variants": {key: {"label": label, "env": {"TORCH_NCCL_TRACE_BUFFER_SIZE": str(buffer),
                                                       "TORCH_FR_BUFFER_SIZE": str(buffer)}, "flightrec": on}
                         for key, label, buffer, on in CUDA_VARIANTS},
            "rounds": rounds, "blocks": blocks, "calls_per_block": calls, "budget_s": budget_s,
            "child_timeout_s": child_timeout_s,
            "how": "world size 1 NCCL on GPU 0, all_reduce of 16 floats; each variant a fresh process, the four "
                   "interleaved per round (order rotated); torch.cuda.synchronize() between blocks, untimed"}


def run_cuda(rounds: int, blocks: int, calls: int, json_path: str | None, budget_s: float, child_timeout_s: float,
             dry_run: bool) -> int:
    plan = cuda_plan(rounds, blocks, calls, budget_s, child_timeout_s)
    if dry_run:
        print("dry run: nothing started; the plan:")
        for key, variant in plan["variants"].items():
            print(f"  ({key}) {variant['label']}: {variant['env']}, flightrec {'on' if variant['flightrec'] else 'off'}")
        print(f"  {rounds} rounds x {blocks} blocks x {calls} calls, sync and async; budget {budget_s:.0f} s, "
              f"each child at most {child_timeout_s:.0f} s")
        _write_json(json_path, {"device": "cuda", "dry_run": True, **plan})
        return 0
    import torch

    if not torch.cuda.is_available():
        message = f"no CUDA device (torch {torch.__version__}, CUDA {torch.version.cuda}): nothing to measure"
        print(message, file=sys.stderr)
        _write_json(json_path, {"device": "cuda", "ok": False, "error": message})
        return 2
    with tempfile.TemporaryDirectory(prefix="flightrec-overhead-cuda-") as work:
        return _cuda_rounds(rounds, blocks, calls, json_path, budget_s, child_timeout_s, plan, work)


def _cuda_rounds(rounds: int, blocks: int, calls: int, json_path: str | None, budget_s: float, child_timeout_s: float,
                 plan: dict[str, Any], work: str) -> int:
    started = time.monotonic()
    hard_stop = started + budget_s + 30  # the last child may overrun the budget by this much, never more
    runs: dict[str, list[dict[str, Any]]] = {key: [] for key, *_ in CUDA_VARIANTS}
    round_s: list[float] = []
    error = None
    for r in range(rounds):
        if round_s and time.monotonic() + max(round_s) > started + budget_s:
            break  # another round would not fit the budget
        round_start = time.monotonic()
        order = CUDA_VARIANTS[r % 4:] + CUDA_VARIANTS[:r % 4]
        try:
            for key, label, buffer, on in order:
                remaining = hard_stop - time.monotonic()
                if remaining < 10:
                    raise ChildFailed(f"({key}) {label}: not started, the run's budget is spent")
                timeout = min(child_timeout_s, remaining)
                args = (on, buffer > 0, f"{work}/store-{r}-{key}", blocks, calls, work)
                got = _collect({f"({key}) {label}": _launch("cuda_child", args, _cuda_env(buffer))}, timeout)
                runs[key].append(next(iter(got.values())))
                print(f"round {r + 1}, ({key}) {label}: sync {statistics.median(runs[key][-1]['blocks']['sync']):.2f} us",
                      flush=True)
        except ChildFailed as exc:
            error = str(exc)
            break
        round_s.append(time.monotonic() - round_start)
    done = min(len(v) for v in runs.values())
    if done == 0:
        message = f"no complete round of the four variants: {error or 'budget too small'}"
        print(message, file=sys.stderr)
        _write_json(json_path, {"device": "cuda", "ok": False, "error": message, **plan})
        return 1
    return _report_cuda(runs, done, plan, error, time.monotonic() - started, json_path)


def _report_cuda(runs: dict[str, list[dict[str, Any]]], done: int, plan: dict[str, Any], error: str | None,
                 took_s: float, json_path: str | None) -> int:
    med = statistics.median
    # per child: its median block; a figure: the median over complete rounds. An added time: the median of
    # per-round differences (the four variants of a round ran within seconds of one another).
    per_child = {key: {m: [med(run["blocks"][m]) for run in runs[key][:done]] for m in MODES} for key in runs}
    median = {key: {m: med(per_child[key][m]) for m in MODES} for key in runs}
    pairs = {"torch_fr": ("b", "a"), "flightrec": ("c", "a"), "flightrec_on_torch_fr": ("d", "b")}
    per_round = {name: {m: [per_child[k1][m][i] - per_child[k0][m][i] for i in range(done)] for m in MODES}
                 for name, (k1, k0) in pairs.items()}
    added = {name: {m: med(per_round[name][m]) for m in MODES} for name in pairs}
    # inside flightrec's own processes: wrapped vs original, block by block (the gloo benchmark's method)
    added["flightrec_paired"] = {m: med(_paired(run["blocks"], m, f"{m}_original") for run in runs["c"][:done])
                                 for m in MODES}
    # how far the baseline itself moved from one fresh process to the next: differences below it are noise
    spread = {m: max(per_child["a"][m]) - min(per_child["a"][m]) for m in MODES}
    target = {m: {"flightrec_added_us": added["flightrec"][m], "torch_fr_added_us": added["torch_fr"][m],
                  "met": added["flightrec"][m] <= max(added["torch_fr"][m], 0.0),
                  "within_noise": done < 2 or abs(added["flightrec"][m] - added["torch_fr"][m]) <= spread[m]}
              for m in MODES}
    versions = runs["a"][0]["versions"]
    info = machine(versions.get("gpu"))
    labels = {key: label for key, label, *_ in CUDA_VARIANTS}
    print(f"device path on CUDA: world size 1 NCCL, all_reduce of 16 floats; {done} rounds x {plan['blocks']} blocks "
          f"x {plan['calls_per_block']} calls per variant, each variant a fresh process ({took_s:.0f} s)")
    print(_machine_line(info) + f"; CUDA {versions.get('cuda')}, NCCL {versions.get('nccl')}")
    print("host us per collective (median over rounds); added: median of per-round differences against (a)")
    print(f"{'variant':34} {'sync us':>8} {'ratio':>6} {'added':>7}  {'async us':>8} {'ratio':>6} {'added':>7}")
    for key in runs:
        cells = []
        for m in MODES:
            v, base = median[key][m], median["a"][m]
            extra = 0.0 if key == "a" else med(per_child[key][m][i] - per_child["a"][m][i] for i in range(done))
            cells.append(f"{v:8.2f} {v / base:6.2f} {extra:+7.2f}")
        print(f"({key}) {labels[key]:30} " + "  ".join(cells))
    for m in MODES:
        print(f"per round, {m} (us added): flightrec {' '.join(f'{v:+.2f}' for v in per_round['flightrec'][m])} | "
              f"PyTorch's recorder {' '.join(f'{v:+.2f}' for v in per_round['torch_fr'][m])}; "
              + (f"(a) moved by {spread[m]:.2f} us between rounds" if done > 1 else "one round: no spread to judge noise by"))
    print(f"flightrec in its own processes, wrapped vs original block by block: {added['flightrec_paired']['sync']:+.2f} us "
          f"sync, {added['flightrec_paired']['async']:+.2f} us async; on top of PyTorch's recorder (d - b): "
          f"{added['flightrec_on_torch_fr']['sync']:+.2f} sync, {added['flightrec_on_torch_fr']['async']:+.2f} async")
    checks = runs["c"][0].get("checks", {})
    fr_entries = [run.get("torch_fr_entries") for key in ("b", "d") for run in runs[key][:done]]
    print(f"checks: flightrec recorded {checks.get('device_ops')} cuda ops in its ring, {checks.get('with_device_times')} "
          f"with device times; C hot path {'on' if checks.get('c_hot_path') else 'off'}, torch reader "
          f"{'on' if checks.get('torch_reader') else 'off'}; PyTorch's recorder entries in (b)/(d): {fr_entries}")
    if not checks.get("device_ops") or not checks.get("with_device_times"):
        print("warning: flightrec timed no cuda op on the device: (c) and (d) may not be its device path's cost")
    torch_fr_seen = all(isinstance(n, int) and n > 0 for n in fr_entries)
    if not torch_fr_seen:
        print("warning: PyTorch's recorder was not seen recording in (b)/(d): its figure may not be its cost")
    if error:
        print(f"stopped early: {error}")
    verdict = {True: "met", False: "NOT met"}
    print("target: flightrec adds no more host time per collective than PyTorch's recorder -> " + ", ".join(
        f"{m} {verdict[target[m]['met']]} ({target[m]['flightrec_added_us']:+.2f} vs "
        f"{target[m]['torch_fr_added_us']:+.2f} us{', within noise' if target[m]['within_noise'] else ''})"
        for m in MODES))
    _write_json(json_path, {"device": "cuda", "ok": True, "machine": info, "versions": versions, "rounds_done": done,
                            "seconds": round(took_s, 1), **plan, "median_us": median, "per_child_us": per_child,
                            "added_us": added, "added_per_round_us": per_round, "baseline_spread_us": spread,
                            "target": target,
                            "checks": checks, "torch_fr_entries": fr_entries, "torch_fr_seen": torch_fr_seen,
                            "stopped_early": error})
    return 0
