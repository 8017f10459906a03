"""Device-side start/end times of ops on NCCL / HCCL (CUDA, Ascend NPU), resolved lazily.

The CPU returns from a device collective before the device runs it, so the host clock says nothing
about when it ran. Two timing events bracket each device op on the current stream (torch's
device-generic `torch.Event`, which covers CUDA and, with torch_npu, Ascend). The training thread
only records them; the watchdog asks `query()` (non-blocking) and, once the end event has happened,
converts both to the host's monotonic clock through an anchor event whose host time is known.
Events come from a pool and go back to it once read, so steady state allocates nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

from . import log
from .entry import Entry


class TimingEvent(Protocol):
    def record(self) -> None: ...
    def query(self) -> bool: ...
    def synchronize(self) -> None: ...
    def elapsed_time(self, end: Any) -> float: ...  # milliseconds


EventFactory = Callable[[str], TimingEvent]


def torch_event_factory(device_type: str) -> TimingEvent:
    import torch

    return torch.Event(device=device_type, enable_timing=True)  # type: ignore[return-value]


class DeviceTiming:
    """Brackets device ops with events and turns them into t_dev_start_ns / t_dev_end_ns."""

    def __init__(self, factory: EventFactory = torch_event_factory, clock: Callable[[], int] = time.monotonic_ns,
                 pool_limit: int = 4096) -> None:
        self._factory = factory
        self._clock = clock
        self._pools: dict[str, list[TimingEvent]] = {}
        self._anchors: dict[str, tuple[TimingEvent, int]] = {}
        self._open: dict[int, tuple[Entry, str, TimingEvent, TimingEvent]] = {}
        self._pool_limit = pool_limit
        self.disabled = False

    def _event(self, device: str) -> TimingEvent:
        pool = self._pools.get(device)
        return pool.pop() if pool else self._factory(device)

    def _anchor(self, device: str) -> tuple[TimingEvent, int]:
        """An event whose host time is known: device times are measured from it."""
        anchor = self._anchors.get(device)
        if anchor is None:
            event = self._factory(device)
            event.record()
            event.synchronize()
            anchor = self._anchors[device] = (event, self._clock())
        return anchor

    def before(self, entry: Entry) -> None:
        if self.disabled:
            return
        try:
            device = entry.device
            self._anchor(device)
            start = self._event(device)
            start.record()
            self._open[entry.id] = (entry, device, start, start)
        except Exception as exc:  # noqa: BLE001 - no device events here: host times only
            self.disabled = True
            log.warn_once("device-events", f"device timing unavailable ({exc!r}); recording host times only")

    def after(self, entry: Entry) -> None:
        opened = self._open.get(entry.id)
        if opened is None:
            return
        try:
            end = self._event(opened[1])
            end.record()
            self._open[entry.id] = (opened[0], opened[1], opened[2], end)
        except Exception as exc:  # noqa: BLE001
            self._open.pop(entry.id, None)
            log.warn_once("device-events-end", f"device timing failed ({exc!r})")

    def resolve(self) -> int:
        """Watchdog side: fill the times of ops whose end event has happened; never blocks."""
        resolved = 0
        for record_id, (entry, device, start, end) in list(self._open.items()):
            if start is end:
                continue  # the op is still being issued
            try:
                if not end.query():
                    continue
                anchor, anchor_ns = self._anchors[device]
                entry.t_dev_start_ns = anchor_ns + int(anchor.elapsed_time(start) * 1e6)
                entry.t_dev_end_ns = anchor_ns + int(anchor.elapsed_time(end) * 1e6)
            except Exception as exc:  # noqa: BLE001
                log.warn_once("device-events-read", f"could not read device events ({exc!r})")
            self._open.pop(record_id, None)
            pool = self._pools.setdefault(device, [])
            if len(pool) < self._pool_limit:
                pool.extend((start, end))
            resolved += 1
        return resolved

    @property
    def pending(self) -> int:
        return len(self._open)
