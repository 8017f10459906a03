"""Device-side start/end times of ops on NCCL / HCCL (CUDA, Ascend NPU), resolved lazily.

The CPU returns from a device collective before the device runs it, so the host clock says nothing
about when it ran. The collective runs on the backend's own stream, which Python cannot reach; what
it can reach is the current stream, which the backend's stream waits for before the op (so an event
recorded there before the call marks when the op could start) and which waits for the op when the
Work is waited on (so an event recorded there right after `Work.wait()` marks when the op had ended,
for a blocking call exactly: nothing else is queued between the two). An end event recorded when
an async call returns would mark nothing: the current stream does not wait for the op until then.
An op nobody waits on gets a start time only.

Events are torch's device-generic `torch.Event` (CUDA and, with torch_npu, Ascend). Each ring entry
keeps its own pair (`Entry.events`, made at its first device op) and re-records them for every op
the ring reuses it for, marking which op they time (`timed_start` / `timed_end`: that op's id). So
the training thread only records (the C hot path does `before` / `waited`'s common case itself:
`_fastpath.c` "device events"; these methods stay the reference), nothing is allocated, filed or
given back per op, and an op the ring drops takes its events' meaning with it, unread. They are
read (`query()`, non-blocking, then converted to the host's monotonic clock through an anchor
event whose host time is known) only when a dump needs them (`resolve`).
Why not read every op as it completes: on an H200 that cost the watchdog ~9 µs per op with the GIL
held (a query and two `elapsed_time` calls, ~4 µs of them device calls), more than all the rest of
the recorder's work per op (docs/overhead.md). Why on the entry: the earlier pool of events, filed
per op in a dict and given back as the ring dropped ops, cost ~0.8 µs per device op (docs/overhead.md).
Inside a CUDA-graph capture nothing is recorded, queried or synchronized (it would break or alter
the capture): those ops are counted (`captured`) and have no device times.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from .. import log
from .entry import Entry


class TimingEvent(Protocol):
    def record(self) -> None: ...
    def query(self) -> bool: ...
    def synchronize(self) -> None: ...
    def elapsed_time(self, end: Any) -> float: ...  # milliseconds


EventFactory = Callable[[str], TimingEvent]
# Ring slots whose entries get events (two each): a ring up to this size times every device op; a larger
# one (FLIGHTREC_BUFFER goes up to 10,000,000) the ops in its first this-many slots, so events stay bounded.
MAX_PAIRS = 65536
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
                 capturing: Callable[[str], bool] = torch_capturing, ring_capacity: int = 0,
                 max_pairs: int = MAX_PAIRS) -> None:
        self._factory = factory
        self._clock = clock
        self._capturing = capturing
        # device type -> its capture query (None: that device cannot capture), resolved at its first op
        self._capture_checks: dict[str, Callable[[], bool] | None] = {}
        self._anchors: dict[str, tuple[TimingEvent, int]] = {}
        # device type -> its capture query, for devices whose anchor is placed while timing is on: what
        # the C hot path reads to record an op's events itself (any other case takes `before`). Never
        # reassigned, only changed in place: the C hot path keeps the dict of the last DeviceTiming it read
        self.ready: dict[str, Callable[[], bool] | None] = {}
        self._disabled = False
        # a ring larger than max_pairs: the entries of its slots from max_pairs on get no events (0: not capped)
        self._capped_from = max_pairs if ring_capacity > max_pairs else 0
        self._ring_capacity = ring_capacity
        self.pairs = 0  # pairs of events made
        # two dumps (on any threads) never read at once; the training thread's before/waited take no lock
        self._reading = threading.Lock()
        self.captured = 0  # device ops issued inside a graph capture: not timed

    @property
    def disabled(self) -> bool:
        return self._disabled

    @disabled.setter
    def disabled(self, value: bool) -> None:
        self._disabled = bool(value)
        if value:
            self.ready.clear()  # the C hot path then hands every op to `before`, which records nothing

    def _capture_check(self, device: str) -> Callable[[], bool] | None:
        """`device`'s capture query, looked up at its first op (the C hot path reads it from `ready`)."""
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
        """The op is about to be issued: its entry's start event on the current stream. True when the
        current stream is being captured into a graph: then nothing is recorded (the op runs at each replay)."""
        device = entry.device
        if device == "cpu":
            return False  # an op of a late-completing backend on CPU tensors: no device to time
        try:
            check = self._capture_check(device)
            if check is not None and check():
                self.captured += 1
                return True
        except Exception as exc:  # noqa: BLE001 - cannot tell: never touch the stream
            self.disabled = True
            log.warn_once("device-capture", f"cannot tell graph captures ({exc!r}); recording host times only")
            return False
        if self._disabled:
            return False
        try:
            if device not in self._anchors:
                self._anchor(device)
            events = entry.events
            if events == ():
                return False  # an entry past the cap on events: host times only (the C hot path knows it too)
            if events is None or events[0] != device:  # the entry's first op on this device
                if self._capped_from and entry.id % self._ring_capacity >= self._capped_from:
                    entry.events = ()  # its slot's: kept when the ring reuses it
                    log.warn_once("device-events-cap", f"device times for the ops in {self._capped_from} of the "
                                  f"ring's {self._ring_capacity} slots only (FLIGHTREC_BUFFER): the others record host times")
                    return False
                events = entry.events = (device, self._factory(device), self._factory(device))
                self.pairs += 1
            entry.timed_start = entry.timed_end = -1  # what they held is not this op's (a dump checks)
            events[1].record()
            entry.timed_start = entry.id
            if not self._disabled:
                self.ready[device] = check
        except Exception as exc:  # noqa: BLE001 - no device events here: host times only
            self.disabled = True
            log.warn_once("device-events", f"device timing unavailable ({exc!r}); recording host times only")
        return False

    def waited(self, entry: Entry, since_issue: bool = True) -> None:
        """The current stream now waits for the op (its Work was waited on): the end event goes here.
        `since_issue=False`: right after the call itself (a blocking op), when no capture can have begun
        since `before` looked, so the capture check (a device call per op) is not repeated."""
        if entry.timed_start != entry.id or entry.timed_end == entry.id:
            return  # not timed (captured, timing off), or its end is placed already
        try:
            device, _, end = entry.events
            if since_issue:
                check = self._capture_check(device)
                if check is not None and check():
                    return  # a capture began since: the start alone is read
            end.record()
            entry.timed_end = entry.id
        except Exception as exc:  # noqa: BLE001
            log.warn_once("device-events-end", f"device timing failed ({exc!r})")

    def resolve(self, entries: Iterable[Entry]) -> int:
        """Fill the device times of `entries` (what a dump shows) whose events have happened; never
        blocks. An op that settled without an end event (nobody waited on it) gets its start time only;
        its end is read by a later dump if its caller still places it. Returns how many were filled."""
        resolved = 0
        store = _c_store()
        with self._reading:
            for entry in entries:
                record_id = entry.id
                if entry.timed_start != record_id or entry.t_dev_end_ns is not None:
                    continue  # not timed, timed for an older op, or read
                ended = entry.timed_end == record_id
                if not ended and entry.t_dev_start_ns is not None:
                    continue  # its start is read; no end placed (yet)
                try:
                    device, start, end = entry.events
                    if ended:
                        if not end.query():
                            continue  # still running
                    elif entry.state not in SETTLED or not start.query():
                        continue  # still being issued, or running
                    anchor, anchor_ns = self._anchors[device]
                    start_ns = anchor_ns + int(anchor.elapsed_time(start) * 1e6)
                    end_ns = anchor_ns + int(anchor.elapsed_time(end) * 1e6) if ended else None
                except Exception as exc:  # noqa: BLE001
                    log.warn_once("device-events-read", f"could not read device events ({exc!r})")
                    continue
                # the training thread may have reused the entry (re-recording its events) meanwhile
                if store(entry, record_id, start_ns, end_ns):
                    resolved += 1
        return resolved

    @staticmethod
    def unread(entries: Iterable[Entry]) -> int:
        """How many of `entries` hold events recorded for their op that no dump has read in full yet."""
        return sum(1 for e in entries if e.timed_start == e.id and e.t_dev_end_ns is None
                   and (e.t_dev_start_ns is None or e.timed_end == e.id))


SETTLED = frozenset(("completed", "failed"))


def _store_in_python(entry: Entry, record_id: int, start_ns: int, end_ns: int | None) -> bool:
    """`_fastpath.store_device_times` without the extension (no C hot path: no writer in C either)."""
    if entry.id != record_id or entry.timed_start != record_id or (end_ns is not None and entry.timed_end != record_id):
        return False
    entry.t_dev_start_ns = start_ns
    if end_ns is not None:
        entry.t_dev_end_ns = end_ns
    return True


def _c_store() -> Callable[[Entry, int, int, int | None], bool]:
    """What writes the times read for op `record_id` into its entry, unless the entry now holds another
    op or its events were re-recorded since: `_fastpath.store_device_times` where the extension is built
    (record/native.py), the check and the writes in one step under the GIL, so a training thread
    reusing the entry cannot come in between."""
    from .native import c_module

    return getattr(c_module(), "store_device_times", None) or _store_in_python

