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
    timing.resolve([first])
    assert first.t_dev_start_ns == first.t_dev_end_ns == 1_000_000_000
    entry = _device_entry(1)
    dev.queue_ms = 5.0  # the device is busy: this op starts 5 ms after the anchor
    timing.before(entry)
    dev.queue_ms = 12.0  # and ends 7 ms later
    timing.waited(entry)
    dev.now_ms = 10.0
    assert timing.resolve([first, entry]) == 0 and entry.t_dev_end_ns is None  # not run yet: no blocking, no guess
    assert timing.unread([first, entry]) == 1
    dev.now_ms = 12.0
    assert timing.resolve([first, entry]) == 1
    assert entry.t_dev_start_ns == 1_000_000_000 + 5_000_000
    assert entry.t_dev_end_ns == 1_000_000_000 + 12_000_000
    assert timing.unread([first, entry]) == 0


def test_an_entry_the_ring_reuses_reuses_its_events() -> None:
    """Each ring entry keeps one pair of events and re-records them for each op it holds: steady state
    makes no event, and nothing is filed or given back per op."""
    dev = FakeDevice()
    timing = DeviceTiming(factory=dev.event, clock=lambda: 0)
    entry = _device_entry(0)
    for i in range(50):
        entry.reset(i, "0", "coll", "all_reduce", "all_reduce")
        entry.device = "cuda"
        timing.before(entry)
        timing.waited(entry)
        dev.now_ms = dev.queue_ms
        entry.state = "completed"
        assert timing.resolve([entry]) == 1 and entry.t_dev_end_ns is not None
    assert dev.created == 3  # the anchor and the entry's start/end pair
    other = _device_entry(50)
    other.device = "npu"  # an entry moved to another device's ops gets that device's events
    timing.before(other)
    assert dev.created == 3 + 3 and other.events[0] == "npu"


class CountingEvent(FakeEvent):
    reads = 0

    def query(self) -> bool:
        CountingEvent.reads += 1
        return super().query()

    def elapsed_time(self, end: FakeEvent) -> float:
        CountingEvent.reads += 1
        return super().elapsed_time(end)


def test_events_are_read_by_a_dump_only_and_never_as_another_ops_times() -> None:
    """The watchdog reads no event per op: only a dump does (resolve). An entry the ring reused holds
    its new op's events: the old op's are gone unread, and the new op's are not read as the old one's.
    A reuse while a dump is reading (the training thread runs between its reads) writes nothing."""
    dev = FakeDevice()
    timing = DeviceTiming(factory=lambda device: CountingEvent(dev), clock=lambda: 0)
    entries = [_device_entry(i) for i in range(10)]
    for entry in entries:
        timing.before(entry)
        timing.waited(entry, since_issue=False)
        entry.state = "completed"
    dev.now_ms = dev.queue_ms
    CountingEvent.reads = 0
    reused = entries[3]
    reused.reset(13, "0", "coll", "all_reduce", "all_reduce")  # the ring reused id 3's entry for a newer op
    reused.device = "cuda"
    assert CountingEvent.reads == 0 and timing.unread(entries) == 9
    assert timing.resolve(entries) == 9 and timing.unread(entries) == 0  # id 13 has no events of its own yet
    assert reused.t_dev_start_ns is None and CountingEvent.reads > 0
    timing.before(reused)
    timing.waited(reused, since_issue=False)
    reused.state = "completed"

    class ReusedWhileRead(CountingEvent):
        def elapsed_time(self, end: FakeEvent) -> float:
            reused.reset(23, "0", "coll", "all_reduce", "all_reduce")  # the training thread, mid-read
            return super().elapsed_time(end)

    anchor, at = timing._anchors["cuda"]
    timing._anchors["cuda"] = (ReusedWhileRead(dev), at)
    assert timing.resolve([reused]) == 0
    assert reused.id == 23 and reused.t_dev_start_ns is None and reused.t_dev_end_ns is None
    timing._anchors["cuda"] = (anchor, at)


