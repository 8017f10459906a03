"""One-rank jobs the recorder tests run in a child interpreter of their own:
`python -m tests.recorder.one_rank_jobs JOB ARGS...` (tests/child.py).

Why a child: the start-up hook, enable/disable, fork, signals, `os.abort`, uncaught exceptions and
exit hooks act on the whole process. Each job prints what it saw as one JSON line (`emit`) and the
test asserts on that; an assert left here is a precondition, whose traceback the test shows.

Nothing but the standard library at import: several jobs check what was imported or armed before
they ran, or are armed by `FLIGHTREC=1` half-way through their own `import torch`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

from tests.child import dispatch, emit


def _one_rank() -> None:
    """Join a world of one through an in-memory store."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)


# --- start-up, enable and disable (tests/recorder/test_recorder_units.py) ---------------------------

def armed_or_off() -> None:
    """Whether the recorder is armed once torch.distributed is imported (with FLIGHTREC=1 set)."""
    import torch.distributed  # noqa: F401 - the start-up hook's moment

    import flightrec.arming as control

    emit(armed=control.current() is not None)


def startup_hook() -> None:
    """What the start-up hook has done before torch is imported, once it is, and once the process joins."""
    torch_at_start = "torch" in sys.modules
    import torch.distributed as dist

    wrapped_once_imported = hasattr(dist.all_reduce, "__flightrec_wrapped__")
    _one_rank()
    emit(torch_at_start=torch_at_start, wrapped_once_imported=wrapped_once_imported,
         wrapped_once_joined=hasattr(dist.all_reduce, "__flightrec_wrapped__"))


def counter_step_change(out: str) -> None:
    """A backend counter that starts moving by 2 per all_reduce after 2 * RECHECK_EVERY calls: the
    ops and counter steps of the last RECHECK_EVERY entries, and whether the C path was in use."""
    import torch
    import torch.distributed as dist

    import flightrec
    from flightrec.arming import current
    from flightrec.record.recorder import RECHECK_EVERY

    flightrec.enable(dir=out)
    _one_rank()
    recorder = current().recorder
    group = recorder.groups.get(dist.group.WORLD)
    real = group.pg._get_sequence_number_for_group
    doubled_from: list[int] = []

    def counter() -> int:
        n = real()
        return n if not doubled_from else doubled_from[0] + 2 * (n - doubled_from[0])

    group.read_seq = counter
    t = torch.ones(2)
    for _ in range(2 * RECHECK_EVERY):
        dist.all_reduce(t)
    doubled_from.append(real())
    for _ in range(3 * RECHECK_EVERY):
        dist.all_reduce(t)
    tail = recorder.ring.snapshot()[-RECHECK_EVERY:]
    emit(c_path=hasattr(dist.all_reduce, "enabled"), ops=sorted({e.op for e in tail}),
         steps=sorted({b.pg_seq - a.pg_seq for a, b in zip(tail, tail[1:], strict=False)}))


