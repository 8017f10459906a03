"""Rank functions and helpers for the reliability tests (module level, so spawn can import them)."""

from __future__ import annotations

import ctypes
import json
import os
import resource
import shutil
import signal
import threading
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

import flightrec
from flightrec.format.names import dump_filename
from tests.helpers import init_rank


def _save(path: str, value: object) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(value, handle)


def drop_dac_override() -> None:
    """Make root obey file permissions (clear CAP_DAC_OVERRIDE/READ_SEARCH from the effective set).

    Lowering one's own effective capabilities needs no privilege, so this works wherever the tests
    run as root (a CI container), without mounts.
    """
    if os.geteuid() != 0:
        return

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                    ("inheritable", ctypes.c_uint32)]

    libc = ctypes.CDLL(None, use_errno=True)
    header = Header(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3
    data = (Data * 2)()
    if libc.capget(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capget")
    data[0].effective &= ~((1 << 1) | (1 << 2))  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
    if libc.capset(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capset")


def broken_folder(rank: int, world_size: int, port: int, out: str, result: str) -> None:
    """The dump folder is full, then read-only, then missing; the job trains through all of it.

    Each phase: a few dumps that must fail (None) while training goes on, then the fault is
    repaired and the next dump must succeed and hold what was recorded meanwhile.
    """
    assert flightrec.enable(dir=out, timeout_s=60)
    init_rank(rank, world_size, port)
    t = torch.ones(4)
    report: dict[str, object] = {}
    ops = 0

    def train(n: int) -> None:
        nonlocal ops
        for _ in range(n):
            dist.all_reduce(t)
            ops += 1

    def phase(name: str, break_it: Callable[[], object], repair: Callable[[], object], every_rank: bool) -> None:
        dist.barrier()
        if every_rank or rank == 0:
            break_it()
        dist.barrier()
        failed = []
        for attempt in range(3):
            train(5)
            failed.append(flightrec.dump(f"{name}-{attempt}"))
        dist.barrier()
        if every_rank or rank == 0:
            repair()
        dist.barrier()
        train(2)
        report[name] = {"failed": failed, "later": flightrec.dump(f"{name}-later"), "ops": ops}

    os.makedirs(out, exist_ok=True)
    hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]

    # full: a file size limit per process (Python ignores SIGXFSZ, so write() fails with EFBIG)
    phase("full", lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (256, hard)),
          lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard)), every_rank=True)
    drop_dac_override()
    phase("read_only", lambda: os.chmod(out, 0o555), lambda: os.chmod(out, 0o755), every_rank=False)
    phase("missing", lambda: shutil.rmtree(out), lambda: None, every_rank=False)  # dumps recreate it
    report["sigxfsz"] = signal.getsignal(signal.SIGXFSZ) == signal.SIG_IGN
    _save(f"{result}.{rank}", report)
    dist.destroy_process_group()


def store_host_dies(rank: int, world_size: int, port: int, out: str, result: str) -> None:
    """Rank 0 hosts the TCPStore and is killed; ranks 1 and 2 then deadlock on a p2p pair.

    Nobody can ask anybody through the store any more: each survivor must dump on its own timeout.
    A helper thread saves the first dump each survivor wrote (a later one may say op_failed: the
    other survivor leaving closes the pair), and ends the rank once both have (exit 0) or after
    40 s (exit 7).
    """
    assert flightrec.enable(dir=out, timeout_s=1.0)
    init_rank(rank, world_size, port)
    pair = dist.new_group([1, 2])
    dist.all_reduce(torch.ones(2))
    dist.barrier()
    if rank == 0:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(1.0)  # rank 0, and the store with it, are gone
    died = time.monotonic()
    mine = os.path.join(out, dump_filename(rank))

    def leave_when_both_dumped() -> None:
        from tests.helpers import load_dump

        deadline = time.monotonic() + 40
        while time.monotonic() < deadline and not os.path.exists(mine):
            time.sleep(0.02)
        if os.path.exists(mine):
            dump = load_dump(out, rank)
            _save(f"{result}.{rank}", {"dump": dump, "after_s": time.monotonic() - died})
        while time.monotonic() < deadline:
            if all(os.path.exists(f"{result}.{r}") for r in (1, 2)):
                os._exit(0)
            time.sleep(0.02)
        os._exit(7)

    threading.Thread(target=leave_when_both_dumped, daemon=True).start()
    other = 2 if rank == 1 else 1
    try:
        dist.recv(torch.zeros(2), src=other, group=pair)  # both receive: a deadlock
    except Exception:  # noqa: BLE001 - the other survivor left first (os._exit): the helper thread ends us
        time.sleep(60)


def forget_gloo_addresses(group_name: str) -> None:
    """Delete a destroyed group's gloo addresses ("<name>//cpu//0/<rank>") from the store.

    PyTorch leaves them there, and a group re-created under the same name can read its peer's
    stale address before the peer writes the new one: gloo then connects to an old port that
    another socket may hold by now ("Connection reset by peer", then a hang). Without the recorder
    this broke 2-6 of 10 runs of 40 reuse cycles on 2 loaded cores.
    """
    dist.barrier()
    if dist.get_rank() == 0:
        store = dist.distributed_c10d._get_default_store()
        for key in store.list_keys():
            if key.startswith(f"{group_name}/"):
                store.delete_key(key)
    dist.barrier()


