"""The C hot path records device ops (NCCL, HCCL) exactly as the Python wrapper does.

No GPU here: the device is the stand-in of benchmarks/standin.py (a registered Python backend whose
Works wrap already-completed futures, `meta` tensors, host-clock events), extended with all_gather and
a failing op. The same job runs with the C hot path and with the Python wrapper (FLIGHTREC_FASTPATH=0);
every recorded field must agree, and the C run must not have entered the Python device path.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from flightrec.record import fastpath
from flightrec.record.device_timing import torch_capture_check

ROOT = Path(__file__).resolve().parents[2]

JOB = f"""
import json, sys, time
sys.path.insert(0, {str(ROOT)!r})
import torch, torch.distributed as dist
from torch.distributed import ReduceOp
from torch._C._distributed_c10d import _create_work_from_future
import flightrec, flightrec.arming as control, flightrec.record.wrapping as patching
from flightrec.record import fastpath
from flightrec.record.device_timing import DeviceTiming
from benchmarks import standin

class FailedWork(dist._Work):
    # an op the device failed, as NCCL's Work tells it: completed, the error on the Work (exception()),
    # raised by its wait; its future completed with the value when the op was queued
    def __init__(self):
        super().__init__()
        self.future_ = torch.futures.Future()
        self.future_.set_result(None)
    def wait(self, timeout=None):
        raise RuntimeError("device op failed")
    def is_completed(self):
        return True
    def exception(self):
        return RuntimeError("device op failed")
    def get_future(self):
        return self.future_

class Devices(standin.StandinProcessGroup):
    fail = False
    def _done(self, value):
        if Devices.fail:
            return FailedWork()
        future = torch.futures.Future()
        future.set_result(value)
        return _create_work_from_future(future)
    def allreduce(self, tensors, opts):
        return self._done(tensors)
    def allgather(self, outputs, inputs, opts):
        return self._done(outputs)
    def getBackendName(self):
        return "devtest"

dist.Backend.register_backend("devtest", lambda store, rank, size, timeout: Devices(rank, size), devices=["cpu", "meta"])
flightrec.enable(dir=sys.argv[1], timeout_s=60)
rec = control.current().recorder
capturing = [False]
rec.device_timing = DeviceTiming(factory=standin.StandinEvent, capturing=lambda device: capturing[0])
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
pg = dist.new_group(backend="devtest")
t = torch.ones(16, device="meta")
outs = [torch.empty(16, device="meta")]

dist.all_reduce(torch.ones(2))  # this thread's first wrapped call (its state is made by the Python wrapper)
python_device_calls = [0]
def count(frame, event, arg):
    if event == "call" and frame.f_code is patching._call_on_device.__code__:
        python_device_calls[0] += 1
sys.setprofile(count)
returned = []
returned.append(dist.all_reduce(t, ReduceOp.SUM, pg))  # blocking: forced async (keyword added)
returned.append(dist.all_reduce(t, group=pg))
returned.append(dist.all_reduce(t, ReduceOp.MAX, pg, False))  # async_op=False given positionally
returned.append(dist.all_reduce(t, group=pg, async_op=False))  # and as a keyword
work = dist.all_reduce(t, ReduceOp.SUM, pg, True)
returned.append(type(work).__name__)
work.wait()  # its end event goes where the current stream waits
dist.all_reduce(t, group=pg, async_op=True)  # nobody waits: a start time only
returned.append(dist.all_gather(outs, t, group=pg))  # a list of device tensors
capturing[0] = True  # a graph capture begins: nothing recorded on the stream, done at once
returned.append(dist.all_reduce(t, group=pg))
work = dist.all_reduce(t, group=pg, async_op=True)
work.wait()
capturing[0] = False
Devices.fail = True
try:
    dist.all_reduce(t, group=pg)
    returned.append("no error")
except RuntimeError as exc:
    returned.append(str(exc))
Devices.fail = False
dist.all_reduce(torch.ones(2))  # a gloo op on CPU tensors in between
dist.all_reduce(t, group=pg)
sys.setprofile(None)

deadline = time.monotonic() + 10
while rec.polled and time.monotonic() < deadline:
    time.sleep(0.05)  # the watchdog polls the Works
