"""Rank functions for tests/recorder/test_disable_teardown.py (module level so spawn can import them)."""

from __future__ import annotations

import gc
import weakref

import torch
import torch.distributed as dist

import flightrec
from flightrec import arming
from tests.helpers import init_rank


def disable_and_leave(rank: int, world_size: int, port: int, out: str, order: str, armed_by_env: bool) -> None:
    """Record a few ops, then `flightrec.disable()` and `destroy_process_group()` in `order`, and exit.

    Once both ran, nothing may keep the group or an unwaited Work alive: a ProcessGroupGloo that
    outlives them is destroyed at interpreter exit, where its worker threads can no longer take the
    GIL, and the process dies of SIGABRT ("terminate called without an active exception"). No
    gc.collect() here on purpose: a reference cycle holding the group lasts until the interpreter's
    final collection, which is just that moment.
    """
    if not armed_by_env:
        assert flightrec.enable(dir=out, timeout_s=60)
    init_rank(rank, world_size, port)
    armed = arming.current()
    assert armed is not None, "the recorder is not armed"
    armed_ref = weakref.ref(armed)
    del armed
    world = weakref.ref(dist.group.WORLD)
    t = torch.ones(4)
    for _ in range(3):
        dist.all_reduce(t)
    unwaited = weakref.ref(dist.all_reduce(torch.ones(4), async_op=True))  # nobody ever waits on it
    dist.barrier()  # it ran on both ranks before either leaves
    kept = dist.all_reduce(t, async_op=True)  # waited after the p2p ops, held until the rank exits
    if rank == 0:
        dist.send(torch.ones(3), 1)
        dist.irecv(torch.zeros(3), 1).wait()
    else:
        dist.recv(torch.zeros(3), 0)
        dist.isend(torch.ones(3), 0).wait()
    kept.wait()
    if order == "disable_first":
        flightrec.disable()
        dist.destroy_process_group()
    else:
        dist.destroy_process_group()
        flightrec.disable()
    alive = [what for what, ref in (("the default ProcessGroup", world), ("an unwaited Work", unwaited))
             if ref() is not None]
    assert not alive, f"after disable() and destroy_process_group() ({order}), still alive: {alive}"
    gc.collect()  # the recorder itself may be a cycle, but nothing of the job's (torch's excepthook) may reach it
    assert armed_ref() is None, "the disabled recorder is still reachable"


def enable_again(rank: int, world_size: int, port: int, out: str) -> None:
    """enable(), disable(), enable() again on the same live group: the second recorder records it."""
    assert flightrec.enable(dir=out, timeout_s=60)
    init_rank(rank, world_size, port)
    t = torch.ones(4)
    dist.all_reduce(t)
    flightrec.disable()
    dist.broadcast(t, src=0)  # disarmed: in no dump
    assert flightrec.enable(dir=out, timeout_s=60)
    dist.all_reduce(t)
    dist.all_reduce(t, async_op=True).wait()
    assert flightrec.dump() is not None
    flightrec.disable()
    dist.destroy_process_group()
