"""Device-event timing for NCCL/HCCL ops, checked with a fake device clock (no GPU in CI).

The fake events run on a device clock that the test advances: an event recorded at device time t
has happened once the clock passes t, exactly as `query()` on a real stream behaves.
"""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Callable

from flightrec.record.device_timing import DeviceTiming
from flightrec.record.entry import Entry
from tests.child import command, env_with_root, facts
from tests.recorder.device_jobs import FakeDevice, FakeEvent

JOBS = "tests.recorder.device_jobs"


def _device_entry(record_id: int) -> Entry:
    entry = Entry(record_id, "0", "coll", "all_reduce", "all_reduce")
    entry.device = "cuda"
    return entry


def test_times_resolve_lazily_and_map_to_the_host_clock() -> None:
    dev = FakeDevice()
    timing = DeviceTiming(factory=dev.event, clock=lambda: 1_000_000_000)
    first = _device_entry(0)  # the first device op also places the anchor (host time known)
    timing.before(first)
    timing.waited(first)
    timing.resolve()
    assert first.t_dev_start_ns == first.t_dev_end_ns == 1_000_000_000
    entry = _device_entry(1)
    dev.queue_ms = 5.0  # the device is busy: this op starts 5 ms after the anchor
    timing.before(entry)
    dev.queue_ms = 12.0  # and ends 7 ms later
    timing.waited(entry)
    dev.now_ms = 10.0
    assert timing.resolve() == 0 and entry.t_dev_end_ns is None  # not run yet: no blocking, no guess
    dev.now_ms = 12.0
    assert timing.resolve() == 1
    assert entry.t_dev_start_ns == 1_000_000_000 + 5_000_000
    assert entry.t_dev_end_ns == 1_000_000_000 + 12_000_000
    assert timing.pending == 0


def test_events_come_from_a_pool() -> None:
    dev = FakeDevice()
    timing = DeviceTiming(factory=dev.event, clock=lambda: 0)
    for i in range(50):
        entry = _device_entry(i)
        timing.before(entry)
        timing.waited(entry)
        dev.now_ms = dev.queue_ms
        timing.resolve()
    assert dev.created <= 3  # the anchor and one start/end pair, reused


class CountingEvent(FakeEvent):
    reads = 0

    def query(self) -> bool:
        CountingEvent.reads += 1
        return super().query()

    def elapsed_time(self, end: FakeEvent) -> float:
        CountingEvent.reads += 1
        return super().elapsed_time(end)


def test_events_of_ops_the_ring_dropped_go_back_unread() -> None:
    """The watchdog reads no event per op: only a dump does (resolve); the ring's dropped ops give
    their events back unread, and a ring larger than `keep_unread` has its oldest read."""
    dev = FakeDevice()
    made: list[CountingEvent] = []

    def event(device: str) -> CountingEvent:
        made.append(CountingEvent(dev))
        return made[-1]

    timing = DeviceTiming(factory=event, clock=lambda: 0, keep_unread=7)
    entries = [_device_entry(i) for i in range(10)]
    for entry in entries:
        timing.before(entry)
        timing.waited(entry, since_issue=False)
        entry.state = "completed"
    dev.now_ms = dev.queue_ms
    CountingEvent.reads = 0
    assert timing.recycle(oldest_kept=3) == 3  # ids 0-2 left the ring: recycled unread
    assert CountingEvent.reads == 0 and timing.pending == 7
    assert all(e.t_dev_start_ns is None for e in entries)
    entries[3].id = 13  # the ring reused id 3's entry for a newer op: its events are not its own now
    assert timing.recycle(oldest_kept=3) == 1 and timing.pending == 6 and CountingEvent.reads == 0
    timing._keep_unread = 4  # a ring larger than the cap: the oldest two over it are read now
    timing.recycle(oldest_kept=3)
    assert timing.pending == 4 and [e.t_dev_start_ns is not None for e in entries[4:]] == [True] * 2 + [False] * 4
    assert timing.resolve() == 4 and timing.pending == 0  # a dump reads the rest
    assert all(e.t_dev_end_ns is not None for e in entries[4:]) and entries[3].t_dev_start_ns is None
    before = len(made)
    for i in range(10, 15):  # the pool serves the next ops: nothing new is made
        entry = _device_entry(i)
        timing.before(entry)
        timing.waited(entry, since_issue=False)
    assert len(made) == before