def test_a_dump_between_a_blocking_ops_completion_and_its_end_event_keeps_the_end() -> None:
    """A blocking op completes (its Work, polled by the watchdog) before its call places the end event; a
    dump reading in that gap takes the start, and a later dump still reads the end. A failed op, or
    an async one nobody waited on, has its start alone; nothing is read twice."""
    dev = FakeDevice()
    timing = DeviceTiming(factory=lambda device: CountingEvent(dev), clock=lambda: 0)
    blocking, failed, unwaited = _device_entry(0), _device_entry(1), _device_entry(2)
    unwaited.is_async = True
    for entry in (blocking, failed, unwaited):
        timing.before(entry)
    blocking.state = unwaited.state = "completed"
    failed.state = "failed"
    dev.now_ms = dev.queue_ms
    ops = [blocking, failed, unwaited]
    assert timing.resolve(ops) == 3 and timing.unread(ops) == 0  # a failure dump reads, on another thread
    assert blocking.t_dev_start_ns is not None and blocking.t_dev_end_ns is None
    reads = CountingEvent.reads
    assert timing.resolve(ops) == 0 and CountingEvent.reads == reads
    timing.waited(blocking, since_issue=False)  # the call's wait returned: its end goes on the stream
    assert timing.unread(ops) == 1 and timing.resolve(ops) == 1 and timing.unread(ops) == 0
    assert blocking.t_dev_end_ns is not None and failed.t_dev_end_ns is None and unwaited.t_dev_end_ns is None


def test_the_times_are_written_only_for_the_op_the_events_timed() -> None:
    """`store_device_times` (C where built) and its Python twin agree: no write once the entry holds
    another op, or its events were re-recorded, or the end read is not this op's."""
    from flightrec.record import device_timing

    stores = {device_timing._store_in_python}
    stores.add(device_timing._c_store())
    for store in stores:
        entry = _device_entry(5)
        entry.timed_start = entry.timed_end = 5
        assert store(entry, 5, 10, 20) and (entry.t_dev_start_ns, entry.t_dev_end_ns) == (10, 20)
        entry.t_dev_start_ns = entry.t_dev_end_ns = None
        entry.timed_end = -1  # the end event is being re-recorded
        assert not store(entry, 5, 10, 20) and entry.t_dev_start_ns is None
        assert store(entry, 5, 10, None) and (entry.t_dev_start_ns, entry.t_dev_end_ns) == (10, None)
        entry.t_dev_start_ns = None
        entry.id = 6  # reused by the ring
        assert not store(entry, 5, 10, None) and entry.t_dev_start_ns is None
    assert len(stores) == 2 or os.environ.get("FLIGHTREC_FASTPATH") == "0"


def test_no_device_events_means_host_times_only() -> None:
    def broken(device: str) -> FakeEvent:
        raise RuntimeError("no such device")

    timing = DeviceTiming(factory=broken)
    entry = _device_entry(0)
    timing.before(entry)
    timing.waited(entry)
    assert timing.disabled and timing.unread([entry]) == 0 and entry.t_dev_start_ns is None
    assert not timing.ready  # the C hot path hands every op to `before`, which records nothing


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
    """`Recorder.catch_up` runs on the thread that issued an op (`poll_soon`): while the watchdog polls
    it returns at once instead of waiting (the recorder must never stall the training job); the
    watchdog's own call (`wait=True`) does the work. A dump reading device events does not hold it up:
    the catch-up does not touch them."""
    from flightrec.record.recorder import Recorder
    from flightrec.settings import load_settings

    rec = Recorder(load_settings({}))
    polls: list[str] = []
    rec.poll_works = lambda: polls.append("polled")  # type: ignore[method-assign]

    def on_a_training_thread(call: Callable[[], object]) -> None:  # bounded: a wait would be a hang
        thread = threading.Thread(target=call, daemon=True)
        thread.start()
        thread.join(10.0)
        assert not thread.is_alive(), "the catch-up waited for a lock another thread held"

    with rec._catching_up:  # the watchdog is polling
        on_a_training_thread(rec.catch_up)
    assert polls == []
    with rec.device_timing._reading:  # a dump is reading events
        on_a_training_thread(rec.catch_up)
    assert polls == ["polled"]
    rec.catch_up(wait=True)
    assert polls == ["polled", "polled"]


def test_events_stay_bounded_in_a_very_large_ring() -> None:
    """In a ring larger than `max_pairs` (FLIGHTREC_BUFFER), the entries of the slots from `max_pairs` on
    get no events: their ops record host times only, with no event made, and the others go on."""
    dev = FakeDevice()
    timing = DeviceTiming(factory=dev.event, clock=lambda: 0, ring_capacity=4, max_pairs=2)
    entries = [_device_entry(i) for i in range(4)]
    for entry in entries:
        timing.before(entry)
        timing.waited(entry, since_issue=False)
        entry.state = "completed"
    assert dev.created == 1 + 2 * 2 and timing.pairs == 2  # the anchor and two pairs
    assert [e.timed_start == e.id for e in entries] == [True, True, False, False] and entries[3].events == ()
    dev.now_ms = dev.queue_ms
    assert timing.resolve(entries) == 2
    entries[0].reset(4, "0", "coll", "all_reduce", "all_reduce")
    entries[0].device = "cuda"
    timing.before(entries[0])  # the ring reuses an entry that has events: timed, nothing made
    assert entries[0].timed_start == 4 and dev.created == 5
