"""Device-event timing for NCCL/HCCL ops, checked with a fake device clock (no GPU in CI).

The fake events run on a device clock that the test advances: an event recorded at device time t
has happened once the clock passes t, exactly as `query()` on a real stream behaves.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from flightrec.record.device_timing import DeviceTiming
from flightrec.record.entry import Entry

ROOT = Path(__file__).resolve().parents[2]


class FakeDevice:
    def __init__(self) -> None:
        self.now_ms = 0.0  # how far the device has executed
        self.queue_ms = 0.0  # device time at which the next recorded event will happen
        self.created = 0

    def event(self, device: str) -> FakeEvent:
        self.created += 1
        return FakeEvent(self)


class FakeEvent:
    def __init__(self, dev: FakeDevice) -> None:
        self.dev = dev
        self.at_ms: float | None = None

    def record(self) -> None:
        self.at_ms = self.dev.queue_ms

    def query(self) -> bool:
        return self.at_ms is not None and self.dev.now_ms >= self.at_ms

    def synchronize(self) -> None:
        self.dev.now_ms = max(self.dev.now_ms, self.at_ms or 0.0)

    def elapsed_time(self, end: FakeEvent) -> float:
        assert self.at_ms is not None and end.at_ms is not None
        return end.at_ms - self.at_ms


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
    code = f"""
import sys
sys.path.insert(0, {str(ROOT)!r})
sys.path.insert(0, {str(ROOT / 'tests' / 'recorder')!r})
import torch, torch.distributed as dist, flightrec, flightrec.arming as control
from flightrec.record.device_timing import DeviceTiming
from flightrec.record.ops import SPEC_BY_API
from flightrec.record.wrapping import _leaf_wrapper
from test_device_timing import FakeDevice
flightrec.enable(dir="/tmp/unused-flightrec")
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
rec = control.current().recorder
dev = FakeDevice()
rec.device_timing = DeviceTiming(factory=dev.event)

class FakeCudaTensor:
    shape, dtype, is_cpu = (4,), torch.float32, False
    class device:
        type = "cuda"

calls = []
def fake_all_reduce(tensor, op=None, group=None, async_op=False):
    calls.append(async_op)
    return None

spec = SPEC_BY_API["all_reduce"].bind_positions(dist.all_reduce.__flightrec_wrapped__)
wrapped = _leaf_wrapper(rec, spec, fake_all_reduce)
wrapped(FakeCudaTensor())
dist.all_reduce(torch.ones(2))
dev.now_ms = 1.0
rec.device_timing.resolve()
device_entry, cpu_entry = rec.entries()
print(calls, device_entry.device, device_entry.t_dev_end_ns is not None, cpu_entry.t_dev_start_ns)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={k: v for k, v in os.environ.items() if k != "FLIGHTREC"})
    # the blocking device call was issued async (so its Work can be followed) and bracketed by events
    assert out.stdout.split() == ["[True]", "cuda", "True", "None"], out.stderr[-2000:]


STREAMS = f"""
import sys
sys.path.insert(0, {str(ROOT)!r})
import torch, torch.distributed as dist, flightrec, flightrec.arming as control
from flightrec.record.device_timing import DeviceTiming
from flightrec.record.ops import SPEC_BY_API
from flightrec.record.wrapping import _leaf_wrapper, _wait_wrapper
flightrec.enable(dir="/tmp/unused-flightrec")
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
rec = control.current().recorder


class Streams:
    # Stand-in device: the current stream and the backend's stream, in ms of device time. An event
    # recorded on the current stream happens when that stream gets there; a Work's wait makes the
    # current stream wait for the collective's end, as NCCL's does; nothing blocks the host.

    def __init__(self):
        self.current = 0.0  # where the current stream's queued work ends
        self.executed = 0.0  # how far the device has run
        self.made = 0
        self.capturing = False

    def event(self, device):
        self.made += 1
        return Event(self)


class Event:
    def __init__(self, streams):
        self.streams, self.at = streams, None

    def record(self):
        self.at = self.streams.current

    def query(self):
        return self.at is not None and self.streams.executed >= self.at

    def synchronize(self):
        self.streams.executed = max(self.streams.executed, self.at or 0.0)

    def elapsed_time(self, end):
        return end.at - self.at


class Work:
    # The collective runs on its own stream from where the current stream was, for `ms`.

    def __init__(self, streams, ms):
        self.streams, self.end = streams, streams.current + ms
        self.done = False

    def wait(self, timeout=None):
        self.streams.current = max(self.streams.current, self.end)  # a stream wait, not a host wait
        return True

    def is_completed(self):
        return self.done

    def get_future(self):
        raise RuntimeError("no future: polled")


class Tensor:
    shape, dtype, is_cpu = (4,), torch.float32, False
    class device:
        type = "cuda"


streams = Streams()
rec.device_timing = DeviceTiming(factory=streams.event, clock=lambda: 10**9, capturing=lambda device: streams.capturing)
works = []
def all_reduce(tensor, op=None, group=None, async_op=False):
    works.append(Work(streams, 50.0))
    return works[-1]

spec = SPEC_BY_API["all_reduce"].bind_positions(dist.all_reduce.__flightrec_wrapped__)
call = _leaf_wrapper(rec, spec, all_reduce)
wait = _wait_wrapper(rec, lambda work, timeout=None: work.wait(timeout))

first = call(Tensor(), async_op=True)  # places the anchor at device time 0
streams.current += 5.0  # the training thread queues 5 ms of its own work, then the collective
work = call(Tensor(), async_op=True)
returned_at = streams.current  # the call returned: the collective has not run yet
streams.current += 20.0  # more compute is queued meanwhile
wait(work)  # the current stream now waits for the collective (ends at 5 + 50 = 55 ms)
pending_after_wait = work is not None and [e for e in rec.entries() if e.device == "cuda"][1].state
wait(first)
blocking = call(Tensor())  # a blocking call: issued async, waited at once
streams.executed = 1000.0
for w in works:
    w.done = True
rec.poll_works()
rec.device_timing.resolve()
a, b, c = [e for e in rec.entries() if e.device == "cuda"]
ms = lambda t: None if t is None else (t - 10**9) / 1e6
print(ms(b.t_dev_start_ns), ms(b.t_dev_end_ns), returned_at, pending_after_wait, b.state,
      ms(c.t_dev_start_ns), ms(c.t_dev_end_ns))
streams.capturing = True
made = streams.made
captured = call(Tensor(), async_op=True)
wait(captured)
print(rec.device_timing.captured, streams.made - made, rec.entries()[-1].state, len(rec.pending))
"""


def test_end_events_mark_the_collective_end_not_the_call_return() -> None:
    """The collective's stream finishes later than the call returns: its end is only marked where the
    current stream waits for it (Work.wait), 55 ms here, not at the return (5 ms); waiting does not
    complete a device op (its Work does); a blocking call is timed exactly; inside a graph capture no
    event is recorded."""
    out = subprocess.run([sys.executable, "-c", STREAMS], capture_output=True, text=True, timeout=60,
                         env={k: v for k, v in os.environ.items() if k != "FLIGHTREC"})
    lines = out.stdout.split("\n")
    assert lines[0].split() == ["5.0", "55.0", "5.0", "started", "completed", "55.0", "105.0"], out.stderr[-3000:]
    # counted as captured, no event made, recorded or queried; done at once (it runs at each replay), so
    # the watchdog never waits on it
    assert lines[1].split() == ["1", "0", "completed", "0"]
