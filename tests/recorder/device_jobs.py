"""Device-like jobs of the recorder tests, on CPU: `python -m tests.recorder.device_jobs JOB ARGS...`
(tests/child.py), and the fake device clock the in-process tests of test_device_timing.py share.

Why a child: each job registers a backend, arms the recorder and wraps torch.distributed for the
whole process. The stand-ins here behave as NCCL/HCCL do where it matters to flightrec: Works that
complete later than the call returns, streams that finish in issue order, events recorded on a
stream the host does not wait for. Each job prints what it saw as one JSON line (`emit`) and the
test asserts on that.
"""

from __future__ import annotations

import gzip
import json
import os
import sys
import threading
import time
from typing import Any

import torch
import torch.distributed as dist

from benchmarks import standin
from tests.child import dispatch, emit


class FakeDevice:
    """A device clock the test advances: an event recorded at device time t has happened once the
    clock passes t, as `query()` on a real stream behaves."""

    def __init__(self) -> None:
        self.now_ms = 0.0  # how far the device has executed
        self.queue_ms = 0.0  # device time at which the next recorded event will happen
        self.created = 0

    def event(self, device: str) -> FakeEvent:
        self.created += 1
        return FakeEvent(self)


class FakeEvent:
    """An event of a FakeDevice."""

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


# --- a Work that completes later than its call returns (tests/recorder/test_late_backend.py) -------

