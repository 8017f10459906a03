"""How the analyzer scales with ranks x entries, against PyTorch's own analyzer on the same traces.

For each N (ranks) with E entries per rank: a synthetic job with an injected fault
(fixtures/synth.py, flightrec format and PyTorch's pickle format, cached under .bench-data/) is
analysed in a child process: load time, analysis time, end to end (the child's whole life: start-up,
imports, load, analysis), peak RSS, and whether the culprit was named. PyTorch's analyzer
(`python -m torch.distributed.flight_recorder.fr_trace DIR`) runs on the pickles of the same job
with a time limit and a cap on the resident size of its processes (killed above it, so a run cannot
exhaust a shared machine); the ratio is taken within this run. Then: the time and size of
one 2,000-entry dump written by flightrec's dumper for a real Recorder.

    python benchmarks/analyze_scale.py                       # 256, 1024, 4096, 16384 ranks x 2000
    python benchmarks/analyze_scale.py --sizes 256,1024 --torch-timeout 300 --tpdp-sizes ""
    python benchmarks/analyze_scale.py --ranks 1024,16384,131072   # growth: summary read against full read

"(gave up)": PyTorch's analyzer stopped at its own cap of 10 mismatches in one group (it aligns ranks
by record id, which pipeline stages with different op counts per step break), so it did less work.

Peak RSS: each measured command runs in its own process group under a small wrapper that samples
the summed resident size of the group every 0.1 s; the peak reported is that sampled maximum or the
largest exact maximum of one process (RUSAGE), whichever is higher. For the analyzer the older,
looser bound (its own maximum plus its largest reader's, though the readers are gone before the
analysis peaks) is printed too.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import zlib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

TARGET_S, TARGET_GB, TARGET_RATIO = 60.0, 8.0, 20.0
WRITE_TARGET_MS, WRITE_TARGET_MB = 100.0, 1.0

ANALYZE_CHILD = r"""
import json, resource, sys, time
t0 = time.perf_counter()
sys.path.insert(0, {root!r})
from analyzers.analysis import Analysis
from analyzers.reading.loader import load_folder
from fixtures import synth
t1 = time.perf_counter()
data = load_folder({folder!r}, read={read!r})
t2 = time.perf_counter()
report = Analysis(data).report()
t3 = time.perf_counter()
print(json.dumps({{
    "import_s": t1 - t0, "load_s": t2 - t1, "analysis_s": t3 - t2, "entries": int(len(data.entries)),
    "self_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
    "workers_rss_gb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20,
    "user_s": resource.getrusage(resource.RUSAGE_SELF).ru_utime, "sys_s": resource.getrusage(resource.RUSAGE_SELF).ru_stime,
    "workers_user_s": resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime,
    "workers_sys_s": resource.getrusage(resource.RUSAGE_CHILDREN).ru_stime,
    "errors": synth.check(report, {ranks}, {fault!r}, {pp!r}), "summary": report["summary"],
}}))
"""

WRITE_CHILD = r"""
import json, os, statistics, sys, time
sys.path.insert(0, {root!r})
import torch, torch.distributed as dist
import flightrec
from flightrec.arming import current
from flightrec.watch import dump_writer
from flightrec.format.packed import plain
out = {out!r}
assert flightrec.enable(dir=out, timeout_s=3600, buffer=2000)
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
t = torch.ones(1024)
for i in range(2100):
    if i % 3 == 0:
        dist.all_gather_into_tensor(torch.empty(1024), t)
    else:
        dist.all_reduce(t)
rec = current().recorder
times, build, sizes = [], [], []
for _ in range(7):
    a = time.perf_counter()
    payload = dump_writer.build_dump(rec, "api")
    b = time.perf_counter()
    path = dump_writer.write_dump(payload, out)
    c = time.perf_counter()
    build.append((b - a) * 1e3)
    times.append((c - a) * 1e3)
    sizes.append(os.path.getsize(path))
entries = len(plain(payload["entries"]["id"]))
flightrec.disable()
dist.destroy_process_group()
print(json.dumps({{"entries": entries, "ms": statistics.median(times), "build_ms": statistics.median(build),
                  "bytes": sizes[-1]}}))
"""


def measure(cmd: list[str], timeout: float, mem_gb: float | None = None, env: dict[str, str] | None = None) -> dict:
    """Run `cmd` under this file's `--wrap` mode: wall time, exit code, peak RSS of its processes."""
    wrap = [sys.executable, os.path.abspath(__file__), "--wrap", str(timeout), str(mem_gb or 0), "--", *cmd]
    proc = subprocess.run(wrap, capture_output=True, text=True, env=env, check=False)
    try:
        return json.loads(proc.stderr.strip().splitlines()[-1]) | {"stdout": proc.stdout}
    except (IndexError, ValueError):
        return {"rc": proc.returncode, "wall_s": float("nan"), "rss_gb": float("nan"), "stdout": proc.stdout,
                "error": proc.stderr[-500:]}


