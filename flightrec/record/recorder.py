"""The recording core: turns each wrapped call into an Entry and follows it to completion.

Everything here runs on the training thread's hot path or in backend callbacks, so each public
method swallows its own errors (the wrappers in `patching` make sure of it) and takes no lock that
could be held for longer than a few dictionary operations.
"""

from __future__ import annotations

import re
import threading
import time
import weakref
from collections.abc import Callable
from functools import partial
from typing import Any

import torch
import torch.distributed.distributed_c10d as c10d

from .. import log
from ..format.backends import IN_ORDER, device_backend
from ..settings import Settings
from . import torch_recorder
from .device_timing import DeviceTiming
from .entry import Entry, tensor_meta
from .groups import GroupRegistry, GroupState, StreamGroupState
from .native import c_base, c_module
from .ops import OpSpec, as_tensors
from .ring import Ring
from .stacks import call_site, current_stack

_monotonic_ns = time.monotonic_ns
_C_COMPLETE = getattr(c_module(), "complete_unmeasured", None)  # record/native.py: the C fields, when built
_C_SCAN = getattr(c_module(), "scan_polled", None)
_C_ISSUED_BEFORE = getattr(c_module(), "issued_before", None)
_Tensor = torch.Tensor
_UNSEEN = object()
# Ids between catch-ups of the device ops in `polled` on the issuing thread (`Recorder.poll_soon_at`)
POLL_SOON_AT = 16
_SETTLED = ("completed", "failed")  # entries nothing refers to any more: safe to reuse
# An error raised by a collective backend (gloo's transport, NCCL, HCCL), not by the job's own code.
BACKEND_ERROR = re.compile(r"[/\\]gloo[/\\]|\bgloo\b|ProcessGroup(Gloo|NCCL|HCCL)|\bNCCL\b|\bHCCL\b", re.IGNORECASE)
_ASYNC_APIS = frozenset(("isend", "irecv", "batch_isend_irecv"))
TRUST_AFTER = 8  # calls of an API whose counter step agreed before the step is predicted
RECHECK_EVERY = 64  # a predicted step is still read and checked on every 64th entry


def _done_in_order(ops: list[Entry]) -> int | None:
    """How many of one stream's ops (oldest first) are done, asking the newest's Work first, then the
    one before it, then by bisection; None when one raised, or the newest reads as completed while
    holding an error (NCCL's, once its communicator failed). Why the one before the newest: a catch-up
    runs as an op is filed, and on a GPU that op has just been queued, while a device that keeps up
    has run the rest: two queries, not 1 + log2(n) (~1.2 µs each on NCCL). Each Work is read from its
    entry when asked (only O(log n) are). An entry settled since the walk (its Work let go: a failed
    wait, say) is never read as done: a newest one sends the stream to the one-by-one poll (None), one
    the bisection asks ends the done ones before it (the next poll, which no longer lists it, goes on
    past it); counted in by a later op read done, it is left as it is by the completion."""
    try:
        newest = ops[-1].work
        if newest is None:
            return None
        if newest.is_completed():
            return None if newest.exception() is not None else len(ops)
        not_done = len(ops) - 1
        if not_done > 0:
            work = ops[-2].work
            if work is not None and work.is_completed():
                return not_done
            not_done -= 1
        done = 0
        while done < not_done:
            middle = (done + not_done) // 2
            work = ops[middle].work
            if work is not None and work.is_completed():
                done = middle + 1
            else:
                not_done = middle
        return done
    except Exception:  # noqa: BLE001 - a failed Work raises when asked
        return None


def _describe(value: Any, entry: Entry) -> tuple[tuple[Any, Any], ...]:
    """Shapes and dtypes of a tensor argument (or list of them); notes a device that is not the CPU.

    A tensor keeps its `torch.Size` (it holds no reference to the tensor); converting it to a tuple
    waits for the dump.
    """
    if isinstance(value, _Tensor):
        if not value.is_cpu:
            entry.device = value.device.type
        return ((value.shape, value.dtype),)
    tensors = as_tensors(value)
    if tensors and not tensors[0].is_cpu:
        entry.device = tensors[0].device.type
    return tensor_meta(tensors)


def _endpoint(global_rank: Any, group_rank: Any, group: GroupState, is_root: bool) -> int:
    """A peer or root as a global rank, whichever way the caller named it."""
    if global_rank is not None:
        return int(global_rank)
    if group_rank is not None:
        return group.global_rank(int(group_rank))
    if is_root:
        return group.ranks[0] if group.ranks else -1  # PyTorch's default root: group rank 0
    return -1


