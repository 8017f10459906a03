"""Soak: 200,000 collectives with the recorder on; resident memory must stay flat once the ring is full."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.child import command, env_with_root, facts

ROOT = Path(__file__).resolve().parents[2]
OPS = 200_000
RING = 1000


def test_soak_200k_collectives_flat_memory_no_false_alarm(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    env = env_with_root({"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
    proc = subprocess.run(command("tests.reliability.one_rank_jobs", "soak", tmp_path / "dumps", OPS, RING),
                          capture_output=True, text=True, timeout=110, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = facts(proc.stdout)
    assert got["enabled"] and got["recorded"] == OPS
    assert got["pending"] == got["in_flight"] == got["polled"] == got["by_work"] == got["cpp_open"] == got["slot"] == 0
    assert got["errors"] == [] and got["dumps"] == []  # no watchdog false alarm, nothing swallowed
    assert got["gil_stacks_fired"] == []  # the watchdog thread was never kept from running for a whole limit
    samples = dict(got["samples"])
    full = samples[20_000]  # the ring (1000 entries) is long full; allocator pools have settled
    end = samples[OPS]
    growth = end - full
    figure = (f"soak: {OPS} collectives in {got['seconds']:.1f}s, RSS {full / 2**20:.1f} MiB at 20k ops, "
              f"{end / 2**20:.1f} MiB at {OPS // 1000}k ops (growth {growth / 2**10:+.0f} KiB)")
    with capsys.disabled():
        print("\n" + figure)
    # a leak of 16 bytes per op would add 2.7 MiB over the 180,000 ops measured
    assert growth < 2 * 2**20, figure