rec.device_timing.resolve()  # as a dump does: events are read only then
rows = []
for e in rec.entries():
    rows.append({{
        "seq": e.seq, "pg_seq": e.pg_seq, "peer": e.peer, "root": e.root, "unit": e.unit, "is_async": e.is_async,
        "state": e.state, "group": e.group, "kind": e.kind, "op": e.op, "api": e.api, "reduce_op": str(e.reduce_op),
        "inputs": repr(e.inputs), "outputs": repr(e.outputs), "error": e.error, "thread": e.thread,
        "source": e.source, "device": e.device, "line": None if e.site is None else e.site[0].co_firstlineno,
        "dev_start": e.t_dev_start_ns is not None, "dev_end": e.t_dev_end_ns is not None,
        "completed_at": e.t_complete_ns is not None, "holds_work": e.work is not None}})
print(json.dumps({{"fast": fastpath.available(), "python_device_calls": python_device_calls[0], "rows": rows,
                  "returned": [repr(r) for r in returned], "captured": rec.device_timing.captured,
                  "open": rec.device_timing.pending, "tables": [len(rec.pending), len(rec.by_work), len(rec.polled)]}}))
dist.destroy_process_group()
flightrec.disable()
"""


def _run(fast: str, torch_reader: str = "1") -> dict:
    env = {k: v for k, v in os.environ.items() if k != "FLIGHTREC"}
    env["FLIGHTREC_FASTPATH"] = fast
    env["FLIGHTREC_TORCHPEEK"] = torch_reader
    with tempfile.TemporaryDirectory() as out:
        done = subprocess.run([sys.executable, "-c", JOB, out], capture_output=True, text=True, timeout=120, env=env,
                              cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def runs() -> dict[str, dict]:
    return {"c": _run("1"), "c-no-reader": _run("1", torch_reader="0"), "python": _run("0")}


def test_the_python_wrapper_records_device_ops(runs: dict[str, dict]) -> None:
    got = runs["python"]
    assert not got["fast"] and got["python_device_calls"] > 0
    devices = [row for row in got["rows"] if row["device"] == "meta"]
    assert len(devices) == 11 and [row["device"] for row in got["rows"]].count("cpu") == 2
    # blocking and waited async ops have device start and end times; the unwaited one a start only
    assert [(row["dev_start"], row["dev_end"]) for row in devices[:5]] == [(True, True)] * 5
    assert (devices[5]["dev_start"], devices[5]["dev_end"]) == (True, False)
    assert devices[6]["op"] == "all_gather" and devices[6]["dev_end"]
    # captured into a graph: no event recorded, completed at once, counted
    assert [(row["dev_start"], row["state"]) for row in devices[7:9]] == [(False, "completed")] * 2
    assert got["captured"] == 2
    assert devices[9]["state"] == "failed" and "device op failed" in devices[9]["error"]
    assert all(row["state"] == "completed" for i, row in enumerate(devices) if i != 9)
    assert got["returned"][-1] == "'device op failed'" and got["returned"][4] == "'Work'"
    assert got["open"] == 0 and got["tables"] == [0, 0, 0]  # every op settled, every event resolved


@pytest.mark.parametrize("mode", ["c", "c-no-reader"])
def test_the_c_hot_path_records_device_ops_as_the_python_wrapper_does(runs: dict[str, dict], mode: str) -> None:
    """With the torch reader (flightrec build-ext) and without it (tensors read through torch's getters)."""
    if not fastpath.available():
        pytest.skip("the C hot path is off or not built")
    c, py = runs[mode], runs["python"]
    assert c["fast"] and c["python_device_calls"] == 0  # no op took patching._call_on_device
    assert len(c["rows"]) == len(py["rows"])
    for ours, reference in zip(c["rows"], py["rows"], strict=True):
        assert ours == reference
    for key in ("returned", "captured", "open", "tables"):
        assert c[key] == py[key], key


def test_the_capture_query_is_resolved_once_per_device_type() -> None:
    """`meta` has no module (no lookup through torch's module __getattr__ per op); CUDA's query is
    torch.cuda's own, only where CUDA is there."""
    assert torch_capture_check("meta") is None
    assert torch_capture_check("cpu") is None
    if torch.cuda.is_available():
        assert torch_capture_check("cuda") is torch.cuda.is_current_stream_capturing
    else:
        assert torch_capture_check("cuda") is None