def test_a_dump_between_a_blocking_ops_completion_and_its_end_event_keeps_the_end() -> None:
    """A blocking op completes (its future, on the watchdog) before its call places the end event; a
    dump reading in that gap takes the start and leaves the record open, so the end still arrives.
    A failed op, or an async one nobody waited on, closes at once with its start alone."""
    dev = FakeDevice()
    timing = DeviceTiming(factory=dev.event, clock=lambda: 0)
    blocking, failed, unwaited = _device_entry(0), _device_entry(1), _device_entry(2)
    unwaited.is_async = True
    for entry in (blocking, failed, unwaited):
        timing.before(entry)
    blocking.state = unwaited.state = "completed"
    failed.state = "failed"
    dev.now_ms = dev.queue_ms
    assert timing.resolve() == 2 and timing.pending == 1  # a failure dump reads, on another thread
    assert blocking.t_dev_start_ns is not None and blocking.t_dev_end_ns is None
    timing.waited(blocking, since_issue=False)  # the call's wait returned: its end goes on the stream
    assert timing.resolve() == 1 and timing.pending == 0
    assert blocking.t_dev_end_ns is not None
    lost = _device_entry(3)  # a blocking op whose end never comes: kept for one read only, never leaked
    timing.before(lost)
    lost.state = "completed"
    timing.resolve()
    timing.resolve()
    assert timing.pending == 0 and lost.t_dev_start_ns is not None and lost.t_dev_end_ns is None


def test_no_device_events_means_host_times_only() -> None:
    def broken(device: str) -> FakeEvent:
        raise RuntimeError("no such device")

    timing = DeviceTiming(factory=broken)
    entry = _device_entry(0)
    timing.before(entry)
    timing.waited(entry)
    assert timing.disabled and timing.pending == 0 and entry.t_dev_start_ns is None


def test_the_wrapper_brackets_device_ops_only() -> None:
    out = subprocess.run(command(JOBS, "wrapper_brackets"), capture_output=True, text=True, timeout=60,
                         env=env_with_root({k: v for k, v in os.environ.items() if k != "FLIGHTREC"}))
    assert out.returncode == 0, out.stderr[-2000:]
    got = facts(out.stdout)
    # the blocking device call was issued async (so its Work can be followed) and bracketed by events
    assert (got["calls"], got["device"], got["device_end"], got["cpu_dev_start"]) == ([True], "cuda", True, None), got


def test_end_events_mark_the_collective_end_not_the_call_return() -> None:
    """The collective's stream finishes later than the call returns: its end is only marked where the
    current stream waits for it (Work.wait), 55 ms here, not at the return (5 ms); waiting does not
    complete a device op (its Work does); a blocking call is timed exactly; inside a graph capture no
    event is recorded."""
    out = subprocess.run(command(JOBS, "stream_ends"), capture_output=True, text=True, timeout=60,
                         env=env_with_root({k: v for k, v in os.environ.items() if k != "FLIGHTREC"}))
    assert out.returncode == 0, out.stderr[-3000:]
    got = facts(out.stdout)
    assert got["timed"] == {"start": 5.0, "end": 55.0, "returned_at": 5.0, "state_after_wait": "started",
                            "state": "completed", "blocking_start": 55.0, "blocking_end": 105.0}, out.stderr[-3000:]
    # counted as captured, no event made, recorded or queried; done at once (it runs at each replay), so
    # the watchdog never waits on it
    assert (got["captured"], got["events_made"], got["captured_state"], got["pending"]) == (1, 0, "completed", 0), got


def test_a_catch_up_on_the_training_thread_never_waits_for_a_lock() -> None:
    """`Recorder.catch_up` runs on the thread that issued an op (`poll_soon`): while the watchdog polls, or
    a dump reads device events, it returns at once instead of waiting (the recorder must never stall
    the training job); the watchdog's own call (`wait=True`) does the work."""
    from flightrec.record.recorder import Recorder
    from flightrec.settings import load_settings

    rec = Recorder(load_settings({}))
    polls: list[str] = []
    rec.poll_works = lambda: polls.append("polled")  # type: ignore[method-assign]
    dev = FakeDevice()
    rec.device_timing = timing = DeviceTiming(factory=dev.event, clock=lambda: 0)
    entry = _device_entry(0)
    timing.before(entry)  # one open record, so a catch-up would recycle

    def on_a_training_thread(call: Callable[[], object]) -> None:  # bounded: a wait would be a hang
        thread = threading.Thread(target=call, daemon=True)
        thread.start()
        thread.join(10.0)
        assert not thread.is_alive(), "the catch-up waited for a lock another thread held"

    with rec._catching_up:  # the watchdog is polling
        on_a_training_thread(rec.catch_up)
    assert polls == []
    with timing._reading:  # a dump is reading events: polled, but not recycled, and not waited for
        on_a_training_thread(rec.catch_up)
        on_a_training_thread(lambda: timing.recycle(oldest_kept=10, wait=False))
        assert timing.pending == 1
    assert polls == ["polled"]
    entry.id = 7  # the ring reused the entry for a newer op: its old record's events go back to the pool
    rec.catch_up(wait=True)
    assert polls == ["polled", "polled"] and timing.pending == 0