def wrap_main(timeout: float, mem_gb: float, cmd: list[str]) -> int:
    """Child side of `measure`: runs cmd in its own process group, reports JSON on stderr's last line."""

    start = time.perf_counter()
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(cmd, start_new_session=True, stdout=log, stderr=subprocess.STDOUT, text=True)
        timed_out = over = False
        group_peak = 0.0
        while proc.poll() is None:  # the cap is on the resident size of the whole process group
            resident = _group_rss_gb(proc.pid)
            group_peak = max(group_peak, resident)
            if time.perf_counter() - start > timeout:
                timed_out = True
            elif mem_gb > 0 and resident > mem_gb:
                over = True
            if timed_out or over:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                break
            time.sleep(0.1)
        wall = time.perf_counter() - start
        log.seek(0)
        out = log.read()
    sys.stdout.write(out + ("\nMemoryError: resident size over the cap\n" if over else ""))
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20
    sys.stderr.write("\n" + json.dumps({"rc": proc.returncode, "wall_s": wall, "rss_gb": rss, "timed_out": timed_out,
                                        "over_cap": over, "group_peak_gb": group_peak}) + "\n")
    return 0


def _group_rss_gb(pgid: int) -> float:
    """Resident size of every process in a process group (from /proc), GB."""
    total = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid:  # field 5 of stat: the process group
                total += int(fields[21]) * os.sysconf("SC_PAGE_SIZE")  # field 24: rss in pages
        except (OSError, ValueError, IndexError):
            continue
    return total / 2**30


def prepare(ranks: int, entries: int, fault: str, data: str, pp: int | None) -> tuple[str, str, float]:
    from fixtures import synth

    t = time.perf_counter()
    tag = f"{fault}-{ranks}x{entries}" + ("" if pp is None else f"-pp{pp}")
    fr = str(synth.write_folder(os.path.join(data, f"flightrec-{tag}"), ranks, entries, fault, "flightrec", pp=pp))
    pt = str(synth.write_folder(os.path.join(data, f"torch-{tag}"), ranks, entries, fault, "torch", pp=pp))
    return fr, pt, time.perf_counter() - t


def _cpu_times() -> list[int] | None:
    """The machine's CPU time counters (/proc/stat's `cpu` line), None where there is none."""
    try:
        with open("/proc/stat") as fh:
            return [int(v) for v in fh.readline().split()[1:]]
    except (OSError, ValueError):
        return None


def stolen_share(before: list[int] | None, after: list[int] | None) -> float | None:
    """Share of the CPU time the hypervisor gave to other machines between two readings (steal,
    the 8th counter): on a shared VM the same run takes up to twice as long when it is high."""
    if not before or not after or len(before) < 8 or len(after) < 8:
        return None
    spent = [b - a for a, b in zip(before, after, strict=False)]
    return spent[7] / sum(spent) if sum(spent) > 0 else None


def run_flightrec(folder: str, ranks: int, fault: str, pp: int | None, mem_gb: float, read: str = "full") -> dict:
    code = ANALYZE_CHILD.format(root=ROOT, folder=folder, ranks=ranks, fault=fault, pp=pp, read=read)
    before = _cpu_times()
    m = measure([sys.executable, "-c", code], timeout=3600, mem_gb=mem_gb)
    stolen = stolen_share(before, _cpu_times())
    try:
        inner = json.loads(m["stdout"].strip().splitlines()[-1])
    except (IndexError, ValueError, KeyError):
        why = f"resident size over the {mem_gb:.0f} GB cap" if m.get("over_cap") else (
            "out of memory" if "MemoryError" in m.get("stdout", "") else m.get("error", "no output"))
        return {"error": f"{why}; rc={m.get('rc')}, {m['wall_s']:.0f} s, peak RSS {m.get('rss_gb', float('nan')):.1f} GB",
                "wall_s": m["wall_s"]}
    inner["end_to_end_s"] = m["wall_s"]
    inner["stolen"] = stolen
    # The tree's peak: the analyzer's own exact maximum, or the sampled sum over its processes when
    # higher (while readers run). Adding the largest reader's maximum to the analyzer's own, as runs
    # 1-6 did, counts memory the readers held during loading as if held during the analysis.
    inner["rss_bound_gb"] = inner["self_rss_gb"] + inner["workers_rss_gb"]
    inner["rss_gb"] = max(inner["self_rss_gb"], m.get("group_peak_gb", 0.0))
    return inner