class LateWork(dist._Work):
    """Completes `delay` seconds after it is made, on a thread of its own; its wait returns at once,
    as NCCL's does (the caller's stream waits, not the host)."""

    def __init__(self, tensors: list[torch.Tensor], delay: float) -> None:
        super().__init__()
        self.future_: torch.futures.Future[Any] = torch.futures.Future()
        self.done_ = False

        def finish() -> None:
            time.sleep(delay)
            self.done_ = True
            self.future_.set_result(tensors)

        threading.Thread(target=finish, daemon=True).start()

    def wait(self, timeout: Any = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return self.done_

    def get_future(self) -> torch.futures.Future[Any]:
        return self.future_


class LateGroup(dist.ProcessGroup):
    """The `late` backend: every all_reduce is a LateWork of `delay` seconds."""

    delay = 0.0

    def allreduce(self, tensors: list[torch.Tensor], opts: Any) -> LateWork:
        return LateWork(tensors, LateGroup.delay)

    def getBackendName(self) -> str:  # noqa: N802 - the C++ name the trampoline calls
        return "late"


def late_backend(out: str, delay: str) -> None:
    """One blocking all_reduce on the `late` backend (1 s timeout): how long the call took, the entry's
    state then and once its Work completed, and the reason of any dump written meanwhile."""
    import flightrec
    import flightrec.arming as control

    LateGroup.delay = float(delay)
    dist.Backend.register_backend("late", lambda store, rank, size, timeout: LateGroup(rank, size), devices=["cpu"])
    flightrec.enable(dir=out, timeout_s=1.0)
    dist.init_process_group("late", store=dist.FileStore(os.path.join(out, "store"), 1), rank=0, world_size=1)
    rec = control.current().recorder
    t0 = time.monotonic()
    dist.all_reduce(torch.ones(4))  # blocking: returns at once, done `delay` seconds later
    returned = time.monotonic() - t0
    entry = rec.entries()[-1]
    at_return = entry.state
    dumped = None
    path = os.path.join(out, "rank-00000.json.gz")
    while time.monotonic() - t0 < LateGroup.delay + 5 and entry.state != "completed":
        time.sleep(0.05)
        if dumped is None and os.path.exists(path):
            with open(path, "rb") as handle:
                dumped = json.loads(gzip.decompress(handle.read())).get("reason")
    emit(returned=returned, at_return=at_return, final=entry.state, done_after=time.monotonic() - t0, dump=dumped,
         op=entry.op)


# --- device ops through the C hot path and the Python wrapper (tests/recorder/test_device_fastpath.py) --

class FailedWork(dist._Work):
    """An op the device failed, as NCCL's Work tells it: completed, the error on the Work
    (exception()), raised by its wait; its future completed with the value when the op was queued."""

    def __init__(self) -> None:
        super().__init__()
        self.future_: torch.futures.Future[Any] = torch.futures.Future()
        self.future_.set_result(None)

    def wait(self, timeout: Any = None) -> bool:
        raise RuntimeError("device op failed")

    def is_completed(self) -> bool:
        return True

    def exception(self) -> RuntimeError:
        return RuntimeError("device op failed")

    def get_future(self) -> torch.futures.Future[Any]:
        return self.future_


class DeviceGroup(standin.StandinProcessGroup):
    """benchmarks/standin.py's group with all_gather, and ops that fail while `fail` is set."""

    fail = False

    def _done(self, value: Any) -> Any:
        from torch._C._distributed_c10d import _create_work_from_future

        if DeviceGroup.fail:
            return FailedWork()
        future: torch.futures.Future[Any] = torch.futures.Future()
        future.set_result(value)
        return _create_work_from_future(future)

    def allreduce(self, tensors: list[torch.Tensor], opts: Any) -> Any:
        return self._done(tensors)

    def allgather(self, outputs: Any, inputs: Any, opts: Any) -> Any:
        return self._done(outputs)

    def getBackendName(self) -> str:  # noqa: N802 - the C++ name the trampoline calls
        return "devtest"


def device_ops(out: str) -> None:
    """Device ops of every form (blocking, async waited and not, all_gather, inside a graph capture,
    failed) between two gloo ops: every field of every entry, what the calls returned, and how many
    calls took the Python device path."""
    from torch.distributed import ReduceOp

    import flightrec
    import flightrec.arming as control
    import flightrec.record.wrapping as patching
    from flightrec.record.device_timing import DeviceTiming

    dist.Backend.register_backend("devtest", lambda store, rank, size, timeout: DeviceGroup(rank, size),
                                  devices=["cpu", "meta"])
    flightrec.enable(dir=out, timeout_s=60)
    rec = control.current().recorder
    capturing = [False]
    rec.device_timing = DeviceTiming(factory=standin.StandinEvent, capturing=lambda device: capturing[0])
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    pg = dist.new_group(backend="devtest")
    t = torch.ones(16, device="meta")
    outs = [torch.empty(16, device="meta")]

    dist.all_reduce(torch.ones(2))  # this thread's first wrapped call (its state is made by the Python wrapper)
    python_device_calls = [0]

    def count(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code is patching.call_on_device.__code__:
            python_device_calls[0] += 1

    sys.setprofile(count)
    returned: list[Any] = []
    returned.append(dist.all_reduce(t, ReduceOp.SUM, pg))  # blocking: forced async (True added by position)
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
    DeviceGroup.fail = True
    try:
        dist.all_reduce(t, group=pg)
        returned.append("no error")
    except RuntimeError as exc:
        returned.append(str(exc))
    DeviceGroup.fail = False
    dist.all_reduce(torch.ones(2))  # a gloo op on CPU tensors in between
    dist.all_reduce(t, group=pg)
    sys.setprofile(None)

    _emit_rows(rec, python_device_calls[0], returned)


def _emit_rows(rec: Any, python_device_calls: int, returned: list[Any]) -> None:
    """Every field of every entry once the watchdog polled the ops, and the job's tables, then disarm."""
    import flightrec
    from flightrec.record import fastpath

    deadline = time.monotonic() + 10
    while rec.polled and time.monotonic() < deadline:
        time.sleep(0.05)  # the watchdog polls the Works
    rec.device_timing.resolve(rec.entries())  # as a dump does: events are read only then
    rows = [{
        "seq": e.seq, "pg_seq": e.pg_seq, "peer": e.peer, "root": e.root, "unit": e.unit, "is_async": e.is_async,
        "state": e.state, "group": e.group, "kind": e.kind, "op": e.op, "api": e.api, "reduce_op": str(e.reduce_op),
        "inputs": repr(e.inputs), "outputs": repr(e.outputs), "error": e.error, "thread": e.thread,
        "source": e.source, "device": e.device, "line": None if e.site is None else e.site[0].co_firstlineno,
        "dev_start": e.t_dev_start_ns is not None, "dev_end": e.t_dev_end_ns is not None,
        "completed_at": e.t_complete_ns is not None, "holds_work": e.work is not None} for e in rec.entries()]
    emit(fast=fastpath.available(), reader=fastpath.uses_torch_reader(), python_device_calls=python_device_calls,
         rows=rows,
         returned=[repr(r) for r in returned], captured=rec.device_timing.captured, open=rec.device_timing.unread(rec.entries()),
         tables=[len(rec.pending), len(rec.by_work), len(rec.polled)])
    dist.destroy_process_group()
    flightrec.disable()


def default_group_ops(out: str) -> None:
    """Device ops on the default group with no group argument (`all_reduce(t)`: fewer positional arguments
    than `async_op`'s position, so forcing it async fills the defaults before it), as `device_ops` emits."""
    from torch.distributed import ReduceOp

    import flightrec
    import flightrec.arming as control
    import flightrec.record.wrapping as patching
    from flightrec.record.device_timing import DeviceTiming

    dist.Backend.register_backend("devdefault", lambda store, rank, size, timeout: DeviceGroup(rank, size),
                                  devices=["cpu", "meta"])
    flightrec.enable(dir=out, timeout_s=60)
    rec = control.current().recorder
    rec.device_timing = DeviceTiming(factory=standin.StandinEvent, capturing=lambda device: False)
    dist.init_process_group("devdefault", store=dist.HashStore(), rank=0, world_size=1)
    t = torch.ones(16, device="meta")
    outs = [torch.empty(16, device="meta")]
    dist.all_reduce(t)  # this thread's first wrapped call (its state is made by the Python wrapper)
    python_device_calls = [0]

    def count(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code is patching.call_on_device.__code__:
            python_device_calls[0] += 1

    sys.setprofile(count)
    returned = [dist.all_reduce(t), dist.all_reduce(t, ReduceOp.MAX), dist.all_gather(outs, t)]
    sys.setprofile(None)
    _emit_rows(rec, python_device_calls[0], returned)


# --- one stream's ops, polled (tests/recorder/test_device_polling.py) ------------------------------

class InOrderDevice:
    """The device behind InOrderGroup: how far it has run, and how its Works answer the watchdog."""

    progress = 0  # op n has finished once progress reached n
    queries = 0  # is_completed() calls since the last poll
    broken: int | None = None  # from this op on, asking raises
    errored: int | None = None  # from this op on, a Work reads as completed, holding an error (NCCL's way)


class InOrderWork(dist._Work):
    """Op `n` of the stream; complete once queued (its future), finished once the device got there."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n
        self.future_: torch.futures.Future[Any] = torch.futures.Future()
        self.future_.set_result(None)  # as NCCL's: complete once queued

    def is_completed(self) -> bool:
        InOrderDevice.queries += 1
        if InOrderDevice.broken is not None and self.n >= InOrderDevice.broken:
            raise RuntimeError("device op failed")
        return self.n <= InOrderDevice.progress or (InOrderDevice.errored is not None and self.n >= InOrderDevice.errored)

    def exception(self) -> RuntimeError | None:
        # NCCL's way: a Work whose communicator failed reads as completed, and holds the error
        if InOrderDevice.errored is not None and self.n >= InOrderDevice.errored:
            return RuntimeError("NCCL error: unhandled system error")
        return None

    def wait(self, timeout: Any = None) -> bool:
        return True

    def get_future(self) -> torch.futures.Future[Any]:
        return self.future_


class InOrderGroup(standin.StandinProcessGroup):
    """A group whose all_reduces run on one stream, numbered from 1 in issue order."""

    issued = 0

    def allreduce(self, tensors: list[torch.Tensor], opts: Any) -> InOrderWork:
        InOrderGroup.issued += 1
        return InOrderWork(InOrderGroup.issued)


def _past_the_first_tick() -> None:
    """A watchdog armed with `poll_s=3600` ticks once as it starts, then not for an hour: wait until that
    tick is over, even on a loaded machine, before counting what polls did."""
    time.sleep(2.0)


def stream_polling(out: str, name: str) -> None:
    """40 async ops on InOrderGroup registered as backend `name`, polled by hand as the device
    advances, breaks and errs: per poll, the Work queries it took, the ops left polled, their states."""
    import flightrec
    import flightrec.arming as control
    from flightrec.record.device_timing import DeviceTiming

    dist.Backend.register_backend(name, lambda store, rank, size, timeout: InOrderGroup(rank, size),
                                  devices=["cpu", "meta"])
    flightrec.enable(dir=out, timeout_s=600, poll_s=3600)  # the watchdog asleep: polled by hand below
    rec = control.current().recorder
    rec.device_timing = DeviceTiming(factory=standin.StandinEvent, capturing=lambda device: False)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    pg = dist.new_group(backend=name)
    t = torch.ones(4, device="meta")
    _past_the_first_tick()  # its queries are not counted
    for _ in range(40):
        dist.all_reduce(t, group=pg, async_op=True)
    steps = []

    def poll(reached: int, fail_from: int | None = None, error_from: int | None = None) -> None:
        InOrderDevice.progress, InOrderDevice.broken, InOrderDevice.errored = reached, fail_from, error_from
        InOrderDevice.queries = 0
        rec.poll_works()
        steps.append({"progress": reached, "queries": InOrderDevice.queries, "polled": len(rec.polled),
                      "states": "".join(e.state[0] for e in rec.entries() if e.device == "meta")})

    poll(0)
    poll(25)
    poll(25)
    poll(30, fail_from=33)  # the communicator broke at op 33: those ops fail, found one by one
    poll(30, error_from=32)  # as NCCL: op 32 reads as completed, holding its error: failed, not completed
    poll(40)
    emit(steps=steps)
    dist.destroy_process_group()
    flightrec.disable()


def poll_soon(out: str, name: str) -> None:
    """Ops faster than the watchdog's tick: with the tick an hour away, `poll_soon_at` + 10 blocking ops
    on a device whose ops end at once, first with the recorder's `poll_soon` unplugged (the control),
    then plugged in as armed (a catch-up on the issuing thread): how many of each batch were completed
    1.5 s later (armed: once no more than the last 10 are left to poll, 10 s at most). Then `mixed`:
    `poll_soon_at // 2 + 2` device ops, each followed by two ops of a CPU group (as a job with a gloo
    group beside NCCL's), which turn the ring while `polled` never holds `poll_soon_at` ops. Then
    `async`: `poll_soon_at` + 10 async ops, each waited on: how many of the waits took the Python path
    (`Recorder.device_waited`; the C hot path's wait does its work itself). Then `behind`: 200 async
    ops on a device that runs none of them yet (their Works stay running until the end): how many
    catch-ups ran and how many ops they walked, and how many were completed once the device caught up
    and one more poll ran."""
    from torch._C._distributed_c10d import _create_work_from_future

    import flightrec
    import flightrec.arming as control
    from flightrec.record.device_timing import DeviceTiming

    running: list[Any] = []

    class Behind(standin.StandinProcessGroup):
        def allreduce(self, tensors: list[torch.Tensor], opts: Any) -> Any:
            later: torch.futures.Future[list[torch.Tensor]] = torch.futures.Future()
            running.append((later, tensors))
            return _create_work_from_future(later)

    dist.Backend.register_backend(name, lambda store, rank, size, timeout: standin.StandinProcessGroup(rank, size),
                                  devices=["cpu", "meta"])
    dist.Backend.register_backend(name + "behind", lambda store, rank, size, timeout: Behind(rank, size),
                                  devices=["cpu", "meta"])
    flightrec.enable(dir=out, timeout_s=600, poll_s=3600)  # the tick an hour away
    rec = control.current().recorder
    rec.device_timing = DeviceTiming(factory=standin.StandinEvent, capturing=lambda device: False)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    pg = dist.new_group(backend=name)
    behind = dist.new_group(backend=name + "behind")
    t = torch.ones(4, device="meta")
    _past_the_first_tick()
    rec.poll_works()
    wake, batches, threads, walked = rec.poll_soon, {}, set(), []

    def noting_the_thread() -> None:
        threads.add(threading.current_thread().name)
        walked.append(len(rec.polled))
        type(rec).poll_works(rec)

    cpu = torch.ones(2)
    python_waits = []
    waited_in_python = rec.device_waited

    def noting_the_wait(entry: Any, work: Any) -> None:
        python_waits.append(entry.id)
        waited_in_python(entry, work)

    rec.device_waited = noting_the_wait  # type: ignore[method-assign]
    batches_run = (("unplugged", None), ("armed", wake), ("mixed", wake), ("async", wake), ("behind", wake))
    for label, plugged in batches_run:
        rec.poll_soon = plugged
        first = rec.ring.recorded
        walked.clear()
        python_waits.clear()
        rec.poll_works = noting_the_thread  # type: ignore[method-assign]
        works = []  # the behind batch's Works, held as a training loop holds what it will wait on
        for _ in range({"mixed": rec.poll_soon_at // 2 + 2, "behind": 200}.get(label, rec.poll_soon_at + 10)):
            if label == "behind":
                works.append(dist.all_reduce(t, group=behind, async_op=True))
                continue
            if label == "async":
                dist.all_reduce(t, group=pg, async_op=True).wait()
                continue
            dist.all_reduce(t, group=pg)
            if label == "mixed":
                dist.all_reduce(cpu)
                dist.all_reduce(cpu)
        del rec.poll_works
        deadline = time.monotonic() + (10.0 if label == "armed" else 1.5)
        while time.monotonic() < deadline and (label != "armed" or len(rec.polled) > 10):
            time.sleep(0.05)
        mine = [e for e in rec.entries() if e.id >= first and e.device == "meta"]
        batches[label] = {"ops": len(mine), "completed": sum(e.state == "completed" for e in mine),
                          "python_waits": len(python_waits)}
        if label == "behind":
            batches[label].update(catch_ups=len(walked), walked=sum(walked))
            for later, tensors in running:
                later.set_result(tensors)  # the device catches up
        rec.poll_works()  # by hand: the next batch starts with nothing left to poll
        if label == "behind":
            batches[label]["completed_after"] = sum(e.state == "completed" for e in mine)
    emit(poll_soon_at=rec.poll_soon_at, batches=batches, plugged_is_the_catch_up=wake == rec.catch_up_due,
         polled_on=sorted(threads))
    dist.destroy_process_group()
    flightrec.disable()


def dropped_events(out: str, name: str) -> None:
    """Ops never polled (the watchdog's tick an hour away, no catch-up) in a 16-entry ring: the ring wraps
    over pending entries, so each op gets a new entry. Emits how many stand-in events 100 blocking ops
    made and how many of the ring's entries read device start and end times."""
    import flightrec
    import flightrec.arming as control
    from flightrec.record import fastpath
    from flightrec.record.device_timing import DeviceTiming

    dist.Backend.register_backend(name, lambda store, rank, size, timeout: standin.StandinProcessGroup(rank, size),
                                  devices=["cpu", "meta"])
    flightrec.enable(dir=out, timeout_s=600, poll_s=3600, buffer=16)
    rec = control.current().recorder
    rec.device_timing = DeviceTiming(factory=standin.StandinEvent, capturing=lambda device: False,
                                     ring_capacity=rec.ring.capacity)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    pg = dist.new_group(backend=name)
    t = torch.ones(4, device="meta")
    _past_the_first_tick()
    rec.poll_soon = None  # no catch-up either: nothing polls these ops
    made = standin.StandinEvent.created
    for _ in range(100):
        dist.all_reduce(t, group=pg)
    ring = [e for e in rec.entries() if e.device == "meta"]
    rec.device_timing.resolve(ring)
    emit(events_made=standin.StandinEvent.created - made, ring=len(ring), pending=sum(e.state == "started" for e in ring),
         timed=sum(e.t_dev_start_ns is not None and e.t_dev_end_ns is not None for e in ring),
         fast=fastpath.available())
    dist.destroy_process_group()
    flightrec.disable()


# --- device events around the wrapper's calls (tests/recorder/test_device_timing.py) ---------------

class DeviceTensor:
    """Just what the wrapper reads of a CUDA tensor."""

    shape, dtype, is_cpu = (4,), torch.float32, False

    class device:  # noqa: N801 - torch's attribute name
        type = "cuda"


def wrapper_brackets() -> None:
    """One call on a CUDA tensor through the leaf wrapper, one gloo op: how the device call was
    issued, and which entry got device times."""
    import flightrec
    import flightrec.arming as control
    from flightrec.record.device_timing import DeviceTiming
    from flightrec.record.ops import SPEC_BY_API
    from flightrec.record.wrapping import leaf_wrapper

    flightrec.enable(dir="/tmp/unused-flightrec")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    rec = control.current().recorder
    dev = FakeDevice()
    rec.device_timing = DeviceTiming(factory=dev.event)
    calls = []

    def fake_all_reduce(tensor: Any, op: Any = None, group: Any = None, async_op: bool = False) -> None:
        calls.append(async_op)

    spec = SPEC_BY_API["all_reduce"].bind_positions(dist.all_reduce.__flightrec_wrapped__)
    wrapped = leaf_wrapper(rec, spec, fake_all_reduce)
    wrapped(DeviceTensor())
    dist.all_reduce(torch.ones(2))
    dev.now_ms = 1.0
    rec.device_timing.resolve(rec.entries())
    device_entry, cpu_entry = rec.entries()
    emit(calls=calls, device=device_entry.device, device_end=device_entry.t_dev_end_ns is not None,
         cpu_dev_start=cpu_entry.t_dev_start_ns)


class StreamClock:
    """Stand-in device: the current stream and the backend's stream, in ms of device time. An event
    recorded on the current stream happens when that stream gets there; a Work's wait makes the
    current stream wait for the collective's end, as NCCL's does; nothing blocks the host."""

    def __init__(self) -> None:
        self.current = 0.0  # where the current stream's queued work ends
        self.executed = 0.0  # how far the device has run
        self.made = 0
        self.capturing = False

    def event(self, device: str) -> ClockEvent:
        self.made += 1
        return ClockEvent(self)


class ClockEvent:
    """An event on the current stream of a StreamClock."""

    def __init__(self, streams: StreamClock) -> None:
        self.streams, self.at = streams, None

    def record(self) -> None:
        self.at = self.streams.current

    def query(self) -> bool:
        return self.at is not None and self.streams.executed >= self.at

    def synchronize(self) -> None:
        self.streams.executed = max(self.streams.executed, self.at or 0.0)

    def elapsed_time(self, end: ClockEvent) -> float:
        return end.at - self.at


class StreamedWork:
    """The collective runs on its own stream from where the current stream was, for `ms`."""

    def __init__(self, streams: StreamClock, ms: float) -> None:
        self.streams, self.end = streams, streams.current + ms
        self.done = False

    def wait(self, timeout: Any = None) -> bool:
        self.streams.current = max(self.streams.current, self.end)  # a stream wait, not a host wait
        return True

    def is_completed(self) -> bool:
        return self.done

    def get_future(self) -> Any:
        raise RuntimeError("no future: polled")


def stream_ends() -> None:
    """Async and blocking device calls on a StreamClock, then one inside a graph capture: the
    collective's device start and end (ms), where the call returned, its state after the wait, a
    blocking call's times; then what the captured call made and left."""
    import flightrec
    import flightrec.arming as control
    from flightrec.record.device_timing import DeviceTiming
    from flightrec.record.ops import SPEC_BY_API
    from flightrec.record.wrapping import leaf_wrapper, wait_wrapper

    flightrec.enable(dir="/tmp/unused-flightrec")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    rec = control.current().recorder
    streams = StreamClock()
    rec.device_timing = DeviceTiming(factory=streams.event, clock=lambda: 10**9,
                                     capturing=lambda device: streams.capturing)
    works: list[StreamedWork] = []

    def all_reduce(tensor: Any, op: Any = None, group: Any = None, async_op: bool = False) -> StreamedWork:
        works.append(StreamedWork(streams, 50.0))
        return works[-1]

    spec = SPEC_BY_API["all_reduce"].bind_positions(dist.all_reduce.__flightrec_wrapped__)
    call = leaf_wrapper(rec, spec, all_reduce)
    wait = wait_wrapper(rec, lambda work, timeout=None: work.wait(timeout))

    first = call(DeviceTensor(), async_op=True)  # places the anchor at device time 0
    streams.current += 5.0  # the training thread queues 5 ms of its own work, then the collective
    work = call(DeviceTensor(), async_op=True)
    returned_at = streams.current  # the call returned: the collective has not run yet
    streams.current += 20.0  # more compute is queued meanwhile
    wait(work)  # the current stream now waits for the collective (ends at 5 + 50 = 55 ms)
    state_after_wait = [e for e in rec.entries() if e.device == "cuda"][1].state
    wait(first)
    call(DeviceTensor())  # a blocking call: issued async, waited at once
    streams.executed = 1000.0
    for w in works:
        w.done = True
    rec.poll_works()
    rec.device_timing.resolve(rec.entries())
    _, b, c = [e for e in rec.entries() if e.device == "cuda"]

    def ms(t: int | None) -> float | None:
        return None if t is None else (t - 10**9) / 1e6

    timed = {"start": ms(b.t_dev_start_ns), "end": ms(b.t_dev_end_ns), "returned_at": returned_at,
             "state_after_wait": state_after_wait, "state": b.state, "blocking_start": ms(c.t_dev_start_ns),
             "blocking_end": ms(c.t_dev_end_ns)}
    streams.capturing = True
    made = streams.made
    captured = call(DeviceTensor(), async_op=True)
    wait(captured)
    emit(timed=timed, captured=rec.device_timing.captured, events_made=streams.made - made,
         captured_state=rec.entries()[-1].state, pending=len(rec.pending))


JOBS = {f.__name__: f for f in (late_backend, device_ops, default_group_ops, stream_polling, poll_soon, dropped_events,
                                wrapper_brackets, stream_ends)}

if __name__ == "__main__":
    dispatch(JOBS)
