"""The overhead benchmark runs end to end (a tiny configuration): its pacing of the side-by-side
children, its variants and its verdict lines. Its figures are not asserted: they are a benchmark's."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_overhead_benchmark_runs_and_prints_its_verdict() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "overhead.py"), "--rounds", "2", "--blocks", "2",
                           "--block", "20"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("all_reduce of 16 floats") and "2 rounds x 2 blocks x 20 calls" in lines[0]
    assert any(line.startswith("per round, sync (us): A flightrec") for line in lines)
    assert any("torch reader" in line for line in lines)  # with it (and without, interleaved), or why not
    assert lines[-1].startswith("target: sync added <= 5.00 us -> A ")
    assert "PyTorch's recorder adds (A) -> sync " in lines[-1] and ", async " in lines[-1]


def test_startup_benchmark_finds_no_import_by_the_hook() -> None:
    """The start-up hook's benchmark runs; the hook, with FLIGHTREC unset, imported nothing of
    flightrec's or torch's (that part is a fact, not a timing)."""
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "startup.py"), "--starts", "2"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={k: v for k, v in os.environ.items() if k != "FLIGHTREC"})
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("start-up hook: ") and lines[0].endswith("flightrec.pth")
    assert "modules the hook imported: none" in lines
    assert any(line.startswith("target: no torch or flightrec import, under 1% of start-up -> ") for line in lines)
    # the command's own start-up is timed too (issue 23): one line per command, with its target
    timed = [line for line in lines if line.startswith("flightrec ")]
    assert [line.split(":")[0] for line in timed] == ["flightrec --help", "flightrec dump-now", "flightrec analyze (4 ranks)"]
    assert all(" s (" in line and "target < " in line for line in timed), timed


ROWS = {"no recorder (gloo, CPU tensors)": "gloo", "flightrec, gloo path": "gloo",
        "no recorder (stand-in, CPU tensors)": "gloo_on_standin", "flightrec, gloo path on the stand-in": "gloo_on_standin",
        "no recorder (stand-in backend)": "device", "flightrec, device path (stand-in)": "device"}


def test_device_path_benchmark_runs_on_cpu_with_its_standin(tmp_path: Path) -> None:
    """`--device cpu-standin` (quick): no recorder, the gloo path (on gloo, and on the stand-in's call) and the
    device path, each with its ratio to the no-recorder baseline of the same run, the device path's cost
    beyond the gloo path's on the same call, and proof that the device path ran on stand-in events."""
    out = tmp_path / "standin.json"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "overhead.py"), "--device", "cpu-standin",
                           "--quick", "--json", str(out)], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("device path on CPU with a stand-in device") and "1 rounds x 4 blocks x 50 calls" in lines[0]
    assert any(line.startswith("stand-in: ") for line in lines) and any(line.startswith("not modelled: ") for line in lines)
    rows: dict[tuple[str, int], list[float]] = {}
    for line in lines:
        label = next((label for label in sorted(ROWS, key=len, reverse=True) if line.startswith(label + " ")), None)
        if label is not None:
            world, sync_us, sync_ratio, async_us, async_ratio = line[len(label):].split()
            rows[(label, int(world))] = [float(sync_us), float(sync_ratio), float(async_us), float(async_ratio)]
    assert sorted(rows) == sorted([(label, 1) for label in ROWS] + [(label, 2) for label in list(ROWS)[:2]])
    report = json.loads(out.read_text())
    figures = report["figures"]
    for (label, world), (sync_us, sync_ratio, async_us, async_ratio) in rows.items():
        if label.startswith("no recorder"):
            assert sync_ratio == async_ratio == 1.0
            continue
        path = ROWS[label]
        for mode, us, ratio in (("sync", sync_us, sync_ratio), ("async", async_us, async_ratio)):
            f = figures[f"{path}_ws{world}_{mode}"]
            assert abs(f["flightrec_us"] - us) < 0.01 and abs(f["ratio"] - ratio) < 0.01
            assert abs(f["flightrec_us"] / f["base_us"] - f["ratio"]) < 1e-6  # a ratio to the same run's baseline
    check = next(line for line in lines if line.startswith("device path check"))
    ops, timed = re.search(r"(\d+) ops recorded on 'meta' in the ring, (\d+) with device start and end times", check).groups()
    assert int(ops) > 0 and int(timed) > 0, check
    # the stand-in's events are its C twin (as torch.Event's methods are C++) wherever a C compiler is
    kind = "c" if shutil.which(sysconfig.get_config_var("CC").split()[0] if sysconfig.get_config_var("CC") else "cc") \
        else "python"
    assert report["checks"]["standin_event_kind"] == kind and f"stand-in events ({kind})" in check
    # beyond the gloo path on the same call: per block pair, so not the difference of the two medians above
    same = report["device_minus_gloo_same_call_us"]
    line = next(line for line in lines if line.startswith("the same, the gloo path timed on the stand-in's call"))
    for mode in ("sync", "async"):
        assert f"{same[mode]['us']:+.2f} +- {same[mode]['uncertainty_us']:.2f} us {mode}" in line
        assert len(same[mode]["per_round_us"]) == 1 and same[mode]["us"] == same[mode]["per_round_us"][0]


def test_sustained_device_benchmark_prints_each_variant(tmp_path: Path) -> None:
    """`device_sustained.py` (small): each variant's µs per op against the no-recorder run of the same
    invocation, the GC's collections, and flightrec's variants recorded the stand-in's ops on its device."""
    out = tmp_path / "sustained.json"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "device_sustained.py"), "--ops", "3000",
                           "--rounds", "1", "--json", str(out)], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    figures = json.loads(out.read_text())["figures"]
    assert list(figures) == ["off", "flightrec", "op_by_op", "no_gc", "watchdog_asleep"]
    assert figures["off"]["added_us"] == 0.0
    for variant, f in figures.items():
        assert f"{variant} " in done.stdout and abs(f["added_us"] - (f["us_per_op"] - figures["off"]["us_per_op"])) < 1e-9
        (run,) = f["rounds"]
        assert (run["device_ops_in_ring"] > 0) == (variant != "off"), (variant, run)
    assert figures["no_gc"]["rounds"][0]["gc_collections"] == [0, 0, 0]  # the variant did turn the GC off


def test_cuda_benchmark_has_a_plan_and_says_when_there_is_no_gpu(tmp_path: Path) -> None:
    """`--device cuda`: the plan of its four variants (--dry-run), and, without a GPU, a clear exit, not a hang."""
    plan_file = tmp_path / "plan.json"
    dry = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "overhead.py"), "--device", "cuda", "--dry-run",
                          "--json", str(plan_file)], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert dry.returncode == 0, dry.stderr[-3000:]
    plan = json.loads(plan_file.read_text())
    assert {k: (v["env"]["TORCH_NCCL_TRACE_BUFFER_SIZE"], v["flightrec"]) for k, v in plan["variants"].items()} == {
        "a": ("0", False), "b": ("2000", False), "c": ("0", True), "d": ("2000", True)}
    import torch

    if torch.cuda.is_available():
        return  # the real run is benchmarks/gpu_check.py's (about three minutes)
    out = tmp_path / "out.json"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "overhead.py"), "--device", "cuda", "--json",
                           str(out)], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 2 and "no CUDA device" in done.stderr, (done.returncode, done.stderr[-2000:])
    assert json.loads(out.read_text())["ok"] is False
