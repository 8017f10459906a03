"""Wrap the public torch.distributed functions so every call is recorded, and undo it exactly.

Both `torch.distributed.X` and `torch.distributed.distributed_c10d.X` are replaced: training code
calls the first, and PyTorch's own helpers (send → isend, all_gather_object → all_gather,
batch_isend_irecv → isend/irecv) call the second through module globals, which is how composite
APIs get their inner ops recorded.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from .. import launchers, log
from . import early_references, fastpath
from .groups import StreamGroupState
from .ops import SPECS, OpSpec
from .recorder import Recorder

_MODULES = (dist, c10d)
WRAPPED_MARK = "__flightrec_wrapped__"


def leaf_wrapper(rec: Recorder, spec: OpSpec, original: Callable[..., Any]) -> Callable[..., Any]:
    local = rec.local
    begin = rec.compile(spec)
    finish = rec.finish

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not rec.active:
            return original(*args, **kwargs)
        try:
            tls = local.state
        except AttributeError:
            tls = rec.thread_state()
        if tls.in_leaf:
            return original(*args, **kwargs)
        try:
            ctx = begin(args, kwargs, tls)
        except Exception as exc:  # noqa: BLE001 - never let the recorder break the call
            log.warn_once(f"begin-{spec.api}", f"could not record {spec.api}: {exc!r}")
            ctx = None
        if ctx is None:
            return original(*args, **kwargs)
        entry = ctx[0]
        if entry.device != "cpu" or type(ctx[1]) is StreamGroupState:  # done when its Work is, not on return
            return call_on_device(rec, spec, original, ctx, tls, args, kwargs)
        tls.in_leaf = True
        try:
            result = original(*args, **kwargs)
        except BaseException as exc:
            tls.in_leaf = False
            _record_failure(rec, ctx, exc)
            raise
        tls.in_leaf = False
        try:
            finish(entry, ctx[1], result)
        except Exception as exc:  # noqa: BLE001
            log.warn_once(f"finish-{spec.api}", f"could not complete {spec.api}: {exc!r}")
        return result

    setattr(wrapper, WRAPPED_MARK, original)
    work_wait = c10d.Work.wait
    return fastpath.leaf(rec, spec, original, wrapper, _record_failure, getattr(work_wait, WRAPPED_MARK, work_wait))


def call_on_device(rec: Recorder, spec: OpSpec, original: Callable[..., Any], ctx: tuple[Any, Any],
                    tls: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """A device op (NCCL, HCCL): timed with device events. A blocking call on a device backend
    returns before the device ran it: it is issued async and waited for here, so the Work (and its
    completion) is ours to follow."""
    entry = ctx[0]
    blocking = not entry.is_async and "async_op" in spec.positions
    if blocking:
        args, kwargs = _force_async(spec, args, kwargs)
    call = original
    twin = ASYNC_TWINS.get(spec.api) if not entry.is_async and entry.peer >= 0 else None
    if twin is not None:  # blocking send/recv: no async_op to force, so its async twin, whose Work we follow
        call, blocking = getattr(c10d, twin), True  # wrapped too: `in_leaf` takes it straight to the original
    captured = rec.device_timing.before(entry)
    tls.in_leaf = True
    try:
        result = call(*args, **kwargs)
    except BaseException as exc:
        tls.in_leaf = False
        _record_failure(rec, ctx, exc)
        raise
    tls.in_leaf = False
    done = fastpath.device_op_tail(rec, spec, entry, ctx[1], result, captured, blocking)
    return entry.peer if twin == "irecv" else done  # recv returns its source's global rank


# A blocking p2p call on a device backend returns once its Work is queued (NCCL's `wait()` holds the
# stream, not the host): issued as its async twin, its Work says when the transfer really ended.
ASYNC_TWINS = {"send": "isend", "recv": "irecv"}


def _record_failure(rec: Recorder, ctx: tuple[Any, Any], exc: BaseException) -> None:
    try:
        rec.fail(ctx[0], ctx[1], exc)
    except Exception as inner:  # noqa: BLE001
        log.warn_once("fail", f"could not record a failure: {inner!r}")


def _force_async(spec: OpSpec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    position = spec.positions["async_op"]
    if position < len(args):
        return args[:position] + (True,) + args[position + 1:], kwargs
    return args, {**kwargs, "async_op": True}


def _composite_wrapper(rec: Recorder, spec: OpSpec, original: Callable[..., Any]) -> Callable[..., Any]:
    """APIs made of several backend ops: their inner calls are recorded under this API's name."""
    is_batch = spec.api == "batch_isend_irecv"

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not rec.active:
            return original(*args, **kwargs)
        tls = rec.thread_state()
        if tls.in_leaf:
            return original(*args, **kwargs)
        previous_api = tls.api
        if previous_api is None:
            tls.api = spec.api
        previous_unit = rec.start_unit() if is_batch else None
        works = None
        try:
            works = original(*args, **kwargs)
            return works
        finally:
            tls.api = previous_api
            if is_batch:
                try:
                    rec.end_unit(previous_unit, works, blocking=False)
                except Exception as exc:  # noqa: BLE001
                    log.warn_once("batch", f"could not follow a batch: {exc!r}")

    setattr(wrapper, WRAPPED_MARK, original)
    return wrapper


