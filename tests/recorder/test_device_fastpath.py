"""The C hot path records device ops (NCCL, HCCL) exactly as the Python wrapper does.

No GPU here: the device is the stand-in of benchmarks/standin.py (a registered Python backend whose
Works wrap already-completed futures, `meta` tensors, host-clock events), extended with all_gather and
a failing op. The same job runs with the C hot path and with the Python wrapper (FLIGHTREC_FASTPATH=0);
every recorded field must agree, and the C run must not have entered the Python device path.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

import pytest
import torch

from flightrec.record import cpp_reader, fastpath
from flightrec.record.device_timing import torch_capture_check
from tests.child import command, env_with_root, facts

ROOT = Path(__file__).resolve().parents[2]


def _run(fast: str, torch_reader: str = "1", job: str = "device_ops") -> dict:
    """A job of tests/recorder/device_jobs.py (`device_ops`), with or without the C hot path and the torch reader."""
    env = {k: v for k, v in os.environ.items() if k != "FLIGHTREC"}
    env["FLIGHTREC_FASTPATH"] = fast
    env["FLIGHTREC_TORCHPEEK"] = torch_reader
    with tempfile.TemporaryDirectory() as out:
        done = subprocess.run(command("tests.recorder.device_jobs", job, out), capture_output=True, text=True,
                              timeout=120, env=env_with_root(env), cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return facts(done.stdout)


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
    assert c["fast"] and c["python_device_calls"] == 0  # no op took patching.call_on_device
    # the device tensors were read by the torch reader where it is built, by torch's getters otherwise
    assert c["reader"] == (mode == "c" and cpp_reader.load() is not None)
    assert len(c["rows"]) == len(py["rows"])
    for ours, reference in zip(c["rows"], py["rows"], strict=True):
        assert ours == reference
    for key in ("returned", "captured", "open", "tables"):
        assert c[key] == py[key], key


def test_a_bare_call_on_the_default_group_is_forced_async_as_in_python() -> None:
    """`all_reduce(t)` on a device tensor of the default group passes fewer positional arguments than
    `async_op`'s position: the C hot path fills the defaults before it (`fastpath._async_fill`) and
    records what the Python wrapper records, with device start and end times, returning None."""
    if not fastpath.available():
        pytest.skip("the C hot path is off or not built")
    c, py = _run("1", job="default_group_ops"), _run("0", job="default_group_ops")
    assert c["fast"] and c["python_device_calls"] == 0 and not py["fast"]
    devices = [row for row in py["rows"] if row["device"] == "meta"]
    assert [row["op"] for row in devices] == ["all_reduce", "all_reduce", "all_reduce", "all_gather"]
    assert all(row["dev_start"] and row["dev_end"] and row["state"] == "completed" and not row["is_async"]
               for row in devices), devices
    assert [row["reduce_op"].rsplit(".", 1)[-1] for row in devices[1:3]] == ["SUM", "MAX"]  # the default, then given
    assert py["returned"] == ["None", "None", "None"]
    assert c["rows"] == py["rows"]
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