def disable_restores() -> None:
    """enable() then disable(): what differs from before enable() (functions, Work.wait, SIGTERM
    handler, wakeup fd, watchdog thread)."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    names = [n for n in dir(c10d) if callable(getattr(c10d, n))]

    def functions() -> dict[str, Any]:
        return {f"{m.__name__}.{n}": getattr(m, n) for m in (dist, c10d) for n in names if hasattr(m, n)}

    before = functions()
    handler = signal.getsignal(signal.SIGTERM)
    signal.set_wakeup_fd(-1)  # none before enable()
    work_wait = c10d.Work.wait
    import flightrec

    enabled = flightrec.enable(dir="/tmp/unused")
    wrapped = dist.all_reduce is not before["torch.distributed.all_reduce"]
    handler_replaced = signal.getsignal(signal.SIGTERM) is not handler
    flightrec.disable()
    after = functions()
    emit(enabled=bool(enabled), wrapped=wrapped, handler_replaced=handler_replaced,
         changed=[k for k in before if before[k] is not after[k]], work_wait_restored=c10d.Work.wait is work_wait,
         handler_restored=signal.getsignal(signal.SIGTERM) is handler, wakeup_fd=signal.set_wakeup_fd(-1),
         watchdogs=[t.name for t in threading.enumerate() if t.name == "flightrec-watchdog"])


def forked_child(out: str) -> None:
    """fork() after an op: what the child sees of the recorder, and what the parent records after."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="0")
    import torch
    import torch.distributed as dist

    import flightrec
    import flightrec.arming as control

    flightrec.enable(dir=out)
    _one_rank()
    dist.all_reduce(torch.ones(2))
    armed = control.current()
    before = armed.recorder.ring.recorded
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        threads = [t.name for t in threading.enumerate()]
        seen = {"disarmed": control.current() is None, "recorder_off": not armed.recorder.active,
                "no_watchdog": "flightrec-watchdog" not in threads,
                "exception_hook_off": not armed.exceptions.active}  # a worker's crash must not dump as the rank
        os.write(w, json.dumps(seen).encode())
        os._exit(0)
    os.waitpid(pid, 0)
    child = json.loads(os.read(r, 4096))
    dist.all_reduce(torch.ones(2))
    emit(child=child, recorded=armed.recorder.ring.recorded - before, active=armed.recorder.active)


def sigterm_chains(out: str) -> None:
    """A user's SIGTERM handler installed before enable(): SIGTERM reaches it, and a dump is written."""
    hits: list[int] = []
    signal.signal(signal.SIGTERM, lambda s, f: hits.append(s))
    import flightrec

    flightrec.enable(dir=out)
    _one_rank()
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.5)
    emit(hits=hits, sigterm=int(signal.SIGTERM), dumped=os.path.exists(os.path.join(out, "rank-00000.json.gz")))


def default_group_described(port: str) -> None:
    """The default group as `describe_group` sees it inside `_update_default_pg`, where the hook arms."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    from flightrec.record.groups import describe_group

    seen = []
    original = c10d._update_default_pg

    def hook(pg: Any) -> None:
        original(pg)
        if pg is not None:
            seen.append(describe_group(pg).table_row())

    c10d._update_default_pg = hook
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    emit(described=seen)
    dist.destroy_process_group()


# --- when dumps happen (tests/recorder/test_dumps.py) ----------------------------------------------

def sigterm_torchrun_workers(out: str, train: str) -> None:
    """A two-rank compute hang under torchrun (FLIGHTREC=1, no timeout): SIGTERM each worker as
    torchrun does when one fails, wait until they are gone, stop torchrun; how many workers there were."""
    from fixtures.launch import descendants, free_port, kill_tree

    env = dict(os.environ, FLIGHTREC="1", FLIGHTREC_DIR=out, FLIGHTREC_TIMEOUT="300")
    p = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                          "--master_addr", "127.0.0.1", "--master_port", str(free_port()), train,
                          "--fault", "compute_hang", "--fault-rank", "0", "--fault-step", "1"],
                         env=env, start_new_session=True)
    time.sleep(8)
    workers = [pid for pid in descendants(p.pid) if b"train.py" in _cmdline(pid)]
    workers = [w for w in workers if not any(w in descendants(o) for o in workers)]
    for w in workers:
        os.kill(w, signal.SIGTERM)
    for w in workers:
        for _ in range(100):
            try:
                os.kill(w, 0)
                with open(f"/proc/{w}/stat") as handle:
                    if handle.read().split()[2] == "Z":
                        break
            except ProcessLookupError:
                break
            time.sleep(0.1)
    kill_tree(p.pid)
    emit(workers=len(workers))


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read()
    except OSError:
        return b""


def idle_armed(out: str) -> None:
    """Armed, never joined a group, asleep: the test's SIGTERM must end it as by default."""
    import flightrec

    flightrec.enable(dir=out)
    print("ready", flush=True)
    time.sleep(60)