def _coalescing_wrapper(rec: Recorder, original: Callable[..., Any]) -> Callable[..., Any]:
    @contextlib.contextmanager
    def wrapper(group: Any = None, device: Any = None, async_ops: bool = False) -> Iterator[Any]:
        if not rec.active:
            with original(group, device, async_ops) as cm:
                yield cm
            return
        tls = rec.thread_state()
        previous_api = tls.api
        if previous_api is None:
            tls.api = "coalescing_manager"
        state = rec.groups.get(group if group is not None else c10d._get_default_group())
        if state is not None:
            state.busy += 1  # the unit's backend op runs at exit, outside any leaf
        previous_unit = rec.start_unit()
        cm = None
        try:
            with original(group, device, async_ops) as cm:
                yield cm
        finally:
            tls.api = previous_api
            try:
                if state is not None:
                    state.busy -= 1
                    seq = state.backend_seq()
                    if seq > state.last_pg_seq:
                        state.last_pg_seq = seq
                rec.end_unit(previous_unit, getattr(cm, "works", None), blocking=not async_ops)
            except Exception as exc:  # noqa: BLE001
                log.warn_once("coalescing", f"could not follow a coalescing block: {exc!r}")

    functools.update_wrapper(wrapper, original)
    setattr(wrapper, WRAPPED_MARK, original)
    return wrapper


# Creators register their groups at once; destroy_process_group lets go of them at once (record/groups.py).
_GROUP_CREATORS = ("init_process_group", "new_group", "new_subgroups", "new_subgroups_by_enumeration", "split_group",
                   "destroy_process_group")


def _creator_wrapper(rec: Recorder, original: Callable[..., Any]) -> Callable[..., Any]:
    """Register groups the moment they exist, so C++ ops on them are counted from their first one,
    and release destroyed ones before the job can create the next."""

    destroys = original.__name__ == "destroy_process_group"

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if destroys:
            _remember_rank()
        if destroys and rec.active:
            try:  # the last C++ ops (DDP's final all-reduce) are counted while their group can still be read
                rec.scan_cpp_ops()
            except Exception as exc:  # noqa: BLE001
                log.warn_once("final-scan", f"could not count the last C++-issued ops: {exc!r}")
        if not destroys and rec.active:
            try:  # destroyed groups take their labels before a group that may reuse a name exists
                rec.groups.relabel_retired()
            except Exception as exc:  # noqa: BLE001
                log.warn_once("relabel", f"could not rename destroyed process groups: {exc!r}")
        result = original(*args, **kwargs)
        if not destroys:
            _remember_rank()
        if rec.active:
            try:
                rec.groups.discover()
            except Exception as exc:  # noqa: BLE001
                log.warn_once("discover", f"could not register new process groups: {exc!r}")
        return result

    setattr(wrapper, WRAPPED_MARK, original)
    return wrapper


