"""The device path on a real GPU, in one run of ~4-5 minutes: run it whenever a GPU is lent.

    python benchmarks/gpu_check.py --build --out DIR   # JSON results in DIR/gpu_check.json, exit 1 if a check failed

`--build` first compiles the C hot path and the torch reader in the checked-out tree for this Python and
torch (a device machine's Python is rarely the one the tree was built with), so the device ops take the
path an installed flightrec takes; the `nccl` check says which path took them.

Checks, each in its own bounded subprocess:
- `nccl`: world size 1 on NCCL: a blocking all_reduce queued behind ~1 s of device work returns at once
  on the host and must read as not completed until the device ran it, then completed with device times
  that cover the wait; an async all_reduce's end is timed where the current stream waits for it; the
  watchdog writes a `timeout` dump for an op the device has not run; a CUDA-graph capture and replay of
  an all_reduce with the recorder on works as without it, and the captured op is counted, not awaited.
- `nccl_python`: the same with `FLIGHTREC_FASTPATH=0` (the Python wrapper, the reference path).
- `gloo_cuda`: a 3-rank gloo job on CUDA tensors sharing the one GPU (NCCL refuses two ranks on one
  device) where rank 1 stalls: every rank dumps, device times are there and ordered, and the analysis
  names rank 1.
- `gloo_cuda_slow`: the same 3 ranks, no stall: rank 2 queues 4x the others' device work before each of
  40 steps, dumped at exit: the analysis, timing the ops by their device events, names rank 2 slow.
- `nccl_2proc`: with 2+ GPUs, the same stall on a 2-rank NCCL job, a GPU per rank (PyTorch's NCCL
  recorder on, `TORCH_NCCL_TRACE_BUFFER_SIZE=2000`): both ranks dump and the analysis names rank 1.
  Skipped (and said so) with one GPU.
- `overhead`: `benchmarks/overhead.py --device cuda` (host cost per collective against PyTorch's recorder).
- `ablation`: `benchmarks/device_ablation.py` (where that host cost goes; ~1 minute).

The recorder is armed as an installed package arms it (FLIGHTREC=1 and the start-up hook), here through
a `sitecustomize` on PYTHONPATH, so the checked-out tree needs no install.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

NCCL_CHECK = r'''
import json, os, sys, time
import torch, torch.distributed as dist
import flightrec, flightrec.arming as control

out = sys.argv[1]
results = {}
flightrec.enable(dir=os.path.join(out, "nccl-dumps"), timeout_s=2.0)
dist.init_process_group("nccl", init_method="file://" + os.path.join(out, "store"), rank=0, world_size=1)
rec = control.current().recorder
dev = torch.device("cuda", 0)
torch.cuda.set_device(dev)
x = torch.ones(1 << 20, device=dev)
dist.all_reduce(x)  # warm-up: communicator set-up
torch.cuda.synchronize()

# which path took the device ops: the C hot path, or the Python wrapper (FLIGHTREC_FASTPATH=0)
from flightrec.record import fastpath, wrapping, cpp_reader
python_calls = [0]
def count(frame, event, arg):
    if event == "call" and frame.f_code is wrapping.call_on_device.__code__:
        python_calls[0] += 1
sys.setprofile(count)
for _ in range(20):
    dist.all_reduce(x)
    dist.all_reduce(x, async_op=True).wait()
sys.setprofile(None)
torch.cuda.synchronize()
c_path = fastpath.available()
deadline = time.monotonic() + 5
while rec.polled and time.monotonic() < deadline:
    time.sleep(0.05)  # the watchdog completes them, polling the stream's newest Work first
in_order = sorted(str(k) for k, v in rec._in_order_groups.items() if v)
results["paths"] = {"c_hot_path": c_path, "torch_reader": cpp_reader.load() is not None,
                    "python_wrapper_device_calls": python_calls[0], "in_order_polling": in_order,
                    "left_polled": len(rec.polled),
                    "ok": python_calls[0] == (0 if c_path else 40) and bool(in_order) and not rec.polled}

def last():
    return [e for e in rec.entries() if e.device == "cuda"][-1]

def settle(entry, limit=10.0):
    t = time.monotonic()
    while entry.state not in ("completed", "failed") and time.monotonic() - t < limit:
        time.sleep(0.05)
        rec.poll_works()
    rec.device_timing.resolve(rec.entries())

# host ran ahead: the device is busy ~1 s, the blocking call returns at once
torch.cuda._sleep(2_000_000_000)
t0 = time.monotonic()
dist.all_reduce(x)
returned_s = time.monotonic() - t0
e = last()
state_at_return = e.state
torch.cuda.synchronize()
settle(e)
results["host_ran_ahead"] = {
    "returned_s": returned_s, "state_at_return": state_at_return, "state_after": e.state,
    "dev_start": e.t_dev_start_ns, "dev_end": e.t_dev_end_ns,
    "dev_ms": None if e.t_dev_end_ns is None or e.t_dev_start_ns is None else (e.t_dev_end_ns - e.t_dev_start_ns) / 1e6,
    "ok": state_at_return != "completed" and e.state == "completed" and e.t_dev_end_ns is not None
          and e.t_dev_start_ns is not None and e.t_dev_end_ns >= e.t_dev_start_ns,
}

# async: the end is timed where the current stream waits for the op
work = dist.all_reduce(x, async_op=True)
e = last()
torch.cuda._sleep(200_000_000)  # ~0.1 s of compute queued before the wait
work.wait()
torch.cuda.synchronize()
settle(e)
ok = e.t_dev_end_ns is not None and e.t_dev_start_ns is not None and e.t_dev_end_ns >= e.t_dev_start_ns
results["async_wait"] = {"state": e.state, "dev_ms": (e.t_dev_end_ns - e.t_dev_start_ns) / 1e6 if ok else None,
                         "ok": ok and e.state == "completed"}

# the watchdog fires on an op the device has not run (its host call returned long ago)
dumps = os.path.join(out, "nccl-dumps")
before = set(os.listdir(dumps)) if os.path.isdir(dumps) else set()
torch.cuda._sleep(12_000_000_000)  # ~6 s of device work ahead of the collective
dist.all_reduce(x)
e = last()
t0 = time.monotonic()
dumped = None
while time.monotonic() - t0 < 8.0:
    time.sleep(0.2)
    path = os.path.join(dumps, "rank-00000.json.gz")
    if os.path.exists(path):
        import gzip
        d = json.loads(gzip.decompress(open(path, "rb").read()))
        if d.get("reason") == "timeout":
            dumped = d
            break
state_during = e.state
torch.cuda.synchronize()
settle(e)
results["watchdog_fires"] = {"timeout_dump": dumped is not None, "state_during": state_during,
                             "state_after": e.state,
                             "detail": dumped.get("reason_detail") if dumped else None,
                             "ok": dumped is not None and state_during != "completed" and e.state == "completed"}

# CUDA graph: capture and replay an all_reduce with the recorder on
y = torch.ones(16, device=dev)
side = torch.cuda.Stream()
side.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(side):
    for _ in range(3):
        dist.all_reduce(y)
torch.cuda.current_stream().wait_stream(side)
torch.cuda.synchronize()
graph_result = {}
try:
    g = torch.cuda.CUDAGraph()
    captured_before = rec.device_timing.captured
    with torch.cuda.graph(g):
        dist.all_reduce(y)
        y.add_(1)  # device work of its own: a world-size-1 all_reduce alone leaves the graph empty
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    graph_result = {"captured": rec.device_timing.captured - captured_before, "value": float(y[0].item()),
                    "pending": len(rec.pending), "error": None}
except Exception as exc:
    graph_result = {"error": f"{type(exc).__name__}: {exc}"[:500]}
graph_result["ok"] = graph_result.get("error") is None and graph_result.get("captured") == 1 and graph_result.get("value") == 4.0
results["cuda_graph"] = graph_result
flightrec.dump(reason="gpu_check")
import gzip
d = json.loads(gzip.decompress(open(os.path.join(dumps, "rank-00000.json.gz"), "rb").read()))
results["dump"] = {"graph_captured_ops": d.get("graph_captured_ops"), "entries": d.get("recorded")}
results["versions"] = {"torch": torch.__version__, "cuda": torch.version.cuda, "nccl": str(torch.cuda.nccl.version()),
                       "device": torch.cuda.get_device_name(0)}
print("RESULT " + json.dumps(results))
dist.destroy_process_group()
'''

GRAPH_CONTROL = r'''
import os, sys, torch, torch.distributed as dist
out = sys.argv[1]
dist.init_process_group("nccl", init_method="file://" + os.path.join(out, "store-control"), rank=0, world_size=1)
dev = torch.device("cuda", 0)
torch.cuda.set_device(dev)
y = torch.ones(16, device=dev)
side = torch.cuda.Stream()
side.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(side):
    for _ in range(3):
        dist.all_reduce(y)
torch.cuda.current_stream().wait_stream(side)
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    dist.all_reduce(y)
    y.add_(1)
for _ in range(3):
    g.replay()
torch.cuda.synchronize()
print("CONTROL value", float(y[0].item()))
dist.destroy_process_group()
'''


def _env(hook: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(hook), str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.pop("FLIGHTREC", None)
    return env


def _hook(folder: Path) -> Path:
    """A sitecustomize doing what the installed flightrec.pth does (the tree is not installed here)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text((ROOT / "flightrec.pth").read_text())
    return folder


