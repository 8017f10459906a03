"""Completion on device-like backends is the Work's, not the call's (NCCL's semantics, on CPU).

A backend registered through `torch.distributed.Backend.register_backend` returns from every call and
from `Work.wait()` at once, and completes its Works later on another thread, as NCCL does with a stream
that is still busy. flightrec must show such an op as running, not completed, until its Work completes,
and its watchdog must fire on it. (No GPU here: this backend is the stand-in for the device.)
"""

from __future__ import annotations

import os
import subprocess
import tempfile

from tests.child import command, env_with_root, facts


def _run(delay: float) -> dict:
    """The `late_backend` job of tests/recorder/device_jobs.py, its Works completing `delay` seconds late."""
    with tempfile.TemporaryDirectory() as out:
        done = subprocess.run(command("tests.recorder.device_jobs", "late_backend", out, delay), capture_output=True,
                              text=True, timeout=90,
                              env=env_with_root({k: v for k, v in os.environ.items() if k != "FLIGHTREC"}))
        assert done.returncode == 0, done.stderr[-3000:]
        return facts(done.stdout)


def test_an_op_is_running_until_its_work_completes_and_the_watchdog_fires_on_it() -> None:
    got = _run(3.0)
    assert got["op"] == "all_reduce" and got["returned"] < 0.5  # the host ran ahead
    assert got["at_return"] in ("enqueued", "started")  # not completed when the call returned
    assert got["final"] == "completed" and got["done_after"] >= 2.9  # completed with its Work
    assert got["dump"] == "timeout"  # the watchdog saw it outlive the 1 s timeout meanwhile


def test_a_quick_op_completes_without_a_dump() -> None:
    got = _run(0.2)
    assert got["final"] == "completed" and got["dump"] is None
