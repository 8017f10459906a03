"""flightrec's timeout against PyTorch's NCCL watchdog on a real GPU (issue 24), in about two minutes.

    python benchmarks/nccl_timeout_check.py --out DIR     # DIR/nccl_timeout_check.json; exit 1 if a check failed

World size 1 on NCCL (one GPU is enough): an all_reduce queued behind a minute of device work never
runs within its group's timeout, so NCCL's watchdog ends it, exactly as it ends a collective whose
peer never came. Each case runs in its own bounded subprocess:

- `derived`: init_process_group(timeout=20 s), FLIGHTREC_TIMEOUT unset, TORCH_NCCL_ASYNC_ERROR_HANDLING
  at PyTorch's default, TORCH_NCCL_DUMP_ON_TIMEOUT=1 with PyTorch's recorder on: the group's timeout
  must be read (20 s), flightrec's limit derived (10 s), its `timeout` dump (with PyTorch's recorder
  entries) written before NCCL's watchdog aborts the process; PyTorch's own dump file is looked for.
- `explicit`: FLIGHTREC_TIMEOUT=30 against the same 20 s group: one warning naming group 0.
- `no_handling`: TORCH_NCCL_ASYNC_ERROR_HANDLING=0: NCCL no longer ends ops, the 300 s default stays;
  a group created without a timeout reads NCCL's default (600 s on torch 2.2+).

`--poll-device-works` completes device ops by polling their Work instead of its future (in the case's
process only). Seen on torch 2.11 / NCCL 2.28 (2026-12-04): a WorkNCCL's future is marked complete when
the op is enqueued, so the recorder took the hung all_reduce as completed and `derived` found no
`timeout` dump; with the option, the dump came 10.0 s after the call, NCCL's watchdog caught the
timeout at 20 s and aborted the process at 86 s (after about a minute for PyTorch's own dump).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CASE = r'''
import datetime, json, os, sys, time
import torch, torch.distributed as dist
import flightrec
from flightrec.arming import current

out, case = sys.argv[1], sys.argv[2]
if os.environ.get("NCCL_CHECK_POLL"):  # --poll-device-works: device Works polled (is_completed), not their futures
    from flightrec.record import recorder as _recorder
    _watch = _recorder.Recorder.watch_work
    def _polled(self, entry, work, late=False):
        if entry.device == "cpu":
            return _watch(self, entry, work, late)
        entry.work = work
        self.by_work[id(work)] = entry
        self.polled[entry.id] = entry
    _recorder.Recorder.watch_work = _polled
assert flightrec.enable(dir=os.path.join(out, "dumps"))
torch.cuda.set_device(0)
dist.init_process_group("nccl", init_method="file://" + os.path.join(out, "store"), rank=0, world_size=1,
                        timeout=datetime.timedelta(seconds=20))
plain = dist.new_group([0])
x = torch.ones(1 << 10, device="cuda")
dist.all_reduce(x)
dist.all_reduce(x, group=plain)
torch.cuda.synchronize()
armed = current()
deadline = time.monotonic() + 10
while armed.watchdog._limits_gen != armed.recorder.groups.timeouts_gen and time.monotonic() < deadline:
    time.sleep(0.05)
time.sleep(0.6)
reg, limits = armed.recorder.groups, armed.watchdog.limits
info = {n: {"timeout": (t.seconds, t.backend, t.read, t.ends_ops) if t else None, "limit": limits.seconds(n)}
        for n, t in reg.timeouts.items()}
print("RESULT " + json.dumps({"groups": info, "torch": torch.__version__}), flush=True)
if case != "derived":
    dist.destroy_process_group()
    sys.exit(0)
torch.cuda._sleep(120_000_000_000)  # about a minute of device work ahead of the collective
print("CALL " + str(time.time_ns()), flush=True)
dist.all_reduce(x)  # returns at once; NCCL's watchdog ends it at 20 s
if os.environ.get("NCCL_CHECK_DIAG"):
    import faulthandler, threading
    def diag():
        time.sleep(13)
        rec = armed.recorder
        last = rec.entries()[-1]
        print("DIAG " + json.dumps({"state": last.state, "group": last.group, "op": last.op, "device": last.device,
              "in_flight": len(rec.in_flight()), "fired": sorted(armed.watchdog._fired),
              "watchdog_alive": armed.watchdog._thread.is_alive(),
              "files": sorted(os.listdir(os.path.join(out, "dumps"))) if os.path.isdir(os.path.join(out, "dumps")) else None}), flush=True)
        faulthandler.dump_traceback(all_threads=True)
    threading.Thread(target=diag, daemon=True).start()
time.sleep(120)
print("STILL ALIVE", flush=True)
'''


def _run_case(case: str, out: Path, extra_env: dict[str, str], timeout: float) -> dict:
    work = out / case
    work.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["PYTHONUNBUFFERED"] = "1"
    for name in ("FLIGHTREC", "FLIGHTREC_TIMEOUT", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "NCCL_ASYNC_ERROR_HANDLING",
                 "TORCH_NCCL_BLOCKING_WAIT"):
        env.pop(name, None)
    env.update(extra_env)
    log = open(work / "log.txt", "w+")
    start = time.time_ns()
    proc = subprocess.Popen([sys.executable, "-c", CASE, str(work), case], stdout=log, stderr=subprocess.STDOUT,
                            env=env, cwd=ROOT)
    dump = work / "dumps" / "rank-00000.json.gz"
    timeout_dump = None
    while proc.poll() is None and (time.time_ns() - start) / 1e9 < timeout:
        if timeout_dump is None and dump.exists():
            try:
                d = json.loads(gzip.decompress(dump.read_bytes()))
                if d.get("reason") == "timeout":
                    timeout_dump = d
                    shutil.copy(dump, work / "timeout-dump.json.gz")
            except (OSError, ValueError, EOFError):
                pass
        time.sleep(0.1)
    ended_ns = time.time_ns()
    if proc.poll() is None:
        proc.kill()
    rc = proc.wait()
    log.seek(0)
    text = log.read()
    got: dict = {"rc": rc, "seconds": round((ended_ns - start) / 1e9, 1), "tail": text.strip().splitlines()[-12:]}
    for line in text.splitlines():
        if line.startswith("RESULT "):
            got.update(json.loads(line[len("RESULT "):]))
        if line.startswith("DIAG "):
            got["diag"] = json.loads(line[len("DIAG "):])
        if line.startswith("CALL "):
            got["call_ns"] = int(line.split()[1])
    got["warnings"] = [line for line in text.splitlines() if "too close to or past" in line]
    if timeout_dump is not None:
        fr = timeout_dump.get("torch_fr") or {}
        got["timeout_dump"] = {
            "detail": timeout_dump.get("reason_detail"),
            "after_call_s": round((timeout_dump["dump_time_ns"] - got.get("call_ns", 0)) / 1e9, 2),
            "before_exit_s": round((ended_ns - timeout_dump["dump_time_ns"]) / 1e9, 2),
            "groups": [(g["name"], g["backend"], g.get("timeout_s")) for g in timeout_dump.get("groups", [])],
            "torch_fr_keys": sorted(fr), "torch_fr_last": (fr.get("entries") or [None])[-1],
            "nccl_pg_status": (fr.get("nccl") or {}).get("pg_status"),
            "nccl_last": ((fr.get("nccl") or {}).get("entries") or [None])[-1],
            "dump_on_timeout": fr.get("dump_on_timeout"), "dump_prefix": fr.get("dump_prefix"),
        }
    got["torch_files"] = sorted(p.name for p in work.glob("torch_trace_rank_*"))
    got["dump_files"] = sorted(p.name for p in (work / "dumps").glob("*")) if (work / "dumps").is_dir() else []
    for name in got["dump_files"]:  # beside the results, where a caller collecting one folder finds them
        shutil.copy(work / "dumps" / name, out / f"{case}-{name.lstrip('.')}")
    return got


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=None)
    parser.add_argument("--only", default="explicit,no_handling,derived", help="comma-separated cases")
    parser.add_argument("--poll-device-works", action="store_true",
                        help="complete device ops by polling their Work (is_completed), not by its future: NCCL marks "
                             "a Work's future complete when the op is enqueued, so without this the recorder sees the "
                             "hung all_reduce completed and `derived` cannot fire (the timeout path checked alone)")
    a = parser.parse_args()
    if a.poll_device_works:
        os.environ["NCCL_CHECK_POLL"] = "1"
    only = set(a.only.split(","))
    out = Path(a.out or tempfile.mkdtemp(prefix="nccl-timeout-"))
    out.mkdir(parents=True, exist_ok=True)
    results: dict = {}
    if "explicit" in only:
        explicit = _run_case("explicit", out, {"FLIGHTREC_TIMEOUT": "30"}, 90)
        explicit["ok"] = (explicit["rc"] == 0 and len(explicit["warnings"]) == 1
                          and "group '0'" in explicit["warnings"][0]
                          and explicit.get("groups", {}).get("0", {}).get("limit") == 30)
        results["explicit"] = explicit
    if "no_handling" in only:
        none = _run_case("no_handling", out, {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"}, 90)
        groups = none.get("groups", {})
        none["ok"] = (none["rc"] == 0 and all(g["limit"] == 300 for g in groups.values()) and bool(groups)
                      and groups.get("0", {}).get("timeout", [None])[0] == 20)
        results["no_handling"] = none
    if "derived" not in only:
        return _finish(out, results)
    derived = _run_case("derived", out, {
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1", "TORCH_FR_BUFFER_SIZE": "200", "TORCH_NCCL_TRACE_BUFFER_SIZE": "200",
        "TORCH_FR_DUMP_TEMP_FILE": str(out / "derived" / "torch_trace_rank_"),
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": str(out / "derived" / "torch_trace_rank_")}, 150)
    td = derived.get("timeout_dump") or {}
    derived["ok"] = (derived.get("groups", {}).get("0", {}).get("limit") == 10 and bool(td)
                     and 10 <= td.get("after_call_s", 0) < 20 and derived["rc"] != 0 and "STILL ALIVE" not in derived["tail"])
    results["derived"] = derived
    return _finish(out, results)


def _finish(out: Path, results: dict) -> int:
    results["ok"] = all(r["ok"] for r in results.values() if isinstance(r, dict))
    (out / "nccl_timeout_check.json").write_text(json.dumps(results, indent=1, default=str))
    print(json.dumps(results, indent=1, default=str))
    return 0 if results["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