def _run(cmd: list[str], env: dict[str, str], timeout: float) -> tuple[int, str, float]:
    start = time.monotonic()
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, cwd=ROOT)
        return done.returncode, done.stdout + done.stderr, time.monotonic() - start
    except subprocess.TimeoutExpired as exc:
        text = (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return 124, text + f"\n(timed out after {timeout:.0f} s)", time.monotonic() - start


def _result(text: str) -> dict | None:
    for line in text.splitlines():
        if line.startswith("RESULT {"):
            return json.loads(line[len("RESULT "):])
    return None


def check_nccl(out: Path, env: dict[str, str], name: str = "nccl") -> dict:
    work = out / name
    work.mkdir(parents=True, exist_ok=True)
    rc, text, took = _run([sys.executable, "-c", NCCL_CHECK, str(work)], env, 180)
    got = _result(text) or {"error": text[-3000:]}
    crc, ctext, _ = _run([sys.executable, "-c", GRAPH_CONTROL, str(work)], env, 120)
    control = [line for line in ctext.splitlines() if line.startswith("CONTROL value ")]
    got["cuda_graph_without_recorder"] = float(control[0].split()[-1]) if control else f"rc {crc}: {ctext[-300:]}"
    if isinstance(got.get("cuda_graph"), dict):  # the recorder changes nothing the graph computes
        got["cuda_graph"]["ok"] = got["cuda_graph"].get("ok", False) and got["cuda_graph"].get("value") == got[
            "cuda_graph_without_recorder"]
    got.update(rc=rc, seconds=round(took, 1))
    parts = [v for k, v in got.items() if isinstance(v, dict) and "ok" in v]
    got["ok"] = rc == 0 and bool(parts) and all(p["ok"] for p in parts)
    return got


def check_nccl_python(out: Path, env: dict[str, str]) -> dict:
    """The same checks with the C hot path switched off: the Python wrapper is the reference."""
    return check_nccl(out, {**env, "FLIGHTREC_FASTPATH": "0"}, "nccl_python")


def build_in_place(out: Path) -> dict:
    """Compile the C parts for this Python and torch in the checked-out tree (what `pip install` and
    `flightrec build-ext` do), so the checks run the C hot path and the torch reader as a real install
    would; a build that fails leaves the Python paths, and the result says so."""
    sys.path.insert(0, str(ROOT))
    import hatch_build  # the wheel's build hook: the same compiler command, for the same C files

    got: dict = {}
    for source, (tree_dir, _) in hatch_build.EXTENSIONS.items():
        built = hatch_build.compile_extension(str(ROOT), source, str(ROOT / tree_dir))
        got[source] = "built" if built else "not built (the reason is on stderr)"
    rc, text, took = _run([sys.executable, "-m", "flightrec", "build-ext"], {**os.environ, "PYTHONPATH": str(ROOT)}, 400)
    got["build-ext"] = text.strip().splitlines()[-1:] if rc == 0 else f"failed ({rc}): {text[-1500:]}"
    got["seconds"] = round(took, 1)
    return got


def check_gloo_cuda(out: Path, env: dict[str, str]) -> dict:
    sys.path.insert(0, str(ROOT))
    from fixtures.launch import launch

    folder = out / "gloo-cuda"
    os.environ.update({k: v for k, v in env.items() if k == "PYTHONPATH"})
    job = launch(ROOT / "fixtures" / "jobs" / "gpu.py", 3, folder, env={"FLIGHTREC_TIMEOUT": "3"},
                 wait_for_ranks=[0, 1, 2], timeout_s=120)
    got: dict = {"dumps": [str(p.name) for p in job.dumps], "seconds": round(job.elapsed_s, 1),
                 "timed_out": job.timed_out}
    try:
        import analyzers
        from analyzers.reporting.render import text_report

        a = analyzers.load(folder)
        report = a.report()
        cuda = a.entries[a.entries["t_dev_start_ns"].notna()]
        both = cuda[cuda["t_dev_end_ns"].notna()]
        got.update(verdict=report["verdict"], causes=[(c["rank"], c["kind"]) for c in report["root_causes"]],
                   timed_ops=len(cuda), with_end=len(both),
                   ordered=bool((both["t_dev_end_ns"] >= both["t_dev_start_ns"]).all()),
                   text=text_report(report, a.graph).splitlines()[:12])
        got["ok"] = (len(job.dumps) == 3 and report["verdict"] == "hang" and got["causes"][:1] == [(1, "not_entered")]
                     and len(cuda) > 0 and len(both) > 0 and got["ordered"])
    except ImportError as exc:  # the analyzer's dependencies are not on this machine
        got.update(analysis=f"skipped: {exc}", ok=len(job.dumps) == 3)
    return got


def check_gloo_cuda_slow(out: Path, env: dict[str, str]) -> dict:
    """A slow rank that only its device events show: its host calls return at once, like the others'."""
    sys.path.insert(0, str(ROOT))
    from fixtures.launch import launch

    folder = out / "gloo-cuda-slow"
    os.environ.update({k: v for k, v in env.items() if k == "PYTHONPATH"})
    job = launch(ROOT / "fixtures" / "jobs" / "gpu.py", 3, folder, ["--slow-rank", "2", "--steps", "40"],
                 env={"FLIGHTREC_DUMP_ON_EXIT": "1"}, timeout_s=180)
    got: dict = {"dumps": [str(p.name) for p in job.dumps], "seconds": round(job.elapsed_s, 1),
                 "timed_out": job.timed_out, "exit": job.returncode}
    try:
        import analyzers

        a = analyzers.load(folder)
        report = a.report()
        timed = a.entries[a.entries["t_dev_start_ns"].notna() & a.entries["t_dev_end_ns"].notna()]
        got.update(verdict=report["verdict"], summary=report["summary"], timed_ops=len(timed),
                   stragglers=[(s["rank"], s["late_ms_median"]) for s in report["stragglers"]])
        got["ok"] = (len(job.dumps) == 3 and report["verdict"] == "slow" and len(timed) > 0
                     and [r for r, _ in got["stragglers"]] == [2])
    except ImportError as exc:  # the analyzer's dependencies are not on this machine
        got.update(analysis=f"skipped: {exc}", ok=len(job.dumps) == 3)
    return got


def check_nccl_2proc(out: Path, env: dict[str, str]) -> dict:
    """A 2-rank NCCL job, a GPU per rank, where rank 1 stalls before a collective: what users run."""
    import torch

    if torch.cuda.device_count() < 2:
        return {"ok": True, "skipped": f"{torch.cuda.device_count()} GPU: a 2-rank NCCL job needs 2"}
    sys.path.insert(0, str(ROOT))
    from fixtures.launch import launch

    folder = out / "nccl-2proc"
    os.environ.update({k: v for k, v in env.items() if k == "PYTHONPATH"})
    job = launch(ROOT / "fixtures" / "jobs" / "gpu.py", 2, folder, ["--backend", "nccl"],
                 env={"FLIGHTREC_TIMEOUT": "3", "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000"},
                 wait_for_ranks=[0, 1], timeout_s=180)
    got: dict = {"dumps": [str(p.name) for p in job.dumps], "seconds": round(job.elapsed_s, 1),
                 "timed_out": job.timed_out, "log": job.output[-1500:]}
    try:
        import analyzers

        report = analyzers.load(folder).report()
        got.update(verdict=report["verdict"], summary=report["summary"],
                   causes=[(c["rank"], c["kind"]) for c in report["root_causes"]])
        got["ok"] = len(job.dumps) == 2 and report["verdict"] == "hang" and got["causes"][:1] == [(1, "not_entered")]
    except ImportError as exc:  # the analyzer's dependencies are not on this machine
        got.update(analysis=f"skipped: {exc}", ok=len(job.dumps) == 2)
    return got


def check_overhead(out: Path, env: dict[str, str]) -> dict:
    target = out / "overhead.json"
    rc, text, took = _run([sys.executable, str(ROOT / "benchmarks" / "overhead.py"), "--device", "cuda", "--json", str(target)],
                          env, 240)
    got: dict = {"rc": rc, "seconds": round(took, 1), "tail": text.strip().splitlines()[-25:]}
    if target.exists():
        got["figures"] = json.loads(target.read_text())
    got["ok"] = rc == 0
    return got


def check_ablation(out: Path, env: dict[str, str]) -> dict:
    """`benchmarks/device_ablation.py`: where the device path's host time goes (informational: it passes
    when every variant ran)."""
    target = out / "ablation.json"
    rc, text, took = _run([sys.executable, str(ROOT / "benchmarks" / "device_ablation.py"), "--json", str(target)],
                          env, 240)
    got: dict = {"rc": rc, "seconds": round(took, 1), "tail": text.strip().splitlines()[-40:]}
    got["ok"] = rc == 0
    return got


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=None, help="results folder (default: a temporary one)")
    parser.add_argument("--only", default="nccl,nccl_python,gloo_cuda,gloo_cuda_slow,nccl_2proc,overhead,ablation",
                        help="comma-separated checks to run")
    parser.add_argument("--build", action="store_true",
                        help="first compile the C hot path, the pickle reader and the torch reader in place")
    a = parser.parse_args()
    out = Path(a.out or tempfile.mkdtemp(prefix="gpu-check-"))
    out.mkdir(parents=True, exist_ok=True)
    try:
        import torch
    except ImportError:
        print("no torch here", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print(f"no CUDA device (torch {torch.__version__}): nothing to check here", file=sys.stderr)
        return 2
    results: dict = {"torch": torch.__version__, "device": torch.cuda.get_device_name(0)}
    if a.build:
        results["build"] = build_in_place(out)
        print(f"build: {results['build']}", flush=True)
    env = _env(_hook(out / "hook"))
    checks = {"nccl": check_nccl, "nccl_python": check_nccl_python, "gloo_cuda": check_gloo_cuda,
              "gloo_cuda_slow": check_gloo_cuda_slow,
              "nccl_2proc": check_nccl_2proc, "overhead": check_overhead, "ablation": check_ablation}
    for name in a.only.split(","):
        start = time.monotonic()
        try:
            results[name] = checks[name](out, env)
        except Exception as exc:  # noqa: BLE001 - one broken check must not hide the others' results
            results[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:2000]}
        print(f"{name}: {'ok' if results[name].get('ok') else 'FAILED'} ({time.monotonic() - start:.0f} s)", flush=True)
    (out / "gpu_check.json").write_text(json.dumps(results, indent=2, default=str))
    print(json.dumps(results, indent=1, default=str)[:20000])
    return 0 if all(results[name].get("ok") for name in a.only.split(",")) else 1


if __name__ == "__main__":
    sys.exit(main())
