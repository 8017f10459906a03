"""The optional C hot path (`_fastpath.c`): the common call of a wrapped API recorded with no
Python frame, every other call handed to the Python wrapper, which stays the reference.

Why: the Python wrapper costs ~4 µs of interpretation per call in a hot loop and ~8 µs after a real
collective, against ~2 µs for PyTorch's own C++ recorder (docs/overhead.md). The extension is
built when the package is installed and a C compiler is there; without it, or with
`FLIGHTREC_FASTPATH=0`, every call takes the Python wrapper and records the same entries.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed.distributed_c10d as c10d

from .. import log
from . import cpp_reader, native
from .entry import Entry
from .groups import GroupState, StreamGroupState
from .ops import OpSpec
from .recorder import _ASYNC_APIS, RECHECK_EVERY, TRUST_AFTER, Recorder, ThreadState
from .stacks import _SKIP_BY_CODE, _SKIP_CACHE_LIMIT, frame_class

try:
    from . import _fastpath
except ImportError:  # not built (no compiler at install time): pure Python
    _fastpath = None  # type: ignore[assignment]

_configured = False
_with_reader = False


def available() -> bool:
    """True when the C hot path is built, supported by this Python and not switched off."""
    global _configured
    if native.c_module() is None:
        return False
    if not _configured:
        try:
            _configure(cpp_reader.fastpath_capsule())
        except Exception as exc:  # noqa: BLE001 - a layout it does not know: the Python path records
            log.warn_once("fastpath", f"C hot path unavailable, recording in Python: {exc!r}")
            return False
        _configured = True
        cpp_reader.when_loaded(_attach_reader)  # enable() called while torch is still importing: the reader comes later
    return True


def uses_torch_reader() -> bool:
    """Whether the C hot path reads tensors and counters through the built torch reader."""
    return available() and _with_reader


def use_torch_reader(on: bool) -> None:
    """Have the C hot path read tensors and counters through the built torch reader (`on`) or through
    torch's Python bindings: benchmarks/overhead.py measures what the reader saves."""
    if available():
        _configure(cpp_reader.fastpath_capsule() if on else None)


def _configure(capsule: Any) -> None:
    global _with_reader
    try:
        _fastpath.configure(Entry, GroupState, ThreadState, capsule)
        _with_reader = capsule is not None
    except ValueError as exc:  # a torch reader of another version: do without it
        log.warn_once("fastpath-peek", f"C hot path not using the torch reader: {exc!r}")
        _fastpath.configure(Entry, GroupState, ThreadState, None)
        _with_reader = False


def _attach_reader() -> None:
    try:
        _configure(cpp_reader.fastpath_capsule())
    except Exception as exc:  # noqa: BLE001 - the C path keeps reading through torch's bindings
        log.warn_once("fastpath-attach", f"C hot path not using the torch reader: {exc!r}")


def leaf(rec: Recorder, spec: OpSpec, original: Callable[..., Any], slow: Callable[..., Any],
         record_failure: Callable[[Recorder, tuple[Entry, GroupState], BaseException], None],
         work_wait: Callable[[Any], Any]) -> Callable[..., Any]:
    """`slow` (the Python wrapper) with the common call done in C; `slow` itself when not available.
    `work_wait`: `Work.wait` as flightrec found it (unwrapped), which a blocking device op calls."""
    if not available() or spec.kind == "composite" or rec.settings.stacks:
        return slow  # per-entry stacks are taken by the Python path
    params = tuple((name, spec.positions.get(name, -1), spec.defaults.get(name)) if name else (None, -1, None)
                   for name in spec.read_names())

    def on_finish_error(exc: BaseException) -> None:
        log.warn_once(f"finish-{spec.api}", f"could not complete {spec.api}: {exc!r}")

    def device_tail(entry: Entry, group: GroupState, result: Any, captured: bool, blocking: bool) -> Any:
        return device_op_tail(rec, spec, entry, group, result, captured, blocking)

    config = {
        "original": original, "slow": slow, "rec_dict": vars(rec), "local": rec.local, "by_pg": rec.groups.by_pg,
        "pending": rec.pending, "by_work": rec.by_work, "work_type": c10d.Work, "async_slot": rec.async_slot,
        "slots": rec.ring.slots, "capacity": rec.ring.capacity,
        "ids": rec.ring.ids, "world_dict": vars(c10d._world), "tensor_type": torch.Tensor,
        "finish": rec.finish, "seq_after": rec._seq_after, "record_failure": lambda entry, group, exc: record_failure(rec, (entry, group), exc),
        "on_finish_error": on_finish_error, "site_cache": _SKIP_BY_CODE, "frame_class": frame_class,
        "site_cache_limit": _SKIP_CACHE_LIMIT, "trust_after": TRUST_AFTER, "recheck_every": RECHECK_EVERY,
        "async_apis": _ASYNC_APIS, "api_name": spec.api, "op_name": spec.op, "kind": spec.kind,
        "is_coll": int(spec.kind == "coll"), "is_send": int(spec.direction == "send"),
        "always_async": int(spec.is_async_api), "has_endpoint": int(bool(spec.root or spec.peer)),
        "params": params,
        "stream_group_type": StreamGroupState, "polled": rec.polled, "poll_soon_at": rec.poll_soon_at, "wait_failed": _wait_failed(rec),
        "device_tail": device_tail, "work_wait": work_wait,
        "has_async": int("async_op" in spec.positions), "async_position": spec.positions.get("async_op", -1),
        "async_fill": _async_fill(original),
    }
    return _build(_fastpath.Leaf, config, slow, spec.api)