def wait_wrapper(rec: Recorder, original: Callable[..., Any]) -> Callable[..., Any]:
    """Work.wait: the moment a CPU op is known complete, on the thread that waited for it; for a
    device op, the moment the current stream waits for it (its end event goes there)."""
    entry_of = rec.entry_of

    @functools.wraps(original)
    def wait(self: Any, *args: Any, **kwargs: Any) -> Any:
        entry = entry_of(self)
        if entry is None:
            return original(self, *args, **kwargs)
        try:
            result = original(self, *args, **kwargs)
        except BaseException as exc:
            try:
                if entry.work is self:
                    rec.report_failure(entry, exc)
            except Exception as inner:  # noqa: BLE001
                log.warn_once("wait-fail", f"could not record a failed wait: {inner!r}")
            raise
        try:
            if entry.device != "cpu":  # device op: its wait only made the current stream wait for it
                rec.device_waited(entry, self)
            elif result is not False:  # wait(timeout) returns False when it timed out
                rec.on_wait_returned(entry, self)
        except Exception as exc:  # noqa: BLE001
            log.warn_once("wait", f"could not complete a waited op: {exc!r}")
        return result

    setattr(wait, WRAPPED_MARK, original)
    return fastpath.wait(rec, original, wait)


class Patcher:
    """Installs the wrappers and remembers every original so `restore` puts back exactly them."""

    def __init__(self, rec: Recorder) -> None:
        self.rec = rec
        self.originals: list[tuple[Any, str, Any]] = []
        self.rebound: list[tuple[Any, str, Any, Any]] = []  # early_references.rebind's changes

    def install(self) -> None:
        wrappers: dict[str, Callable[..., Any]] = {}
        for spec in SPECS:
            original = getattr(c10d, spec.api, None)
            if original is None or hasattr(original, WRAPPED_MARK):
                continue
            if spec.kind == "composite":
                wrappers[spec.api] = _composite_wrapper(self.rec, spec, original)
            else:
                wrappers[spec.api] = leaf_wrapper(self.rec, spec.bind_positions(original), original)
        for name in _GROUP_CREATORS:
            original = getattr(c10d, name, None)
            if original is not None and not hasattr(original, WRAPPED_MARK):
                wrappers[name] = _creator_wrapper(self.rec, original)
        original_cm = getattr(c10d, "_coalescing_manager", None)
        if original_cm is not None and not hasattr(original_cm, WRAPPED_MARK):
            wrappers["_coalescing_manager"] = _coalescing_wrapper(self.rec, original_cm)
        work_type = getattr(c10d, "Work", None)
        if work_type is not None and not hasattr(work_type.wait, WRAPPED_MARK):
            self.originals.append((work_type, "wait", work_type.wait))
            work_type.wait = wait_wrapper(self.rec, work_type.wait)
        wrapper_of: dict[int, Callable[..., Any]] = {}
        for module in _MODULES:
            for name, wrapper in wrappers.items():
                if hasattr(module, name):
                    original = getattr(module, name)
                    self.originals.append((module, name, original))
                    wrapper_of[id(original)] = wrapper
                    setattr(module, name, wrapper)
        try:  # references taken before we armed (DeepSpeed's TorchBackend): pointed at the wrappers too
            self.rebound = early_references.rebind(lambda fn: wrapper_of.get(id(fn)))
        except Exception as exc:  # noqa: BLE001 - those calls are then seen as C++-issued ops
            log.warn_once("captured", f"could not wrap references a library kept to torch.distributed: {exc!r}")
        _remember_rank()

    def restore(self) -> None:
        early_references.restore(self.rebound)
        for module, name, original in reversed(self.originals):
            setattr(module, name, original)
        self.originals.clear()


def _remember_rank() -> None:
    """Keep torch.distributed's rank for dumps written after destroy_process_group (launchers.py)."""
    try:
        if dist.is_initialized():
            launchers.remember(dist.get_rank(), dist.get_world_size())
    except Exception:  # noqa: BLE001 - the launcher's variables name the dump then
        pass
