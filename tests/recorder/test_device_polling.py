"""The watchdog polls a device stream's pending ops in O(log n) Work queries, not one per op.

NCCL and HCCL run each group's collectives on one stream, so their Works finish in issue order: the
newest done means all are done, and bisection finds where the done ones end. A Work that reads as
completed while holding an error (NCCL's, once its communicator failed) is failed, not completed. No GPU here: the backend
is a Python ProcessGroup registered as `hccl` (torch_npu registers HCCL the same way) on `meta`
tensors, whose Works finish in order as a device's "progress" advances; a second run registers it
under another name, which gets no such trust (one query per op), and must end in the same states.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

JOB = f"""
import json, sys
sys.path.insert(0, {str(ROOT)!r})
import torch, torch.distributed as dist
import flightrec, flightrec.arming as control
from flightrec.record.device_timing import DeviceTiming
from benchmarks import standin

progress, queries, broken, errored = [0], [0], [None], [None]

class StreamWork(dist._Work):
    # op n has finished once the device's progress reached n; from `broken` on, asking raises
    def __init__(self, n):
        super().__init__()
        self.n = n
        self.future_ = torch.futures.Future()
        self.future_.set_result(None)  # as NCCL's: complete once queued
    def is_completed(self):
        queries[0] += 1
        if broken[0] is not None and self.n >= broken[0]:
            raise RuntimeError("device op failed")
        return self.n <= progress[0] or (errored[0] is not None and self.n >= errored[0])
    def exception(self):
        # NCCL's way: a Work whose communicator failed reads as completed, and holds the error
        return RuntimeError("NCCL error: unhandled system error") if errored[0] is not None and self.n >= errored[0] else None
    def wait(self, timeout=None):
        return True
    def get_future(self):
        return self.future_

class Streams(standin.StandinProcessGroup):
    issued = 0
    def allreduce(self, tensors, opts):
        Streams.issued += 1
        return StreamWork(Streams.issued)

name = sys.argv[2]
dist.Backend.register_backend(name, lambda store, rank, size, timeout: Streams(rank, size), devices=["cpu", "meta"])
flightrec.enable(dir=sys.argv[1], timeout_s=600, poll_s=3600)  # the watchdog asleep: polled by hand below
rec = control.current().recorder
rec.device_timing = DeviceTiming(factory=standin.StandinEvent, capturing=lambda device: False)
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
pg = dist.new_group(backend=name)
t = torch.ones(4, device="meta")
for i in range(40):
    dist.all_reduce(t, group=pg, async_op=True)
steps = []
def poll(reached, fail_from=None, error_from=None):
    progress[0], broken[0], errored[0], queries[0] = reached, fail_from, error_from, 0
    rec.poll_works()
    steps.append({{"progress": reached, "queries": queries[0], "polled": len(rec.polled),
                   "states": "".join(e.state[0] for e in rec.entries() if e.device == "meta")}})
poll(0)
poll(25)
poll(25)
poll(30, fail_from=33)  # the communicator broke at op 33: those ops fail, found one by one
poll(30, error_from=32)  # as NCCL: op 32 reads as completed, holding its error: failed, not completed
poll(40)
print(json.dumps(steps))
dist.destroy_process_group()
flightrec.disable()
"""


def _run(backend: str, fast: str) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if k != "FLIGHTREC"}
    env["FLIGHTREC_FASTPATH"] = fast
    with tempfile.TemporaryDirectory() as out:
        done = subprocess.run([sys.executable, "-c", JOB, out, backend], capture_output=True, text=True, timeout=120,
                              env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


EXPECTED_STATES = ["s" * 40, "c" * 25 + "s" * 15, "c" * 25 + "s" * 15, "c" * 30 + "s" * 2 + "f" * 8,
                   "c" * 30 + "s" + "f" * 9, "c" * 31 + "f" * 9]


@pytest.mark.parametrize("fast", ["1", "0"])
def test_one_stream_is_polled_by_bisection(fast: str) -> None:
    steps = _run("hccl", fast)
    assert [s["states"] for s in steps] == EXPECTED_STATES
    assert [s["polled"] for s in steps] == [40, 15, 15, 2, 1, 0]
    queries = [s["queries"] for s in steps]
    assert queries[0] <= 8 and queries[1] <= 7 and queries[2] <= 6  # the newest, then ~log2(n)
    assert queries[5] == 1  # the newest is done: all are


def test_a_backend_not_known_to_finish_in_order_is_polled_op_by_op() -> None:
    steps = _run("devorder", "1")
    assert [s["states"] for s in steps] == EXPECTED_STATES  # the same answer
    assert [s["queries"] for s in steps] == [40, 40, 15, 15, 2, 1]
