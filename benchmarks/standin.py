"""A stand-in device, so that flightrec's device path can be timed on a machine without one (benchmarks only).

Why: the device path (ops on NCCL/HCCL tensors: forced async, start/end events, the Work followed
and polled) is Python code flightrec runs on the training thread, and its host cost can be measured
anywhere if something takes the device's place. Three pieces do:

- `StandinProcessGroup`: a Python `ProcessGroup` registered as the backend `standin`. Each op returns
  a C++ Work (`_create_work_from_future`) wrapping a future that is already complete, as if the device
  had run the op the moment it was queued: `wait()`, `get_future()` and `is_completed()` are torch's
  own C++ calls, and flightrec files the group as one whose Works complete after their wait (NCCL's kind).
- `meta` tensors (no storage): flightrec records the op's device as `meta`, not `cpu`, so it takes the
  device path exactly as for `cuda`.
- `StandinEvent`, installed as the recorder's event factory (`DeviceTiming`'s injectable one):
  `record()` stores the host clock, `query()` is true once recorded. flightrec records and resolves
  them as it does `torch.Event`s. The benchmarks use its C twin (`standin_event.c`, built on first
  use), whose methods are C as `torch.Event`'s are; the tests use this Python one.

Not modelled: the device runtime's own host costs: `cudaEventRecord` behind `torch.Event.record`,
the graph-capture query on `torch.cuda`, NCCL's enqueue and its CUDA future's stream bookkeeping,
`is_completed()`'s event query, and the backend counter read (this group keeps no counter).
`benchmarks/overhead.py --device cuda` measures the real path.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import shlex
import subprocess
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future

BACKEND = "standin"
DEVICE = "meta"

WHAT_IT_MODELS = (
    f"stand-in: backend '{BACKEND}' (a Python ProcessGroup whose ops return a C++ Work wrapping an already-completed "
    f"future: a device that ran the op at once) on '{DEVICE}' tensors (no data), so flightrec takes its device path "
    "(forced async, start/end events, Work followed, polled and resolved by the watchdog); events: StandinEvent "
    "(record() stores the host clock, query() is true once recorded; C methods, as torch.Event's, unless the C "
    "twin could not be built) as the recorder's event factory")
NOT_MODELLED = (
    "not modelled: the device runtime's own host costs (cudaEventRecord behind torch.Event.record, the graph-capture "
    "query on torch.cuda, NCCL's enqueue and its CUDA future's stream bookkeeping, is_completed()'s event query) and "
    "the backend counter read (the stand-in group keeps none): `--device cuda` measures those")


class StandinEvent:
    """Stands in for `torch.Event`: recorded on a device that has always caught up with the host."""

    __slots__ = ("t_ns",)
    created = 0  # how many flightrec asked for: proof that the device path ran with these

    def __init__(self, device: str) -> None:
        StandinEvent.created += 1
        self.t_ns: int | None = None

    def record(self) -> None:
        self.t_ns = time.monotonic_ns()

    def query(self) -> bool:
        return self.t_ns is not None

    def synchronize(self) -> None:
        return None

    def elapsed_time(self, end: StandinEvent) -> float:
        if self.t_ns is None or end.t_ns is None:
            raise ValueError("both events must be recorded before calculating elapsed time")
        return (end.t_ns - self.t_ns) / 1e6


class StandinProcessGroup(dist.ProcessGroup):
    """Completes every op at once; the data is not touched (meta tensors have none)."""

    def __init__(self, rank: int, size: int) -> None:
        super().__init__(rank, size)

    def allreduce(self, tensors: list[torch.Tensor], opts: Any) -> Any:
        done: torch.futures.Future[list[torch.Tensor]] = torch.futures.Future()
        done.set_result(tensors)
        return _create_work_from_future(done)

    def getBackendName(self) -> str:  # noqa: N802 - the C++ name the trampoline calls
        return BACKEND


def _create(store: Any, rank: int, size: int, timeout: Any) -> StandinProcessGroup:
    return StandinProcessGroup(rank, size)


def register() -> None:
    """Make `standin` a backend name torch.distributed knows (once per process)."""
    if BACKEND.upper() not in getattr(dist.Backend, "_plugins", {}):
        dist.Backend.register_backend(BACKEND, _create, devices=["cpu", DEVICE])


def polled_as_nccl(recorder: Any, pg: Any) -> None:
    """Have flightrec poll the stand-in group's device ops as it polls NCCL's and HCCL's: one stream's
    Works complete in issue order, so a tick asks the newest and bisects (O(log n) queries) instead
    of asking every op (a custom backend's path). The stand-in's Works are all complete when made, so
    either way is right; this one is what an NCCL job runs. (The recorder's per-group cache of that
    fact, which it fills from the backend's name; a benchmark's poke, not an API.)"""
    recorder._in_order_groups[(recorder.groups.get(pg).name, DEVICE)] = True


def gloo_path_group(recorder: Any) -> Any:
    """A stand-in group that flightrec files as it files gloo's (a `GroupState`: an op is complete when
    its call, or its Work's wait, returns), for CPU tensors: flightrec's gloo path timed on the same
    backend call as its device path, so the two costs differ only by what flightrec does. (Timed on
    real gloo, the gloo path pays more: its ~100 µs call, on gloo's worker thread, leaves the
    recorder's cache lines cold; docs/overhead.md.)"""
    from flightrec.record.groups import GroupState

    pg = dist.new_group(backend=BACKEND)
    filed = recorder.groups.get(pg)
    recorder.groups.by_pg[pg] = GroupState(pg, filed.name, filed.desc, "gloo", filed.ranks, filed.rank_in_group)
    return pg


_SOURCE = Path(__file__).with_name("standin_event.c")
_BUILT = Path(__file__).with_name("_built")


@functools.cache
def c_event_type() -> Any:
    """`standin_event.c`'s StandinEvent: `StandinEvent` with C methods, as `torch.Event`'s are, built
    here on first use (a second, the machine's C compiler and Python headers); None where it cannot
    be built. Why: a Python `record()` costs ~0.6 µs more per op than a C one, billed to flightrec's
    device path (two per op), where a real device's `torch.Event.record` is C++."""
    source = _SOURCE.read_bytes()
    tag = hashlib.sha256(source + sysconfig.get_config_var("EXT_SUFFIX").encode()).hexdigest()[:16]
    target = _BUILT / f"standin_event-{tag}{sysconfig.get_config_var('EXT_SUFFIX')}"
    try:
        if not target.exists():
            _BUILT.mkdir(exist_ok=True)
            with tempfile.TemporaryDirectory(dir=_BUILT) as work:
                partial = Path(work) / target.name
                compiler = shlex.split(sysconfig.get_config_var("CC") or "cc")
                subprocess.run([*compiler, "-O2", "-shared", "-fPIC", f"-I{sysconfig.get_paths()['include']}",
                                str(_SOURCE), "-o", str(partial)], check=True, capture_output=True, timeout=120)
                os.replace(partial, target)  # whole or not at all: two processes may build it at once
        spec = importlib.util.spec_from_file_location("standin_event", target)
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        spec.loader.exec_module(module)  # type: ignore[union-attr]
    except (OSError, subprocess.SubprocessError, ImportError):
        return None
    return module


def install_events(recorder: Any, kind: str = "c") -> Any:
    """Give `recorder` a DeviceTiming whose events are stand-ins (flightrec's own constructor, its
    injectable factory); everything else about it is flightrec's as it is at run time. `kind`: "c" (the
    C stand-in, or the Python one where it cannot be built) or "python"."""
    from flightrec.record.device_timing import DeviceTiming

    module = c_event_type() if kind == "c" else None
    recorder.device_timing = DeviceTiming(factory=module.StandinEvent if module is not None else StandinEvent)
    return recorder.device_timing


def event_kind(timing: Any) -> str:
    """Which stand-in events `timing` makes: "c" or "python"."""
    return "python" if timing._factory is StandinEvent else "c"


def events_created(timing: Any) -> int:
    """How many stand-in events flightrec asked `timing`'s factory for (proof that the device path ran with them)."""
    if timing._factory is StandinEvent:
        return StandinEvent.created
    return int(c_event_type().created())  # type: ignore[union-attr]


def record_cost_us(timing: Any, calls: int = 20000) -> float:
    """The stand-in's own price: µs per `record()` of `timing`'s events in a hot loop (two per op on the device path)."""
    event = timing._factory(DEVICE)
    record = event.record
    start = time.perf_counter_ns()
    for _ in range(calls):
        record()
    return (time.perf_counter_ns() - start) / calls / 1e3
