"""Device-side start/end times of ops on NCCL / HCCL (CUDA, Ascend NPU), resolved lazily.

The CPU returns from a device collective before the device runs it, so the host clock says nothing
about when it ran. The collective runs on the backend's own stream, which Python cannot reach; what
it can reach is the current stream, which the backend's stream waits for before the op (so an event
recorded there before the call marks when the op could start) and which waits for the op when the
Work is waited on (so an event recorded there right after `Work.wait()` marks when the op had ended,
for a blocking call exactly: nothing else is queued between the two). An end event recorded when
an async call returns would mark nothing: the current stream does not wait for the op until then.
An op nobody waits on gets a start time only.

Events are torch's device-generic `torch.Event` (CUDA and, with torch_npu, Ascend). The training
thread only records them (the C hot path does `before` / `waited`'s common case itself, reading the
fields below: `_fastpath.c` "device events"; these methods stay the reference). They are read (`query()`, non-blocking, then converted to the host's
monotonic clock through an anchor event whose host time is known) only when a dump needs them: an
op's events stay with it while it is in the ring, and go back to the pool unread once the ring has
dropped it (`recycle`: each watchdog tick, and `Recorder.catch_up`), so steady state allocates
nothing and reads nothing.
Why not read every op as it completes: on an H200 that cost the watchdog ~9 µs per op with the GIL
held (a query and two `elapsed_time` calls, ~4 µs of them device calls), more than all the rest of
the recorder's work per op (docs/overhead.md). Inside a CUDA-graph capture nothing is
recorded, queried or synchronized (it would break or alter the capture): those ops are counted
(`captured`) and have no device times.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from .. import log
from .entry import Entry


class TimingEvent(Protocol):
    def record(self) -> None: ...
    def query(self) -> bool: ...
    def synchronize(self) -> None: ...
    def elapsed_time(self, end: Any) -> float: ...  # milliseconds


EventFactory = Callable[[str], TimingEvent]
_UNRESOLVED: Any = object()  # a device type whose capture query is not looked up yet


def torch_event_factory(device_type: str) -> TimingEvent:
    import torch

    return torch.Event(device=device_type, enable_timing=True)  # type: ignore[return-value]


def torch_capture_check(device_type: str) -> Callable[[], bool] | None:
    """The call that says whether the current stream of `device_type` is being captured into a graph
    (`torch.cuda.is_current_stream_capturing`; torch_npu's `torch.npu` when it offers the same call),
    or None when that device has none here (a CPU build of torch, `meta`): nothing can be capturing.

    Why resolved once per device type: looking it up per op cost ~1-2 µs (`torch.meta` is a miss
    through torch's module `__getattr__`, `torch.cuda.is_available()` ~0.8 µs); the query itself must
    still run on every op, as a capture can begin between any two calls."""
    import torch

    module = getattr(torch, device_type, None) if device_type.isidentifier() else None
    check = getattr(module, "is_current_stream_capturing", None)
    available = getattr(module, "is_available", None)
    if check is None or (available is not None and not available()):
        return None
    return check  # type: ignore[no-any-return]


def torch_capturing(device_type: str) -> bool:
    """Whether the current stream of `device_type` is being captured into a graph (resolved per call:
    `DeviceTiming` resolves the check once per device type instead)."""
    check = torch_capture_check(device_type)
    return check is not None and bool(check())


class DeviceTiming:
    """Brackets device ops with events and turns them into t_dev_start_ns / t_dev_end_ns."""

    def __init__(self, factory: EventFactory = torch_event_factory, clock: Callable[[], int] = time.monotonic_ns,
                 pool_limit: int = 4096, capturing: Callable[[str], bool] = torch_capturing,
                 open_limit: int = 65536, keep_unread: int = 8192) -> None:
        self._factory = factory
        self._clock = clock
        self._capturing = capturing
        # device type -> its capture query (None: that device cannot capture), resolved at its first op
        self._capture_checks: dict[str, Callable[[], bool] | None] = {}
        self._pools: dict[str, list[TimingEvent]] = {}
        self._anchors: dict[str, tuple[TimingEvent, int]] = {}
        # entry id -> [entry, device, start event, end event or None]: the end is set in place
        self._open: dict[int, list[Any]] = {}
        self._pool_limit = pool_limit
        self._open_limit = open_limit
        self._keep_unread = keep_unread  # past this many open records (a ring larger than it), the oldest are read
        # recycle (the watchdog, or a training thread's catch-up) and resolve (a dump, on any thread) never
        # run at once: an event given back twice would time two ops. The training thread's before/waited take no lock.
        self._reading = threading.Lock()
        self.disabled = False
        self.captured = 0  # device ops issued inside a graph capture: not timed

    def _capture_check(self, device: str) -> Callable[[], bool] | None:
        """`device`'s capture query, looked up at its first op (the hot path reads `_capture_checks`)."""
        check = self._capture_checks.get(device, _UNRESOLVED)
        if check is _UNRESOLVED:
            if self._capturing is torch_capturing:
                check = torch_capture_check(device)
            else:  # an injected query (tests): asked on every op, as given
                capturing = self._capturing
                check = lambda: capturing(device)  # noqa: E731
            self._capture_checks[device] = check
        return check  # type: ignore[return-value]

    def _anchor(self, device: str) -> tuple[TimingEvent, int]:
        """An event whose host time is known: device times are measured from it."""
        anchor = self._anchors.get(device)
        if anchor is None:
            event = self._factory(device)
            event.record()
            event.synchronize()
            anchor = self._anchors[device] = (event, self._clock())
        return anchor

    def before(self, entry: Entry) -> bool:
        """The op is about to be issued: a start event on the current stream. True when the current
        stream is being captured into a graph: then nothing is recorded (the op runs at each replay)."""
        device = entry.device
        if device == "cpu":
            return False  # an op of a late-completing backend on CPU tensors: no device to time
        try:
            check = self._capture_checks.get(device, _UNRESOLVED)
            if check is _UNRESOLVED:
                check = self._capture_check(device)
            if check is not None and check():
                self.captured += 1
                return True
        except Exception as exc:  # noqa: BLE001 - cannot tell: never touch the stream
            self.disabled = True
            log.warn_once("device-capture", f"cannot tell graph captures ({exc!r}); recording host times only")
            return False
        if self.disabled:
            return False
        try:
            if len(self._open) >= self._open_limit:
                return False  # the watchdog is not keeping up (or no device progress): time fewer ops, never grow
            if device not in self._anchors:
                self._anchor(device)
            pool = self._pools.get(device)
            start = pool.pop() if pool else self._factory(device)
            start.record()
            self._open[entry.id] = [entry, device, start, None]
        except Exception as exc:  # noqa: BLE001 - no device events here: host times only
            self.disabled = True
            log.warn_once("device-events", f"device timing unavailable ({exc!r}); recording host times only")
        return False

    def waited(self, entry: Entry, since_issue: bool = True) -> None:
        """The current stream now waits for the op (its Work was waited on): the end event goes here.
        `since_issue=False`: right after the call itself (a blocking op), when no capture can have begun
        since `before` looked, so the capture check (a device call per op) is not repeated."""
        opened = self._open.get(entry.id)
        if opened is None or opened[3] is not None:
            return
        try:
            device = opened[1]
            if since_issue:
                check = self._capture_checks.get(device, _UNRESOLVED)
                if check is _UNRESOLVED:
                    check = self._capture_check(device)
                if check is not None and check():
                    return  # a capture began since: the start alone is read
            pool = self._pools.get(device)
            end = pool.pop() if pool else self._factory(device)
            end.record()
            opened[3] = end
        except Exception as exc:  # noqa: BLE001
            log.warn_once("device-events-end", f"device timing failed ({exc!r})")

    def recycle(self, oldest_kept: int, wait: bool = True) -> int:
        """Each watchdog tick (and `Recorder.catch_up`): the events of ops the ring has dropped (id below
        `oldest_kept`, or their entry reused for a newer op) go back to the pool unread: no dump can show those times.
        Beyond `keep_unread` open records the oldest are read now, so a very large ring keeps its
        events bounded. Returns how many records were recycled. `wait=False` (a training thread's
        catch-up, `Recorder.catch_up`): nothing, at once, while a dump is reading events."""
        if not self._reading.acquire(blocking=wait):
            return 0
        try:
            return self._recycle_held(oldest_kept)
        finally:
            self._reading.release()

    def _recycle_held(self, oldest_kept: int) -> int:
        """`recycle`, `_reading` held."""
        recycle_open = _c_recycle()
        dropped = -1
        if recycle_open is not None:
            try:  # the same walk in C: in Python it cost the watchdog ~1 µs per device op, GIL held
                dropped = recycle_open(self._open, oldest_kept, self._pools, self._pool_limit)
            except Exception:  # noqa: BLE001 - a record not of the C layout: the walk below
                dropped = -1
        if dropped < 0:
            dropped = self._recycle(oldest_kept)
        surplus = len(self._open) - self._keep_unread
        if surplus > 0:
            self._resolve(surplus)
        return dropped

    def _recycle(self, oldest_kept: int) -> int:
        """`recycle`'s walk in Python (`_fastpath.recycle_open` where built); `_reading` held."""
        dropped = 0
        for record_id, record in list(self._open.items()):  # a copy: training threads add records meanwhile
            if record_id >= oldest_kept and record[0].id == record_id:
                break  # ids are issued in order: everything after this one is in the ring too
            if self._open.pop(record_id, None) is not None:
                self._give_back(record[1], record[2], record[3])
                dropped += 1
        return dropped

    def _give_back(self, device: str, start: TimingEvent, end: TimingEvent | None) -> None:
        pool = self._pools.setdefault(device, [])
        if len(pool) < self._pool_limit:
            pool.append(start)
            if end is not None:
                pool.append(end)

    def resolve(self) -> int:
        """Fill the times of ops whose events have happened (a dump calls it; never blocks). An op that
        settled without an end event (nobody waited on it) gets its start time only."""
        with self._reading:
            return self._resolve(None)

    def _resolve(self, limit: int | None) -> int:
        """`resolve`, looking at no more than `limit` of the oldest open records; `_reading` held."""
        resolved = 0
        records = list(self._open.items())
        for record_id, (entry, device, start, end) in records if limit is None else records[:limit]:
            if entry.id != record_id:  # the ring reused its entry for a newer op: nothing to fill
                if self._open.pop(record_id, None) is not None:
                    self._give_back(device, start, end)
                continue
            try:
                if end is None:
                    if entry.state not in SETTLED or not start.query():
                        continue  # still being issued, running, or waited on later
                elif not end.query():
                    continue
                anchor, anchor_ns = self._anchors[device]
                first_read = entry.t_dev_start_ns is None
                entry.t_dev_start_ns = anchor_ns + int(anchor.elapsed_time(start) * 1e6)
                if end is not None:
                    entry.t_dev_end_ns = anchor_ns + int(anchor.elapsed_time(end) * 1e6)
                elif first_read and _end_may_follow(entry):
                    continue  # its start is read; the record stays open (once) for the end its caller places
            except Exception as exc:  # noqa: BLE001
                log.warn_once("device-events-read", f"could not read device events ({exc!r})")
            if self._open.pop(record_id, None) is not None:
                self._give_back(device, start, end)
            resolved += 1
        return resolved

    @property
    def pending(self) -> int:
        return len(self._open)


SETTLED = frozenset(("completed", "failed"))


def _c_recycle() -> Callable[..., int] | None:
    """`_fastpath.recycle_open` where the extension is built (record/native.py), else None."""
    from .native import c_module

    return getattr(c_module(), "recycle_open", None)


def _end_may_follow(entry: Entry) -> bool:
    """A blocking device op that completed before its call returned: the call places the end event
    right after its wait (`waited(since_issue=False)`), so a dump reading now, on another thread, keeps
    the record open until the next read. A failed or async op gets no end unless someone waits."""
    return entry.state == "completed" and not entry.is_async