def _async_fill(original: Callable[..., Any]) -> tuple[tuple[Any] | None, ...]:
    """The defaults of the parameters before `async_op` ((default,), or None for one without), so that
    the C hot path forces a blocking device call async by position, not by keyword: torch's
    decorators (`*args, **kwargs`) then build no dict (~0.2 µs per call). Empty when async_op cannot
    be passed by position."""
    try:
        params = list(inspect.signature(original).parameters.values())
    except (TypeError, ValueError):
        return ()
    names = [p.name for p in params]
    if "async_op" not in names:
        return ()
    at = names.index("async_op")
    if any(p.kind is not inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params[: at + 1]):
        return ()
    return tuple((p.default,) if p.default is not inspect.Parameter.empty else None for p in params[:at])


def device_op_tail(rec: Recorder, spec: OpSpec, entry: Entry, group: GroupState, result: Any, captured: bool,
                   blocking: bool) -> Any:
    """A device op after its call: the Python wrapper's way (`patching.call_on_device`), and the C hot
    path's where it is not the common case (captured into a graph, or no Work returned)."""
    try:  # a captured op ran nothing now (it runs at each replay): done, never awaited by the watchdog
        rec.finish(entry, group, None if captured else result)
    except Exception as exc:  # noqa: BLE001
        log.warn_once(f"finish-{spec.api}", f"could not complete {spec.api}: {exc!r}")
    if captured:
        if blocking and result is not None:
            result.wait()  # inside the capture: a stream wait, captured like the op
        return None if blocking else result
    if blocking or result is None:
        if result is not None:
            try:
                result.wait()  # the current stream now waits for the op (its host returns at once)
            except BaseException as exc:
                _wait_failed(rec)(entry, result, exc)  # as the C path tells it
                raise
        try:
            rec.device_timing.waited(entry, since_issue=False)  # so the end event marks the op's end
        except Exception as exc:  # noqa: BLE001
            log.warn_once("device-waited", f"could not time a device op: {exc!r}")
        return None if blocking else result
    return result  # an async op: its end is timed when the training code waits on its Work


def _wait_failed(rec: Recorder) -> Callable[[Entry, Any, BaseException], None]:
    """What a failed `Work.wait` of a followed op does (the Python wrapper's `except` branch)."""
    def wait_failed(entry: Entry, work: Any, exc: BaseException) -> None:
        try:
            if entry.work is work:
                rec.report_failure(entry, exc)
        except Exception as inner:  # noqa: BLE001
            log.warn_once("wait-fail", f"could not record a failed wait: {inner!r}")
    return wait_failed


def wait(rec: Recorder, original: Callable[..., Any], slow: Callable[..., Any]) -> Callable[..., Any]:
    """`Work.wait`'s Python wrapper `slow`, with the waits of Works nobody follows and the
    completions of the ones we do in C; `slow` itself when not available."""
    if not available():
        return slow
    config = {"original": original, "slow": slow, "by_work": rec.by_work, "pending": rec.pending,
              "wait_failed": _wait_failed(rec), "local": rec.local, "async_slot": rec.async_slot,
              "rec_dict": vars(rec)}
    return _build(_fastpath.Wait, config, slow, "Work.wait")


def _build(kind: Any, config: dict[str, Any], slow: Callable[..., Any], what: str) -> Any:
    """The C wrapper, dressed as the Python wrapper `slow` (name, doc and every attribute functools.wraps
    and patching gave it); `slow` itself when the C side refuses the config."""
    try:
        fast = kind(config)
    except Exception as exc:  # noqa: BLE001
        log.warn_once(f"fastpath-{what}", f"C hot path unavailable for {what}, recording in Python: {exc!r}")
        return slow
    for attr in ("__module__", "__name__", "__qualname__", "__doc__"):
        try:
            setattr(fast, attr, getattr(slow, attr))
        except AttributeError:
            pass
    vars(fast).update(vars(slow))  # __wrapped__, patching's WRAPPED_MARK
    return fast
