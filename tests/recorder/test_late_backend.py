"""Completion on device-like backends is the Work's, not the call's (NCCL's semantics, on CPU).

A backend registered through `torch.distributed.Backend.register_backend` returns from every call and
from `Work.wait()` at once, and completes its Works later on another thread, as NCCL does with a stream
that is still busy. flightrec must show such an op as running, not completed, until its Work completes,
and its watchdog must fire on it. (No GPU here: this backend is the stand-in for the device.)
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

JOB = f"""
import gzip, json, os, sys, threading, time
sys.path.insert(0, {str(ROOT)!r})
import torch, torch.distributed as dist
import flightrec, flightrec.arming as control

DELAY = float(sys.argv[2])

class LateWork(dist._Work):
    def __init__(self, tensors):
        super().__init__()
        self.future_ = torch.futures.Future()
        self.done_ = False
        def finish():
            time.sleep(DELAY)
            self.done_ = True
            self.future_.set_result(tensors)
        threading.Thread(target=finish, daemon=True).start()
    def wait(self, timeout=None):
        return True  # like NCCL's: the caller's stream waits, the host does not
    def is_completed(self):
        return self.done_
    def get_future(self):
        return self.future_

class LatePG(dist.ProcessGroup):
    def allreduce(self, tensors, opts):
        return LateWork(tensors)
    def getBackendName(self):
        return "late"

dist.Backend.register_backend("late", lambda store, rank, size, timeout: LatePG(rank, size), devices=["cpu"])
out = sys.argv[1]
flightrec.enable(dir=out, timeout_s=1.0)
dist.init_process_group("late", store=dist.FileStore(os.path.join(out, "store"), 1), rank=0, world_size=1)
rec = control.current().recorder
t = torch.ones(4)
t0 = time.monotonic()
dist.all_reduce(t)  # blocking: returns at once, done DELAY seconds later
returned = time.monotonic() - t0
entry = rec.entries()[-1]
at_return = entry.state
dumped = None
while time.monotonic() - t0 < DELAY + 5 and entry.state != "completed":
    time.sleep(0.05)
    path = os.path.join(out, "rank-00000.json.gz")
    if dumped is None and os.path.exists(path):
        dumped = json.loads(gzip.decompress(open(path, "rb").read())).get("reason")
took = time.monotonic() - t0
print(json.dumps({{"returned": returned, "at_return": at_return, "final": entry.state, "done_after": took,
                   "dump": dumped, "op": entry.op}}))
"""


def _run(delay: float) -> dict:
    import json

    with tempfile.TemporaryDirectory() as out:
        done = subprocess.run([sys.executable, "-c", JOB, out, str(delay)], capture_output=True, text=True, timeout=90,
                              env={k: v for k, v in os.environ.items() if k != "FLIGHTREC"})
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])


def test_an_op_is_running_until_its_work_completes_and_the_watchdog_fires_on_it() -> None:
    got = _run(3.0)
    assert got["op"] == "all_reduce" and got["returned"] < 0.5  # the host ran ahead
    assert got["at_return"] in ("enqueued", "started")  # not completed when the call returned
    assert got["final"] == "completed" and got["done_after"] >= 2.9  # completed with its Work
    assert got["dump"] == "timeout"  # the watchdog saw it outlive the 1 s timeout meanwhile


def test_a_quick_op_completes_without_a_dump() -> None:
    got = _run(0.2)
    assert got["final"] == "completed" and got["dump"] is None