def sigterm_inside_dump(out: str) -> None:
    """SIGTERM to ourselves while our own dump is written and synced, not yet renamed."""
    import torch
    import torch.distributed as dist

    import flightrec

    flightrec.enable(dir=out)
    _one_rank()
    dist.all_reduce(torch.ones(2))
    fired: list[str] = []
    rename = os.replace

    def term_during_write(src: Any, dst: Any) -> None:  # the dump is written and synced, not yet renamed
        if not fired and str(src).endswith(".tmp"):
            fired.append(str(src))
            os.kill(os.getpid(), signal.SIGTERM)  # handled by Python before the next bytecode, inside write_dump
        rename(src, dst)

    os.replace = term_during_write
    flightrec.dump("first")
    print("survived the signal", flush=True)


def abort_after_op(out: str) -> None:
    """One op, then os.abort()."""
    import torch
    import torch.distributed as dist

    import flightrec

    flightrec.enable(dir=out)
    _one_rank()
    dist.all_reduce(torch.ones(2))
    os.abort()


# --- after a hang dump (tests/recorder/test_on_hang.py) --------------------------------------------

def final_hang_dump(out: str) -> None:
    """on_hang=abort: a dump, a hang declared, a dump after it (refused), then the grace period ends.
    Prints exactly what the test compares, the last line unflushed (the abort must flush it)."""
    import flightrec
    from flightrec import arming

    assert flightrec.enable(dir=out, on_hang="abort", abort_grace_s=60), "enable() refused"
    _one_rank()
    first = flightrec.dump("before")
    hang = arming.current().watchdog.hang
    hang.hung("all_reduce group=0 seq=7 incomplete after 9.0s", written=True)
    print(first is not None, flightrec.dump("after") is None, flush=True)  # the hang dump is final
    print("still buffered", end="")  # flushed before the exit
    hang.abort_at = time.monotonic()  # the grace period is over: the watchdog ends the process
    time.sleep(30)
    print("not reached", flush=True)


# --- how a rank ends, armed by FLIGHTREC=1 (tests/recorder/test_endings.py) --------------------------

def three_ops() -> None:
    """Join, three all_reduces, leave by the end of the script."""
    import torch
    import torch.distributed as dist

    _one_rank()
    for _ in range(3):
        dist.all_reduce(torch.ones(2))


def main_thread_error() -> None:
    """Three ops, then an uncaught error in the main thread."""
    three_ops()

    def load_batch() -> None:
        raise ValueError("bad sample 17")

    load_batch()


def other_thread_error() -> None:
    """Three ops, then an uncaught error in a thread named `prefetcher`; the main thread ends cleanly."""
    three_ops()

    def prefetch() -> None:
        raise KeyError("shard-9")

    t = threading.Thread(target=prefetch, name="prefetcher")
    t.start()
    t.join()


def other_thread_error_then_sigterm() -> None:
    """The thread's error, then SIGTERM as the launcher sends when a worker failed."""
    other_thread_error()
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(30)


def ddp_steps(steps: str, then_all_reduce: str = "0") -> None:
    """DDP training steps (the Reducer's all-reduces are issued from C++), optionally one Python
    all_reduce after them, then leave the group."""
    import torch
    import torch.distributed as dist

    _one_rank()
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 2))
    for _ in range(int(steps)):
        model(torch.randn(4, 8)).sum().backward()
    if then_all_reduce == "1":
        dist.all_reduce(torch.ones(3))
    dist.destroy_process_group()


# --- the torch reader (tests/recorder/test_torchpeek.py) -------------------------------------------

def dump_one_op() -> None:
    """Armed by FLIGHTREC=1 during `import torch`: one op, then a dump; where it was written."""
    import torch
    import torch.distributed as dist

    import flightrec

    _one_rank()
    dist.all_reduce(torch.ones(2))
    emit(path=flightrec.dump(reason="check"))


JOBS = {f.__name__: f for f in (
    armed_or_off, startup_hook, counter_step_change, disable_restores, forked_child, sigterm_chains,
    default_group_described, sigterm_torchrun_workers, idle_armed, sigterm_inside_dump, abort_after_op,
    final_hang_dump, three_ops, main_thread_error, other_thread_error, other_thread_error_then_sigterm, ddp_steps,
    dump_one_op)}

if __name__ == "__main__":
    dispatch(JOBS)
