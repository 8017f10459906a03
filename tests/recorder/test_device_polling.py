"""The watchdog polls a device stream's pending ops in O(log n) Work queries, not one per op.

NCCL and HCCL run each group's collectives on one stream, so their Works finish in issue order: the
newest done means all are done, and bisection finds where the done ones end. A Work that reads as
completed while holding an error (NCCL's, once its communicator failed) is failed, not completed. No GPU here: the backend
is a Python ProcessGroup registered as `hccl` (torch_npu registers HCCL the same way) on `meta`
tensors, whose Works finish in order as a device's "progress" advances; a second run registers it
under another name, which gets no such trust (one query per op), and must end in the same states.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

import pytest

from flightrec.record import fastpath
from tests.child import command, env_with_root, facts

ROOT = Path(__file__).resolve().parents[2]


def _run(backend: str, fast: str) -> list[dict]:
    """The `stream_polling` job of tests/recorder/device_jobs.py, its group registered as `backend`."""
    env = {k: v for k, v in os.environ.items() if k != "FLIGHTREC"}
    env["FLIGHTREC_FASTPATH"] = fast
    with tempfile.TemporaryDirectory() as out:
        done = subprocess.run(command("tests.recorder.device_jobs", "stream_polling", out, backend), capture_output=True,
                              text=True, timeout=120, env=env_with_root(env), cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return facts(done.stdout)["steps"]


EXPECTED_STATES = ["s" * 40, "c" * 25 + "s" * 15, "c" * 25 + "s" * 15, "c" * 30 + "s" * 2 + "f" * 8,
                   "c" * 30 + "s" + "f" * 9, "c" * 31 + "f" * 9]


@pytest.mark.parametrize("fast", ["1", "0"])
def test_one_stream_is_polled_by_bisection(fast: str) -> None:
    steps = _run("hccl", fast)
    assert [s["states"] for s in steps] == EXPECTED_STATES
    assert [s["polled"] for s in steps] == [40, 15, 15, 2, 1, 0]
    queries = [s["queries"] for s in steps]
    assert queries[0] <= 8 and queries[1] <= 8 and queries[2] <= 6  # the newest, the one before it, then ~log2(n)
    assert queries[5] == 1  # the newest is done: all are


def test_a_backend_not_known_to_finish_in_order_is_polled_op_by_op() -> None:
    steps = _run("devorder", "1")
    assert [s["states"] for s in steps] == EXPECTED_STATES  # the same answer
    assert [s["queries"] for s in steps] == [40, 40, 15, 15, 2, 1]


@pytest.mark.parametrize("fast", ["1", "0"])
def test_ops_faster_than_the_tick_are_polled_by_the_thread_that_issues_them(fast: str) -> None:
    """An op filed `poll_soon_at` ids after the oldest in `polled` polls them at once on the issuing thread (C hot path and Python
    wrapper alike; not by waking the watchdog, which then fought that thread for the GIL), so ops that
    outrun the watchdog's tick are seen complete before the ring wraps over them; unplugged, none is."""
    env = {k: v for k, v in os.environ.items() if k != "FLIGHTREC"}
    env["FLIGHTREC_FASTPATH"] = fast
    with tempfile.TemporaryDirectory() as out:
        done = subprocess.run(command("tests.recorder.device_jobs", "poll_soon", out, "devsoon"), capture_output=True,
                              text=True, timeout=120, env=env_with_root(env), cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = facts(done.stdout)
    assert seen["plugged_is_the_catch_up"] and seen["poll_soon_at"] == 16
    assert seen["polled_on"] == ["MainThread"]  # the thread issuing the ops, with the watchdog's tick an hour away
    ops = seen["poll_soon_at"] + 10
    unplugged = seen["batches"]["unplugged"]
    assert (unplugged["ops"], unplugged["completed"]) == (ops, 0), unplugged
    assert seen["batches"]["armed"]["ops"] == ops and seen["batches"]["armed"]["completed"] >= seen["poll_soon_at"]
    # async ops, each waited on: an op is filed after the catch-up it makes due, so that catch-up cannot
    # complete it before its caller's wait, which then finds its op: the C hot path's wait stays in C,
    # the Python wrapper's notes every op's end (filed before, a catch-up's op was a wait of neither)
    waited = seen["batches"]["async"]
    assert waited["ops"] == ops and waited["completed"] >= seen["poll_soon_at"], waited
    assert waited["python_waits"] == (0 if fast == "1" else ops), waited
    # counted in ids, not in ops polled: 10 device ops, each followed by 2 CPU ops (3 ids each), are polled
    # at the 7th (16 ids on), before the ring wraps over them; by count (10 < 16), none would be yet
    mixed = seen["batches"]["mixed"]
    assert mixed["ops"] == seen["poll_soon_at"] // 2 + 2 and mixed["completed"] >= 6, mixed
    # a device 200 ops behind: each catch-up that leaves n ops running puts the next n ids on (16, 33, 67,
    # 135: 4 catch-ups walking ~255 ops); at a fixed 16 ids, 12 would walk ~1,300. None completes early
    behind = seen["batches"]["behind"]
    assert behind["ops"] == 200 and behind["completed"] == 0, behind
    assert 3 <= behind["catch_ups"] <= 5 and behind["walked"] <= 400, behind
    assert behind["completed_after"] == 200, behind


@pytest.mark.parametrize("fast", ["1", "0"])
def test_an_entry_the_ring_drops_while_pending_hands_its_events_to_the_next(fast: str) -> None:
    """Ops never polled (watchdog asleep, no catch-up) in a 16-entry ring: each op takes a new entry, as the
    one in its slot is still pending, and that entry's events with it (nothing reads them: dumps read the
    ring), so 100 ops make 16 pairs, not 100; every op in the ring still reads device times."""
    env = {k: v for k, v in os.environ.items() if k != "FLIGHTREC"}
    env["FLIGHTREC_FASTPATH"] = fast
    with tempfile.TemporaryDirectory() as out:
        done = subprocess.run(command("tests.recorder.device_jobs", "dropped_events", out, "devdrop"),
                              capture_output=True, text=True, timeout=120, env=env_with_root(env), cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = facts(done.stdout)
    assert seen["fast"] == (fast == "1" and fastpath.available())
    assert seen["ring"] == 16 and seen["pending"] == 16  # never polled: each slot's op still pending
    assert seen["timed"] == 16
    assert seen["events_made"] == 1 + 2 * 16  # the anchor and one pair per slot