class ThreadState:
    """Per-thread call context, one plain object per thread: its fields cost a slot read each,
    where a `threading.local` subclass costs a per-thread dictionary lookup per field.

    `in_leaf` is falsy outside a wrapped call; inside one it is True (Python wrapper) or the Entry of
    the call (C hot path), which the C path files in no table while it runs (`Recorder.in_flight`)."""

    __slots__ = ("in_leaf", "api", "unit", "thread_name", "ident", "__weakref__")

    def __init__(self) -> None:
        self.in_leaf: bool | Entry = False
        self.api: str | None = None
        self.unit: list[Entry] | None = None
        self.thread_name = threading.current_thread().name
        self.ident = threading.get_ident()  # the dump's thread records: which thread is inside an op


class Recorder:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.ring: Ring[Entry] = Ring(settings.buffer)
        self.groups = GroupRegistry(relabel=self._relabel_group)
        self.pending: dict[int, Entry] = {}
        # Both are polled by the watchdog (Work.is_completed) for ops nobody waits on.
        self.polled: dict[int, Entry] = {}  # entry id -> device ops whose Work has no future
        self.by_work: dict[int, Entry] = {}  # id(Work) -> CPU op, for the Work.wait wrapper
        # An op filed in `polled` this many ids after the oldest there calls `poll_soon` (armed: `catch_up_due`)
        # instead of waiting for the watchdog's tick (`_file_polled`): ops that come faster than the ring
        # per tick are then seen complete before the ring wraps over them (their slots and events reused,
        # their Works let go young), which cost ~8-14 µs per op otherwise (docs/overhead.md). 16, not more:
        # the Works held until their poll slow every op (128: +0.5-1 µs per device op on the stand-in,
        # 1,000: +1.3 µs more); a catch-up that leaves many ops running spaces the next out (`catch_up_due`).
        self.poll_soon_at = POLL_SOON_AT
        self.poll_soon_most = max(POLL_SOON_AT, self.ring.capacity // 2)  # ... up to half the ring
        self.poll_soon: Callable[[], None] | None = None
        self.poll_due = 0  # the id from which a filed op calls `poll_soon` (the C hot path reads it too)
        self._catching_up = threading.Lock()  # one poll at a time: `catch_up`, on any thread
        # The C hot path's latest async op not waited on yet (.work, .entry), kept out of by_work:
        # see AsyncSlot in _fastpath.c. None without the C hot path.
        slot_type = c_base("AsyncSlot")
        self.async_slot: Any = slot_type() if slot_type is not None else None
        self.local = threading.local()  # .state: this thread's ThreadState
        self.threads: list[weakref.ref[ThreadState]] = []  # every live thread's, for the watchdog
        self.cpp_lock = threading.Lock()  # only around C++-op bookkeeping, held for microseconds
        self.active = True
        self.cpp_open: list[Entry] = []  # C++ ops whose completion is not known yet
        self.cpp_failed: list[Entry] = []  # C++ ops marked failed as the process died of their error
        self.device_timing = DeviceTiming(ring_capacity=self.ring.capacity)  # used only by ops on a device (NCCL, HCCL)
        self._in_order_groups: dict[tuple[str, str], bool] = {}  # (group, device) -> IN_ORDER backend
        self.on_failure: Callable[[Entry, bool], None] | None = None  # set by the watchdog owner
        self.armed_wall_ns = time.time_ns()  # when this process was armed: tells one run of a job from the next

    # ------------------------------------------------------------------ hot path
    def thread_state(self) -> ThreadState:
        try:
            return self.local.state
        except AttributeError:
            state = self.local.state = ThreadState()
            # A new list, not an append under an iterating reader: the watchdog reads whichever it got.
            self.threads = [ref for ref in self.threads if ref() is not None] + [weakref.ref(state)]
            return state

    def compile(self, spec: OpSpec) -> Callable[[tuple[Any, ...], dict[str, Any], ThreadState],
                                                tuple[Entry, GroupState] | None]:
        """A `begin` specialised to one API: parameter readers resolved once, not per call."""
        reader = spec.reader(spec.read_names())
        endpoint = spec.root or spec.peer
        is_coll = spec.kind == "coll"
        is_send = spec.direction == "send"
        api_name, op_name, kind = spec.api, spec.op, spec.kind
        always_async = spec.is_async_api
        by_pg = self.groups.by_pg
        groups = self.groups
        ring = self.ring
        slots, capacity = ring.slots, ring.capacity
        next_id = ring.next_id
        pending = self.pending
        settings = self.settings
        world = c10d._world

        def begin(args: tuple[Any, ...], kwargs: dict[str, Any], tls: ThreadState) -> tuple[Entry, GroupState] | None:
            pg, inputs, outputs, async_op, reduce_op, end_global, end_group_rank = reader(args, kwargs)
            if pg is None:
                pg = world._default_pg
            group = by_pg.get(pg, _UNSEEN)
            if group is _UNSEEN:
                group = groups.get(pg)
            if group is None:
                return None
            now = _monotonic_ns()
            group.busy += 1
            seq_before = group.read_seq()
            if seq_before > group.last_pg_seq:
                self.note_cpp_ops(group, seq_before, now)
            api = tls.api or api_name
            record_id = next_id()
            slot = record_id % capacity
            entry = slots[slot]
            if entry is None or entry.state not in _SETTLED or entry.source != "python" or entry.work is not None:
                dropped, entry = entry, Entry(record_id, group.name, kind, op_name, api)
                if dropped is not None:
                    entry.take_events(dropped)
            else:
                entry.reset(record_id, group.name, kind, op_name, api)
            if is_coll:
                group.coll_seq += 1
                entry.seq = group.coll_seq
                if endpoint is not None:
                    entry.root = _endpoint(end_global, end_group_rank, group, True)
                entry.reduce_op = reduce_op
            else:
                peer = entry.peer = _endpoint(end_global, end_group_rank, group, False)
                if peer >= 0:
                    counts = group.sent if is_send else group.received
                    entry.seq = counts[peer] = counts.get(peer, 0) + 1
            entry.pg_seq = seq_before + 1 if seq_before >= 0 else -1
            if inputs is not None:
                if isinstance(inputs, _Tensor) and inputs.is_cpu:  # _describe's common case, inlined
                    entry.inputs = ((inputs.shape, inputs.dtype),)
                else:
                    entry.inputs = _describe(inputs, entry)
            if outputs is not None:
                entry.outputs = entry.inputs if outputs is inputs else _describe(outputs, entry)
            entry.is_async = (always_async and api in _ASYNC_APIS) or bool(async_op)
            unit = tls.unit
            if unit is not None:
                entry.unit = unit[0].id if unit else entry.id
                unit.append(entry)
            entry.t_enqueue_ns = now
            entry.thread = tls.thread_name
            entry.site = call_site(3)
            if settings.stacks:
                entry.stack = current_stack(3)
            slots[slot] = entry  # Ring.put, inlined: the ring learns `recorded` from the ids it holds
            pending[record_id] = entry
            return entry, group

        return begin

    def finish(self, entry: Entry, group: GroupState, result: Any) -> None:
        """The call returned: completed (CPU, blocking) or still running (async / device)."""
        seq_after = self._seq_after(entry, group)
        if seq_after >= 0:
            entry.pg_seq = seq_after
            if seq_after > group.last_pg_seq:
                group.last_pg_seq = seq_after
        group.busy -= 1
        if result is None:
            if entry.unit >= 0 and entry.is_async:
                return  # a coalesced op: the unit's works complete it (see end_unit)
            entry.t_complete_ns = _monotonic_ns()
            entry.state = "completed"  # blocking call returned (device ops: host-side completion)
            self.pending.pop(entry.id, None)
            return
        if entry.kind == "p2p" and entry.peer < 0 and isinstance(result, int) and result >= 0:
            self._resolve_any_source(entry, group, result)
        if hasattr(result, "is_completed"):
            self.watch_work(entry, result, late=type(group) is StreamGroupState)
        else:
            self.complete(entry)

    def fail(self, entry: Entry, group: GroupState, exc: BaseException) -> None:
        self._settle_seq(entry, group)
        self.report_failure(entry, exc)

    def report_failure(self, entry: Entry, exc: BaseException) -> None:
        """An op raised in the calling thread: record it and have the dump written before it unwinds."""
        self.mark_failed(entry, exc)
        if self.on_failure is not None and isinstance(exc, Exception):
            self.on_failure(entry, True)

    def _seq_after(self, entry: Entry, group: GroupState) -> int:
        """The backend counter after `entry`'s call: read, or predicted once learned.

        Reading it costs a C++ call (~0.3-0.6 µs, the largest single piece of the hot path). How far
        one call of an API moves it is a property of the backend (gloo: 1 for every op; NCCL: 1 per
        collective, 0 per p2p), so once `TRUST_AFTER` calls in a row agreed, the step is predicted and
        checked again every `RECHECK_EVERY`th call. A prediction never hides a C++ op: one issued
        meanwhile moves the counter past the prediction, and the next call's read before it records
        it. Ops of a batch or coalescing block, whose step depends on the block, are always read.
        """
        seq_before = entry.pg_seq - 1
        if seq_before < 0 or entry.unit >= 0:
            return group.read_seq()
        learned = group.steps.get(entry.api)
        if learned is not None and learned[1] >= TRUST_AFTER and entry.id % RECHECK_EVERY:
            return seq_before + learned[0]
        seq_after = group.read_seq()
        step = seq_after - seq_before
        if learned is None:
            group.steps[entry.api] = [step, 1]
        elif learned[0] == step:
            learned[1] += 1
        else:
            learned[0], learned[1] = step, 1
            group.steps_gen += 1  # the C hot path's copy of the old step is stale
        return seq_after

    # ------------------------------------------------------------------ completion
    def complete(self, entry: Entry, when: int | None = None) -> None:
        entry.t_complete_ns = when or _monotonic_ns()
        entry.state = "completed"
        self._release(entry)

    def complete_unmeasured(self, entry: Entry) -> None:
        """Completed, seen by a poll: no host time is recorded for it (a polled moment is not one)."""
        entry.t_complete_ns = None
        entry.state = "completed"
        self._release(entry)

    def mark_failed(self, entry: Entry, exc: BaseException) -> None:
        entry.t_complete_ns = _monotonic_ns()
        entry.state = "failed"
        entry.error = f"{type(exc).__name__}: {exc}"[:4000]
        self._release(entry)

    def _release(self, entry: Entry) -> None:
        work, entry.work = entry.work, None
        if work is not None:
            self.by_work.pop(id(work), None)
        if self.async_slot is not None:
            self.async_slot.release(entry)
        self.pending.pop(entry.id, None)
        self.polled.pop(entry.id, None)

    def watch_work(self, entry: Entry, work: Any, late: bool = False) -> None:
        """Complete `entry` when its Work does.

        CPU ops: when the training code waits on the Work (`Work.wait` is wrapped), or when the
        watchdog sees it completed, with no cross-thread callback: a future callback runs in the
        backend's thread and fights the training thread for the GIL on every op. Device ops: when the
        watchdog's poll of `Work.is_completed()` (a non-blocking event query) finds the device done,
        and failed when `Work.exception()` then holds an error; never by their future, which NCCL
        (and torch_npu's HCCL) complete with its value as soon as the op is queued (`collective()`:
        `future_->markCompleted` after enqueue), so it never carries the op's error: watching it cost
        ~1.3 µs per op for nothing. Ops of a group whose backend completes Works after their wait
        (`late`: custom backends on CPU tensors): their future.
        """
        entry.work = work
        if entry.device == "cpu" and not late:
            self.by_work[id(work)] = entry  # the entry holds the Work, so its id is not reused
            return
        if entry.device != "cpu":
            self.by_work[id(work)] = entry  # its Work.wait marks where its end event goes
            self._file_polled(entry)
            return
        callback = self._on_future_done
        try:
            future = work.get_future()
            if future.done() and late:
                # Done before the op could have run: a stream-ordered future (NCCL's semantics, a backend
                # that behaves like it on CPU tensors) tells only of an error; its Work is polled, unmeasured.
                self._on_device_future(entry, future)
                if entry.pending:
                    self._file_polled(entry)
            elif future.done():
                callback(entry, future)
            else:
                future.add_done_callback(partial(callback, entry))
        except Exception:  # noqa: BLE001 - some backends have no futures: polled instead
            self._file_polled(entry)

    def _file_polled(self, entry: Entry) -> None:
        """Into `polled`. The only op there sets when a catch-up falls due: `poll_soon_at` ids later,
        counted in ids, as the ring turns for every op, a CPU group's too; an op filed at or past it
        calls `poll_soon` (a catch-up on this thread), and the next falls due `poll_soon_at` ids later
        (so again if a poll could not keep up; armed, `catch_up_due` puts it further on while the device
        is behind). The op is filed after that catch-up: it would complete an op that ended at once
        before its caller's wait. The C hot path does the same (`_fastpath.c` poll_soon, watch_device)."""
        polled = self.polled
        if not polled or entry.id >= self.poll_due:
            self.poll_due = entry.id + self.poll_soon_at
            if polled and self.poll_soon is not None:
                try:
                    self.poll_soon()
                except Exception:  # noqa: BLE001 - the tick polls anyway, and says what failed
                    pass
        polled[entry.id] = entry

    def _on_device_future(self, entry: Entry, future: Any) -> None:
        """A stream-ordered future (done when the op was queued): only its error is news."""
        try:
            future.value()
        except Exception as exc:  # noqa: BLE001 - the op failed
            self.device_failed(entry, exc)

    def device_failed(self, entry: Entry, exc: BaseException) -> None:
        """A device op's future raised: the op failed."""
        try:
            self.mark_failed(entry, exc)
            if self.on_failure is not None:
                self.on_failure(entry, False)
        except Exception as inner:  # noqa: BLE001
            log.warn_once("device-future", f"could not record a failed device op: {inner!r}")

    def device_waited(self, entry: Entry, work: Any) -> None:
        """The training code waited on a device op's Work: its host call returns at once, the current
        stream now waits for the op. Time its end there; completion stays the Work's (polled)."""
        self.device_timing.waited(entry)
        self.by_work.pop(id(work), None)  # the watchdog's poll of `polled` completes it
        slot = self.async_slot
        if slot is not None and slot.work is work:  # where the C hot path files it when free
            slot.release(entry)

    def on_wait_returned(self, entry: Entry, work: Any) -> None:
        """The training code's `work.wait()` returned: the op is done (CPU backends)."""
        if entry.work is work:
            self._work_done(entry, work)

    def _work_done(self, entry: Entry, work: Any) -> None:
        """A Work finished: learn the sender of a receive from any source, then complete."""
        if entry.kind == "p2p" and entry.peer < 0:
            self._resolve_from_work(entry, work)
        self.complete(entry)

    def _resolve_from_work(self, entry: Entry, work: Any) -> None:
        group = self._group_by_name(entry.group)
        source = getattr(work, "_source_rank", None)
        if group is not None and source is not None:
            try:
                self._resolve_any_source(entry, group, group.global_rank(int(source())))
            except Exception:  # noqa: BLE001 - not a receive from any source after all
                pass

    def _on_future_done(self, entry: Entry, future: Any) -> None:
        try:
            work = entry.work
            try:
                future.value()
            except Exception as exc:  # noqa: BLE001 - the op failed: that is the news
                self.mark_failed(entry, exc)
                if self.on_failure is not None:
                    self.on_failure(entry, False)
                return
            if work is None:
                self.complete(entry)
            else:
                self._work_done(entry, work)
        except Exception as exc:  # noqa: BLE001
            log.warn_once("future-callback", f"completion callback failed: {exc!r}")

    def entry_of(self, work: Any) -> Entry | None:
        """The entry of a CPU op whose Work nobody waited on yet."""
        slot = self.async_slot
        if slot is not None and slot.work is work:
            return slot.entry
        return self.by_work.get(id(work)) if self.by_work else None

    def catch_up(self, wait: bool = False) -> bool:
        """Poll the ops waiting in `polled`, here and now: the watchdog's tick does (`wait=True`), and so
        does the training thread whose op fell due (`poll_soon`, `_file_polled`),
        at once and without waiting for the lock. Why not wake the watchdog for it: while it waited for
        the GIL, every release of the GIL by the training thread (two or three per op, in torch's
        bindings) woke it in vain: back-to-back device ops cost +13.7 µs each that way, +4.5 this way
        (docs/overhead.md), GIL held, with no thread switch. False: another thread was polling them."""
        if not self._catching_up.acquire(blocking=wait):
            return False
        try:
            self.poll_works()
        finally:
            self._catching_up.release()
        return True

    def catch_up_due(self) -> None:
        """`poll_soon` as armed: the catch-up of an op that fell due (`poll_due` was just set `poll_soon_at`
        ids on), and when it left more ops running than that (a device behind the host), the next falls
        due as many ids on as it left (at most `poll_soon_most`): each catch-up walks every op in `polled`,
        so a device many ops behind would otherwise cost a walk of them all every `poll_soon_at` ops."""
        if self.catch_up():
            left = len(self.polled)
            if left > self.poll_soon_at:
                self.poll_due += min(left, self.poll_soon_most) - self.poll_soon_at

    def poll_works(self) -> None:
        """Watchdog side: complete entries whose Work finished without telling us."""
        done: list[Entry] = []  # found done by this poll: completed together, unmeasured
        slot = self.async_slot
        entry = slot.entry if slot is not None else None
        if entry is not None:
            work = entry.work
            if work is None or work is not slot.work or not entry.pending:
                slot.release(entry)
            elif entry.device == "cpu":
                self._poll_one(entry, work, done)  # a device op there is polled with `polled`, in its stream
        for key, entry in list(self.by_work.items()):
            work = entry.work
            if work is None or not entry.pending:
                self.by_work.pop(key, None)
            elif entry.device == "cpu" and not self._poll_one(entry, work, done):  # device ops: in `polled` too
                self.by_work.pop(key, None)
        stale, streams, others, misses = self._scan_polled()
        for key in stale:
            self.polled.pop(key, None)
        for key, entry, work in misses:  # a (group, device) seen for the first time
            if self._in_order(entry.group, entry.device):
                stream = (entry.group, entry.peer if entry.kind == "p2p" else -1, entry.device)
                streams.setdefault(stream, []).append(entry)
            else:
                others.append((key, entry, work))
        for key, entry, work in others:
            if not self._poll_one(entry, work, done):
                self.polled.pop(key, None)
        for ops in streams.values():
            self._poll_in_order(ops, done)
        if done:
            self._complete_unmeasured(done)

    def _scan_polled(self) -> tuple[list[int], dict[tuple[str, int, str], list[Entry]],
                                    list[tuple[int, Entry, Any]], list[tuple[int, Entry, Any]]]:
        """`polled` sorted for the poll: (keys of settled entries, in-order device streams: their entries,
        oldest first, others and misses: (key, entry, Work), misses being device ops whose (group, device)
        `_in_order` has not looked up yet). In one C call where the extension is built: a Python walk
        cost the watchdog ~1.5 µs per device op, GIL held."""
        if _C_SCAN is not None:
            try:
                return _C_SCAN(self.polled, self._in_order_groups)  # type: ignore[no-any-return]
            except Exception:  # noqa: BLE001 - an entry not of the C layout: the walk below
                pass
        stale: list[int] = []
        streams: dict[tuple[str, int, str], list[Entry]] = {}
        others: list[tuple[int, Entry, Any]] = []
        misses: list[tuple[int, Entry, Any]] = []
        for key, entry in list(self.polled.items()):
            work = entry.work
            if work is None or not entry.pending:
                stale.append(key)
            elif entry.device == "cpu" or self._in_order_groups.get((entry.group, entry.device)) is False:
                others.append((key, entry, work))
            elif (entry.group, entry.device) not in self._in_order_groups:
                misses.append((key, entry, work))
            else:
                stream = (entry.group, entry.peer if entry.kind == "p2p" else -1, entry.device)
                streams.setdefault(stream, []).append(entry)
        return stale, streams, others, misses

    def _complete_unmeasured(self, entries: list[Entry]) -> None:
        """`complete_unmeasured` for each: in one C call where the hot path's extension is built (a
        Python call per op cost the watchdog ~1 µs per device op, with the GIL held)."""
        if _C_COMPLETE is not None and self.async_slot is not None:
            try:
                _C_COMPLETE(entries, self.by_work, self.pending, self.polled, self.async_slot)
                return
            except Exception:  # noqa: BLE001 - an entry not of the C layout: one by one below
                pass
        for entry in entries:
            if entry.pending:
                self.complete_unmeasured(entry)

    def _in_order(self, group_name: str, device: str) -> bool:
        """Whether the group's backend for `device` completes one stream's Works in issue order."""
        known = self._in_order_groups.get((group_name, device))
        if known is None:
            group = self._group_by_name(group_name)
            if group is None:
                return False
            known = self._in_order_groups[(group_name, device)] = device_backend(group.backend, device) in IN_ORDER
        return known

    def _late_group(self, group_name: str) -> bool:
        """Whether the group's backend completes Works after their wait (`StreamGroupState`)."""
        group = self._group_by_name(group_name)
        return type(group) is StreamGroupState

    def _poll_in_order(self, ops: list[Entry], done: list[Entry]) -> None:
        """One device stream's pending ops, oldest first: they finish in that order, so the newest done
        means all are, and otherwise bisection finds where the done ones end, in O(log n) queries
        instead of one per op (each ~1.2 µs on NCCL, with the GIL held). Any error: each op on its own.
        The ops found done go to `done` (completed unmeasured: their end events say when)."""
        ended = _done_in_order(ops)
        if ended is None:  # an error on the stream: find which ops failed, one by one
            for entry in ops:
                work = entry.work
                if work is not None and not self._poll_one(entry, work, done):
                    self.polled.pop(entry.id, None)
            return
        done += ops[:ended]

    def _poll_one(self, entry: Entry, work: Any, done: list[Entry]) -> bool:
        """Complete `entry` if its Work is done (a device or late op: added to `done`, completed
        unmeasured by the caller); False when the Work failed (marked failed)."""
        try:
            finished = work.is_completed()
        except Exception as exc:  # noqa: BLE001 - a failed work may raise when asked
            self.mark_failed(entry, exc)
            return False
        if finished:
            if entry.device != "cpu" or self._late_group(entry.group):  # a poll's moment is not the op's end
                try:
                    error = work.exception()  # NCCL's Work reads as completed once it has failed
                except Exception:  # noqa: BLE001 - a backend without the call: its is_completed raises instead
                    error = None
                if error is not None:
                    self.mark_failed(entry, error if isinstance(error, BaseException) else RuntimeError(str(error)))
                    return False
                done.append(entry)
            else:
                self._work_done(entry, work)
        return True

    # ------------------------------------------------------------------ units (batches, coalescing)
    def start_unit(self) -> list[Entry] | None:
        tls = self.thread_state()
        previous = tls.unit
        tls.unit = []
        return previous

    def end_unit(self, previous: list[Entry] | None, works: Any, blocking: bool) -> None:
        tls = self.thread_state()
        entries: list[Entry] = tls.unit or []
        tls.unit = previous
        if not entries:
            return
        works = [w for w in (works or []) if w is not None]
        unwatched = [e for e in entries if e.pending and e.work is None]
        if not unwatched:
            return
        if works:
            for entry in unwatched:
                self.watch_work(entry, works[-1])
        elif blocking:
            for entry in unwatched:
                if entry.device == "cpu":
                    self.complete(entry)

    # ------------------------------------------------------------------ C++ ops
    def note_cpp_ops(self, group: GroupState, backend_seq: int, now: int) -> None:
        """Record collectives the backend ran that no wrapped call explains (issued from C++)."""
        with self.cpp_lock:
            first = group.last_pg_seq + 1
            if backend_seq < first:
                return
            for pg_seq in range(first, backend_seq + 1):
                entry = Entry(self.ring.next_id(), group.name, "coll", "unknown", "c++")
                group.coll_seq += 1
                entry.seq = group.coll_seq
                entry.pg_seq = pg_seq
                entry.source = "c++"
                entry.state = "unknown"
                entry.t_enqueue_ns = now
                self.ring.put(entry.id, entry)
                self.cpp_open.append(entry)
            group.last_pg_seq = backend_seq
            if len(self.cpp_open) > self.ring.capacity:
                del self.cpp_open[: len(self.cpp_open) - self.ring.capacity]

    def scan_cpp_ops(self) -> None:
        """Watchdog side: a C++ op issued while no wrapped op of the group is in flight."""
        now = _monotonic_ns()
        for group in self.groups.live():
            if group.busy:
                continue
            seq = group.backend_seq()
            if seq > group.last_pg_seq:
                with self.cpp_lock:
                    if group.busy:
                        continue
                self.note_cpp_ops(group, seq, now)

    def fail_cpp_ops(self, exc: BaseException) -> list[Entry]:
        """The process dies of an uncaught communication error that no wrapped call saw: it came from an
        op issued in C++ (DDP's Reducer, functional collectives), whose Work we never hold. PyTorch's
        gloo recorder retires a failed op as completed, so its `pg_status` cannot tell. Taken as failed:
        the C++ ops still running per `pg_status`, and the rank's newest op when it is a C++ one (the
        last op a rank issued before dying of a backend error is the one whose Work raised). Returns them."""
        if not is_backend_error(exc):
            return []
        self.scan_cpp_ops()
        ended = torch_recorder.completed_seqs(torch_recorder.read(include_entries=False))
        newest = max(self.ring.snapshot() + list(self.cpp_open), key=lambda e: e.id, default=None)
        failed = [e for e in self.cpp_open if e.state in ("unknown", "started")
                  and e.pg_seq > ended.get(e.group, -1) and (e.group in ended or e.state == "started")]
        if newest is not None and newest.source == "c++" and newest.state != "failed" and all(newest is not e for e in failed):
            failed.append(newest)
        text = f"{type(exc).__name__}: {exc}"[:4000]
        for entry in failed:
            entry.state, entry.error, entry.t_complete_ns = "failed", text, None  # when it failed is not known
        self.cpp_failed += failed
        return failed

    # ------------------------------------------------------------------ helpers
    def _settle_seq(self, entry: Entry, group: GroupState) -> None:
        seq_after = group.backend_seq()
        if seq_after >= 0:
            entry.pg_seq = seq_after
            if seq_after > group.last_pg_seq:
                group.last_pg_seq = seq_after
        group.busy -= 1

    def _resolve_any_source(self, entry: Entry, group: GroupState, source: int) -> None:
        entry.peer = source
        entry.seq = group.received[source] = group.received.get(source, 0) + 1

    def _group_by_name(self, name: str) -> GroupState | None:
        for group in self.groups.known():
            if group.name == name:
                return group
        return None

    def in_flight(self, issued_before_ns: int | None = None) -> list[Entry]:
        """Every op not complete yet that a wrapped call recorded: the Python wrapper's are in
        `pending`; the C hot path files a blocking op in no table, its thread's `in_leaf` holds it
        while it runs (one dictionary insert and removal fewer per op), and an async one in
        `async_slot` or `by_work` once its call returned, in `in_leaf` again while it is waited on.
        `issued_before_ns`: only those issued before it (the watchdog's timeout check, each tick: the
        tables hold every device op until its poll, so they are filtered in C where it is built)."""
        tables: tuple[dict[Any, Entry], ...] = (self.pending, self.by_work, self.polled)
        before = issued_before_ns
        found: dict[int, Entry] = {}
        if before is not None and _C_ISSUED_BEFORE is not None:
            try:
                found = {e.id: e for e in _C_ISSUED_BEFORE(tables, before)}
                tables = ()
            except Exception:  # noqa: BLE001 - an entry not of the C layout: the walk below
                found = {}
        for table in tables:
            found.update((e.id, e) for e in list(table.values()))
        slot_entry = self.async_slot.entry if self.async_slot is not None else None  # read once: it changes
        if isinstance(slot_entry, Entry):
            found[slot_entry.id] = slot_entry
        for ref in self.threads:
            entry = getattr(ref(), "in_leaf", None)
            if isinstance(entry, Entry):
                found[entry.id] = entry
        return [e for e in found.values() if e.pending and (before is None or e.t_enqueue_ns < before)]

    def threads_in_ops(self) -> dict[int, int]:
        """Thread ident -> id of the op the thread is inside right now (-1: inside one whose entry the
        Python wrapper does not name). A thread missing here is in none: computing, or idle."""
        inside: dict[int, int] = {}
        for ref in self.threads:
            state = ref()
            leaf = getattr(state, "in_leaf", None)
            if isinstance(leaf, Entry):
                inside[state.ident] = leaf.id  # type: ignore[union-attr]
            elif leaf:
                inside[state.ident] = -1  # type: ignore[union-attr]
        return inside

    def release(self) -> None:
        """Disarmed (`flightrec.disable()`): let go of every ProcessGroup and Work, and through the
        Works of their tensors. A group kept alive past the job's `destroy_process_group()` is
        destroyed at interpreter exit instead, where gloo's threads cannot take the GIL any more:
        std::terminate, SIGABRT. The entries stay; a later `enable()` starts a new Recorder."""
        self.active = False
        self.groups.release_all()
        slot = self.async_slot
        if slot is not None and slot.entry is not None:
            slot.release(slot.entry)
        tables = [e for table in (self.pending, self.by_work, self.polled) for e in list(table.values())]
        for entry in self.ring.snapshot() + self.in_flight() + tables:
            entry.work = None
        for table in (self.pending, self.by_work, self.polled):
            table.clear()

    def _relabel_group(self, name: str, label: str) -> None:
        """A destroyed group's entries take its new label (groups.GroupRegistry: why)."""
        for entry in self.ring.snapshot() + self.in_flight() + list(self.cpp_open):
            if entry.group == name:
                entry.group = label

    def entries(self) -> list[Entry]:
        items = self.ring.snapshot()
        items.sort(key=lambda e: e.id)
        return items


def is_backend_error(exc: BaseException) -> bool:
    """An error a collective raised (torch's DistBackendError; gloo's transport errors are plain
    RuntimeErrors naming gloo's source file), not one of the job's own."""
    backend_error = getattr(torch.distributed, "DistBackendError", None)
    if backend_error is not None and isinstance(exc, backend_error):
        return True
    return bool(BACKEND_ERROR.search(str(exc)[:4000]))