def threads_and_groups(rank: int, world_size: int, port: int, out: str, result: str,
                       threads: int, per_thread: int, many: int, cycles: int) -> None:
    """Collectives from several threads at once (one group each), thousands of groups, and groups
    destroyed and re-created under the same name; reports the recorder's bookkeeping sizes."""
    os.environ["TORCH_GLOO_LAZY_INIT"] = "1"  # thousands of groups without thousands of sockets
    assert flightrec.enable(dir=out, timeout_s=60, buffer=threads * per_thread + 2 * per_thread + 4 * cycles + 400)
    init_rank(rank, world_size, port)
    from flightrec import arming

    # Same ranks, hashed name: PyTorch reuses the name every cycle.
    for _ in range(cycles):
        g = dist.new_group([0, 1], use_local_synchronization=True)
        dist.all_reduce(torch.ones(1), group=g)
        dist.all_reduce(torch.ones(1), group=g)
        dist.barrier()
        name = g.group_name
        dist.destroy_process_group(g)
        del g
        forget_gloo_addresses(name)

    groups = [dist.new_group([0, 1]) for _ in range(threads)]
    start = threading.Barrier(threads + 1)

    def work(g: dist.ProcessGroup) -> None:
        start.wait()
        x = torch.ones(8)
        for i in range(per_thread):
            if i % 3 == 0:
                dist.all_reduce(x, group=g, async_op=True).wait()
            else:
                dist.all_reduce(x, group=g)

    pool = [threading.Thread(target=work, args=(g,), name=f"trainer-{i}") for i, g in enumerate(groups)]
    for p in pool:
        p.start()
    start.wait()
    for _ in range(per_thread):
        dist.broadcast(torch.ones(3), src=0)  # the main thread on the default group meanwhile
    for p in pool:
        p.join()

    began = time.monotonic()
    lots = [dist.new_group([0, 1]) for _ in range(many)]
    created_s = time.monotonic() - began
    for g in lots[:: max(1, many // 100)]:
        dist.all_reduce(torch.ones(1), group=g)
    registry = arming.current().recorder.groups
    live_after_many = len(registry.known())

    path = flightrec.dump("threads-and-groups")
    _save(f"{result}.{rank}", {"path": path, "created_s": created_s, "live_after_many": live_after_many,
                               "live_at_end": len(registry.known()), "retired": len(registry.retired),
                               "pending": len(arming.current().recorder.in_flight())})
    dist.destroy_process_group()


class WhoAmI(torch.utils.data.Dataset):
    """A DataLoader dataset whose items say, from inside the worker, what the recorder does there."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> torch.Tensor:
        from flightrec import arming

        armed = arming.current()
        watchdogs = sum(t.name == "flightrec-watchdog" for t in threading.enumerate())
        recorded = armed.recorder.ring.recorded if armed is not None else 0
        return torch.tensor([os.getpid(), int(armed is not None), watchdogs, recorded])


def a_thousand_groups(rank: int, world_size: int, port: int, out: str, result: str, many: int, used: int) -> None:
    """`many` live groups (gloo, lazy init), collectives on `used` of them; reports the registry size."""
    os.environ["TORCH_GLOO_LAZY_INIT"] = "1"
    assert flightrec.enable(dir=out, timeout_s=60)
    init_rank(rank, world_size, port)
    from flightrec import arming

    began = time.monotonic()
    lots = [dist.new_group([0, 1]) for _ in range(many)]
    created_s = time.monotonic() - began
    for i, g in enumerate(lots[:: max(1, many // used)]):
        for _ in range(i % 3 + 1):  # 1, 2 or 3 ops: per-group numbering must follow each group
            dist.all_reduce(torch.ones(1), group=g)
    registry = arming.current().recorder.groups
    path = flightrec.dump("a-thousand-groups")
    _save(f"{result}.{rank}", {"path": path, "created_s": created_s, "live": len(registry.known()),
                               "pending": len(arming.current().recorder.in_flight())})
    dist.destroy_process_group()


def group_name_reused_by_other_members(rank: int, world_size: int, port: int, out: str, second_port: int) -> None:
    """Group "1" = [0, 1] runs three all-reduces; the job re-initialises (PyTorch numbers groups from "0"
    again), so group "1" is now [1, 2]: one all-reduce completes, then rank 2 stalls in compute while
    rank 1 waits in the second. Rank 1 saw the old group, rank 2 did not."""
    assert flightrec.enable(dir=out, timeout_s=3)
    init_rank(rank, world_size, port)
    old = dist.new_group([0, 1])
    if rank in (0, 1):
        for _ in range(3):
            dist.all_reduce(torch.ones(4), group=old)
    dist.barrier()
    dist.destroy_process_group()
    init_rank(rank, world_size, second_port)
    new = dist.new_group([1, 2])
    if rank == 1:
        assert new.group_name == old.group_name, (new.group_name, old.group_name)  # PyTorch reused the name
    if rank in (1, 2):
        dist.all_reduce(torch.ones(4), group=new)
        if rank == 2:
            _until_dumped(out, world_size)  # stalled in compute: the culprit
        else:
            threading.Thread(target=_until_dumped, args=(out, world_size), daemon=True).start()
            dist.all_reduce(torch.ones(4), group=new)
    _until_dumped(out, world_size)


def _until_dumped(out: str, world_size: int, limit_s: float = 30.0) -> None:
    """Idle until every rank's dump is written, then leave at once (a hung collective never returns)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if all(os.path.exists(os.path.join(out, dump_filename(r))) for r in range(world_size)):
            time.sleep(0.5)  # let the last writer finish its rename and log
            break
        time.sleep(0.1)
    os._exit(0)