def run_torch(folder: str, timeout: float, mem_gb: float) -> dict:
    cmd = [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", folder]
    m = measure(cmd, timeout=timeout, mem_gb=mem_gb)
    m["rss_gb"] = max(m.get("rss_gb", float("nan")), m.get("group_peak_gb", 0.0))
    return m


def dump_write() -> dict:
    with tempfile.TemporaryDirectory() as out:
        env = dict(os.environ, OMP_NUM_THREADS="1")
        env.pop("FLIGHTREC", None)
        proc = subprocess.run([sys.executable, "-c", WRITE_CHILD.format(root=ROOT, out=out)], capture_output=True,
                              text=True, env=env, timeout=600, check=False)
        if proc.returncode:
            return {"error": proc.stderr[-800:]}
        return json.loads(proc.stdout.strip().splitlines()[-1])


def table(sizes: list[int], a: argparse.Namespace, pp: int | None, title: str) -> list[dict]:
    """Measure both analyzers at each size on one layout; prints a table, returns the raw rows."""
    print(f"\n{title}, {a.entries} entries per rank, fault {a.fault!r}")
    print(f"{'ranks':>6} {'entries':>11} {'load s':>7} {'analysis s':>10} {'end-to-end s':>12} {'peak RSS GB':>11} "
          f"{'(bound)':>7} {'culprit':>7} {'torch fr_trace s':>24} {'torch RSS GB':>12} {'ratio':>6} "
          f"{'flightrec on PyTorch format: s':>30} {'GB':>5} {'culprit':>7} {'ratio':>6}")
    rows, torch_gave_up = [], None
    for n in sizes:
        fr, pt, gen_s = prepare(n, a.entries, a.fault, a.data, pp)
        f = run_flightrec(fr, n, a.fault, pp, a.flightrec_mem_gb)
        if "error" in f:
            print(f"{n:>6} flightrec failed: {f['error']}")
            rows.append({"ranks": n, "pp": pp, "flightrec": f})
            continue
        t: dict = {}
        if a.no_torch:
            torch_txt = "not run"
        elif torch_gave_up is not None:
            torch_txt = f"not run (failed at {torch_gave_up})"
            t = {"skipped": True}
        else:
            t = run_torch(pt, a.torch_timeout, a.torch_mem_gb)
            if t.get("timed_out"):
                torch_txt = f"did not finish in {a.torch_timeout:.0f} s"
                torch_gave_up = n
            elif t["rc"] != 0:
                oom = "MemoryError" in t.get("stdout", "")
                torch_txt = f"{'out of memory' if oom else 'failed'} after {t['wall_s']:.0f} s"
                torch_gave_up = n
            else:
                t["gave_up"] = "aborting" in t.get("stdout", "")  # its own cap: too many mismatches in a group
                torch_txt = f"{t['wall_s']:.1f}" + (" (gave up)" if t["gave_up"] else "")
        ratio = t["wall_s"] / f["end_to_end_s"] if t.get("rc") == 0 and not t.get("timed_out") else None
        # the same job as PyTorch wrote it, read by flightrec: the path jobs without flightrec take
        fp = run_flightrec(pt, n, a.fault, pp, a.flightrec_mem_gb) if not a.no_torch_format else {"skipped": True}
        fp_ok = "end_to_end_s" in fp
        fp_ratio = t["wall_s"] / fp["end_to_end_s"] if fp_ok and ratio is not None else None
        fp_txt = (f"{fp['end_to_end_s']:>30.1f} {fp['rss_gb']:>5.2f} {('ok' if not fp['errors'] else 'WRONG'):>7} "
                  f"{(f'{fp_ratio:.1f}x' if fp_ratio else '-'):>6}") if fp_ok else f"{fp.get('error', 'not run')[:44]:>50}"
        culprit = "ok" if not f["errors"] else "WRONG"
        trss = f"{t['rss_gb']:.2f}" if t.get("rss_gb") == t.get("rss_gb") and "rss_gb" in t else "-"
        print(f"{n:>6} {f['entries']:>11,} {f['load_s']:>7.1f} {f['analysis_s']:>10.1f} {f['end_to_end_s']:>12.1f} "
              f"{f['rss_gb']:>11.2f} {f['rss_bound_gb']:>7.2f} {culprit:>7} {torch_txt:>24} {trss:>12} "
              f"{(f'{ratio:.1f}x' if ratio else '-'):>6} {fp_txt}", flush=True)
        if fp_ok and fp["errors"]:
            print(f"{'':>6} flightrec on PyTorch format: {'; '.join(fp['errors'])}", flush=True)
        for label, run in (("flightrec", f), ("flightrec on PyTorch format", fp)):
            if "sys_s" in run:  # page faults of fresh memory show as system time (costly on a VM)
                print(f"{'':>6} {label}'s own CPU: {run['user_s']:.1f} s user, {run['sys_s']:.1f} s system; its "
                      f"readers' {run['workers_user_s']:.1f} s user, {run['workers_sys_s']:.1f} s system", flush=True)
        if f.get("stolen") is not None:
            print(f"{'':>6} CPU time the hypervisor gave to other machines during flightrec's run: {100 * f['stolen']:.0f}%"
                  + (" (a slow minute: the figures above are inflated)" if f["stolen"] >= 0.10 else ""), flush=True)
        rows.append({"ranks": n, "pp": pp, "entries": f["entries"], "generate_s": gen_s, "flightrec": f, "torch": {
            k: v for k, v in t.items() if k != "stdout"}, "ratio": ratio, "flightrec_on_torch": fp,
            "ratio_on_torch": fp_ratio})
    return rows


def growth(sizes: list[int], a: argparse.Namespace) -> list[dict]:
    """`--ranks`: how the cost grows with ranks on flightrec dumps, the hang verdict from the summaries
    against the full read (every entry, timing included)."""
    from fixtures import synth

    print(f"\nGrowth with ranks (3-D layout, {a.entries} entries per rank, fault {a.fault!r}, flightrec dumps)")
    print(f"{'ranks':>7} {'write s':>8} {'disk GB':>8} | {'summary read: s':>15} {'GB':>5} {'culprit':>7} | "
          f"{'sampled read: s':>15} {'GB':>5} {'culprit':>7} | {'full read: s':>12} {'GB':>5} {'culprit':>7}")
    rows = []
    for n in sizes:
        t = time.perf_counter()
        folder = str(synth.write_folder(os.path.join(a.data, f"flightrec-{a.fault}-{n}x{a.entries}"), n, a.entries,
                                        a.fault, "flightrec"))
        write_s = time.perf_counter() - t
        disk = sum(e.stat().st_size for e in os.scandir(folder) if e.is_file()) / 1e9
        row: dict = {"ranks": n, "write_s": write_s, "disk_gb": disk}
        cells = []
        for read in ("summary", "sampled", "full"):
            width = 12 if read == "full" else 15
            if read == "full" and n > a.full_up_to:
                row[read] = {"skipped": True}
                cells.append(f"{'not run':>{width}} {'':>5} {'':>7}")
                continue
            r = run_flightrec(folder, n, a.fault, None, a.flightrec_mem_gb, read=read)
            row[read] = r
            if "error" in r:
                cells.append(f"{r['error'][:width + 13]:>{width + 14}}")
            else:
                ok = "ok" if not r["errors"] else "WRONG"
                cells.append(f"{r['end_to_end_s']:>{width}.1f} {r['rss_gb']:>5.2f} {ok:>7}")
        print(f"{n:>7} {write_s:>8.0f} {disk:>8.2f} | {' | '.join(cells)}", flush=True)
        rows.append(row)
    return rows


def yardstick() -> float:
    """Seconds for a fixed piece of work of the kinds the analyzer does (inflate and decode JSON, sort
    and gather with numpy), median of 3. It does not change with flightrec's code, so it tells a
    slow minute of a shared machine from a slow change: compare it between runs."""
    import numpy as np

    rng = np.random.default_rng(0)
    blob = zlib.compress(json.dumps([list(range(i, i + 50)) for i in range(2000)]).encode())
    keys = rng.integers(0, 1 << 40, 3_000_000)
    where = rng.integers(0, len(keys), len(keys))

    def once() -> float:
        start = time.perf_counter()
        for _ in range(20):
            json.loads(zlib.decompress(blob))
        np.sort(keys)
        keys[where].sum()
        return time.perf_counter() - start

    return statistics.median(once() for _ in range(3))


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--wrap":
        return wrap_main(float(sys.argv[2]), float(sys.argv[3]), sys.argv[5:])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="256,1024,4096,16384")
    p.add_argument("--entries", type=int, default=2000)
    p.add_argument("--fault", default="stall")
    p.add_argument("--data", default=os.path.join(ROOT, ".bench-data"))
    p.add_argument("--torch-timeout", type=float, default=600.0)
    p.add_argument("--torch-mem-gb", type=float, default=16.0, help="resident-size cap for PyTorch's analyzer (GB)")
    p.add_argument("--flightrec-mem-gb", type=float, default=16.0, help="resident-size cap for flightrec's analyzer (GB)")
    p.add_argument("--tpdp-sizes", default="256,1024",
                   help="also compare on a TP x DP layout without pipeline p2p (PyTorch's analyzer matches it fully)")
    p.add_argument("--no-torch", action="store_true")
    p.add_argument("--no-torch-format", action="store_true", help="skip flightrec on the PyTorch-format copy")
    p.add_argument("--json", default=None, help="also write the raw figures to this file")
    p.add_argument("--ranks", default=None,
                   help="instead: the growth table at these rank counts (e.g. 1024,16384,131072): summary, sampled and full reads")
    p.add_argument("--full-up-to", type=int, default=1 << 30, help="with --ranks: skip the full read above this many ranks")
    a = p.parse_args()
    if a.ranks:
        sizes = [int(s) for s in a.ranks.split(",") if s]
        rows = growth(sizes, a)
        for r in rows:
            g = r.get("summary", {})
            if r["ranks"] == 131072:
                met = "end_to_end_s" in g and g["end_to_end_s"] <= TARGET_S and g["rss_gb"] <= TARGET_GB and not g["errors"]
                print(f"131,072-rank hang verdict from summaries (<= {TARGET_S:.0f} s, <= {TARGET_GB:.0f} GB, only the "
                      f"culprit named): {'met' if met else 'NOT met'}")
                f = r.get("sampled", {})
                met = "end_to_end_s" in f and f["end_to_end_s"] <= 600 and f["rss_gb"] <= 16 and not f["errors"]
                print(f"131,072-rank full report, timing from the sample (<= 600 s, <= 16 GB): {'met' if met else 'NOT met'}")
        if a.json:
            with open(a.json, "w") as fh:
                json.dump({"growth": rows, "cpus": os.cpu_count()}, fh, indent=2, default=str)
        return 0
    sizes = [int(s) for s in a.sizes.split(",") if s]
    speed = {"start_s": yardstick()}
    print(f"machine: {os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.1f} at start (shared machines vary); "
          f"yardstick {speed['start_s']:.2f} s")
    rows = table(sizes, a, pp=None, title="3-D layout (TP 8 x PP 4 x DP; pipeline send/recv)")
    tpdp = [int(x) for x in a.tpdp_sizes.split(",") if x]
    if tpdp:
        rows += table(tpdp, a, pp=1, title="TP x DP layout (TP 8 x DP, no pipeline)")
    w = dump_write()
    if "error" in w:
        print(f"dump write: failed: {w['error']}")
    else:
        ok = w["ms"] <= WRITE_TARGET_MS and w["bytes"] <= WRITE_TARGET_MB * 2**20
        print(f"dump write: {w['entries']} entries in {w['ms']:.1f} ms (building {w['build_ms']:.1f} ms), "
              f"{w['bytes'] / 1024:.0f} KiB gzip; targets {WRITE_TARGET_MS:.0f} ms, {WRITE_TARGET_MB:.0f} MB: "
              f"{'met' if ok else 'NOT met'}")
    speed["end_s"] = yardstick()
    print(f"load average {os.getloadavg()[0]:.1f} at the end; yardstick {speed['end_s']:.2f} s (the same fixed work "
          f"at start and end: a larger figure is a slower minute of this machine, not of flightrec)")
    for r in rows:
        f = r.get("flightrec", {})
        for fmt, g, rkey in (("flightrec format", f, "ratio"), ("PyTorch format", r.get("flightrec_on_torch") or {},
                                                                   "ratio_on_torch")):
            if r["ranks"] == 16384 and r.get("pp") is None:
                met = "end_to_end_s" in g and g["end_to_end_s"] <= TARGET_S and g["rss_gb"] <= TARGET_GB and not g["errors"]
                print(f"16,384-rank target on the {fmt} (<= {TARGET_S:.0f} s, <= {TARGET_GB:.0f} GB, only the culprit "
                      f"named): {'met' if met else 'NOT met'}")
            if r["ranks"] == 1024 and g:
                ratio = r.get(rkey)
                print(f"1,024-rank target on the {fmt} (>= {TARGET_RATIO:.0f}x PyTorch's analyzer), "
                      f"{'3-D' if r.get('pp') is None else 'TP x DP'}: "
                      + ("not measured" if ratio is None else f"{ratio:.1f}x, {'met' if ratio >= TARGET_RATIO else 'NOT met'}"))
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"rows": rows, "dump_write": w, "cpus": os.cpu_count(), "yardstick": speed}, fh, indent=2, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
