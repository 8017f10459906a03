"""One-rank jobs the reliability tests run in a child interpreter of their own:
`python -m tests.reliability.one_rank_jobs JOB ARGS...` (tests/child.py).

Why a child: fork, spawn, signals, SIGKILL mid-write, a full disk and interpreter exit act on the
whole process. Each job prints what it saw as one JSON line (`emit`) and the test asserts on that;
an assert left here is a precondition, whose traceback the test shows with the exit code.

Nothing but the standard library at import: a job imports torch and flightrec itself, in the order
the test is about (spawned DataLoader workers import this module again, as `__mp_main__`).
"""

from __future__ import annotations

import gzip
import json
import os
import signal
import threading
import time
from typing import Any

from tests.child import dispatch, emit


def _one_rank() -> None:
    """Join a world of one through an in-memory store."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)


def dataloader_workers() -> None:
    """Armed from the environment: a few ops, a dump, then DataLoader epochs with fork and spawn
    workers that report what the recorder does inside them (tests.reliability.workers.WhoAmI)."""
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader

    import flightrec
    from tests.reliability.workers import WhoAmI

    _one_rank()
    for _ in range(3):
        dist.all_reduce(torch.ones(2))
    before = flightrec.dump("before-loading")
    rows = []
    for method in ("fork", "spawn"):
        for batch in DataLoader(WhoAmI(), batch_size=1, num_workers=2, multiprocessing_context=method):
            rows.append([method, *batch[0].tolist()])
    dist.all_reduce(torch.ones(2))
    emit(dumped_before=before is not None, rows=rows, pid=os.getpid())


def destroy_and_exit(out: str) -> None:
    """25 init/destroy cycles of the default group and a subgroup, an op in flight as they go, under a
    watchdog ticking every millisecond; then exit with it running."""
    import torch
    import torch.distributed as dist

    import flightrec
    from flightrec import arming

    enabled = flightrec.enable(dir=out, timeout_s=0.05, poll_s=0.001, dump_on_exit=True)
    for _ in range(25):
        _one_rank()
        sub = dist.new_group([0])
        for _ in range(20):
            dist.all_reduce(torch.ones(2))
            dist.all_reduce(torch.ones(2), group=sub)
        work = dist.all_reduce(torch.ones(2), async_op=True)  # in flight while the groups go
        dist.destroy_process_group(sub)
        dist.destroy_process_group()
        work.wait()
    armed = arming.current()
    emit(enabled=bool(enabled), watchdog_alive=armed.watchdog._thread.is_alive(),
         known=len(armed.recorder.groups.known()), retired=len(armed.recorder.groups.retired))


def soak(out: str, ops: str, ring: str) -> None:
    """`ops` collectives of four kinds with a ring of `ring` entries; RSS sampled every 10,000 ops,
    and what the recorder holds at the end."""
    import torch
    import torch.distributed as dist

    import flightrec
    from flightrec import arming, log

    n_ops = int(ops)
    enabled = flightrec.enable(dir=out, buffer=int(ring), timeout_s=2.0)
    _one_rank()
    page = os.sysconf("SC_PAGE_SIZE")

    def rss() -> int:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * page

    x, gathered = torch.ones(4), torch.zeros(4)
    samples = []
    began = time.monotonic()
    for i in range(n_ops):
        if i % 10 == 9:
            dist.all_reduce(x, async_op=True).wait()
        elif i % 50 == 7:
            dist.broadcast(x, src=0)
        elif i % 100 == 3:
            dist.all_gather_into_tensor(gathered, x)
        else:
            dist.all_reduce(x)
        if i % 10_000 == 9_999:
            samples.append((i + 1, rss()))
    seconds = time.monotonic() - began
    rec = arming.current().recorder
    names = sorted(os.listdir(out)) if os.path.isdir(out) else []
    emit(enabled=bool(enabled), samples=samples, seconds=seconds, recorded=rec.ring.recorded, pending=len(rec.pending),
         in_flight=len(rec.in_flight()), polled=len(rec.polled), by_work=len(rec.by_work), cpp_open=len(rec.cpp_open),
         errors=list(log.errors), slot=0 if rec.async_slot is None or rec.async_slot.entry is None else 1,
         dumps=[n for n in names if not n.endswith(".stacks.txt")],
         gil_stacks_fired=[n for n in names if n.endswith(".stacks.txt") and "Timeout (" in _text(out, n)])


def _text(folder: str, name: str) -> str:
    with open(os.path.join(folder, name), encoding="utf-8", errors="replace") as handle:
        return handle.read()


def killed_mid_write(out: str, marker: str) -> None:
    """A first dump, then a second one that stalls between its synced temporary file and the rename
    (the temporary's name written to `marker`), where the test SIGKILLs the process."""
    import torch
    import torch.distributed as dist

    import flightrec

    flightrec.enable(dir=out, timeout_s=60)
    _one_rank()
    for _ in range(3):
        dist.all_reduce(torch.ones(2))
    assert flightrec.dump("first"), "the first dump, which the kill must leave intact, was not written"
    for _ in range(4):
        dist.all_reduce(torch.ones(2))
    rename = os.replace

    def stall_before_rename(src: Any, dst: Any) -> None:  # the window between the synced file and its rename
        if str(src).endswith(".tmp"):
            with open(marker, "w") as handle:
                handle.write(str(src))
            time.sleep(60)
        rename(src, dst)

    os.replace = stall_before_rename
    flightrec.dump("second")


def dump_once(out: str) -> None:
    """A rank's next process: arm, join, dump once (and so clear what a killed writer left)."""
    import flightrec

    flightrec.enable(dir=out)
    _one_rank()
    emit(dumped=flightrec.dump("third") is not None)


def dumping_in_a_loop(out: str) -> None:
    """20,000 entries with stacks (~1 MB dumps), then dump in a loop until killed."""
    import torch
    import torch.distributed as dist

    import flightrec

    flightrec.enable(dir=out, buffer=20000, stacks=True)
    _one_rank()
    for _ in range(20000):
        dist.all_reduce(torch.ones(2))
    print("ready", flush=True)
    while True:
        flightrec.dump("loop")


def no_space(folder: str, filler: str) -> None:
    """Three dumps onto a full disk, then one after `filler` is deleted; the dumps' results."""
    import torch
    import torch.distributed as dist

    import flightrec

    enabled = flightrec.enable(dir=folder, timeout_s=60)
    _one_rank()
    results = []
    for attempt in range(3):
        for _ in range(5):
            dist.all_reduce(torch.ones(2))
        results.append(flightrec.dump(f"full-{attempt}"))
    os.unlink(filler)  # space freed
    dist.all_reduce(torch.ones(2))
    results.append(flightrec.dump("freed"))
    emit(enabled=bool(enabled), results=results)


def _armed_state() -> dict[str, bool]:
    import flightrec.arming as control

    return {"armed": control.current() is not None,
            "watchdog": any(t.name == "flightrec-watchdog" for t in threading.enumerate()),
            "default_sigterm": signal.getsignal(signal.SIGTERM) is signal.SIG_DFL}


def armed_once_joined() -> None:
    """With FLIGHTREC=1: what runs of ours after `import torch.distributed`, and after joining a group."""
    import torch.distributed as dist

    imported = _armed_state()
    _one_rank()
    emit(imported=imported, joined=_armed_state(), initialized=dist.is_initialized())


def chained_sigterm(out: str) -> None:
    """A SIGTERM handler installed after ours, then SIGTERM to ourselves: who got it, and the dump's reason."""
    import flightrec

    enabled = flightrec.enable(dir=out)
    _one_rank()
    hits: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: hits.append(signum))  # installed after ours, exits not
    os.kill(os.getpid(), signal.SIGTERM)
    path = os.path.join(out, "rank-00000.json.gz")
    deadline = time.monotonic() + 20
    while not (hits and os.path.exists(path)) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(1)  # the watchdog read the signal from the wakeup pipe and dumped: it must not kill us after
    reason = None
    if os.path.exists(path):
        with gzip.open(path, "rt") as handle:
            reason = json.load(handle)["reason"]
    emit(enabled=bool(enabled), hits=hits, sigterm=int(signal.SIGTERM), reason=reason)


JOBS = {f.__name__: f for f in (dataloader_workers, destroy_and_exit, soak, killed_mid_write, dump_once,
                                 dumping_in_a_loop, no_space, armed_once_joined, chained_sigterm)}

if __name__ == "__main__":
    dispatch(JOBS)
