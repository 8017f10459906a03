"""Rank functions for the recorder tests (module level so spawn can import them)."""

from __future__ import annotations

import os
import time
import warnings

import torch
import torch.distributed as dist

import flightrec
from flightrec.record import torch_compat
from tests.helpers import init_rank


def every_api(rank: int, world_size: int, port: int, out: str) -> None:
    """Call every recorded API once, in the same order on every rank, then dump."""
    assert flightrec.enable(dir=out, timeout_s=60)
    init_rank(rank, world_size, port)
    ws = world_size
    t = torch.full((4,), float(rank))
    dist.all_reduce(t)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, async_op=True).wait()
    dist.all_gather([torch.zeros(4) for _ in range(ws)], t)
    tensor_ops = torch_compat.gloo_tensor_collectives()  # torch 2.1's gloo has neither of the tensor forms
    if tensor_ops:
        dist.all_gather_into_tensor(torch.zeros(4 * ws), t)
    dist.all_gather_object([None] * ws, {"rank": rank})
    dist.reduce(t, dst=1)
    if tensor_ops:
        dist.reduce_scatter_tensor(torch.zeros(2), torch.ones(2 * ws))
    dist.broadcast(t, src=2)
    dist.broadcast_object_list([rank, "x"], src=0)
    dist.scatter(torch.zeros(3), [torch.ones(3)] * ws if rank == 0 else None, src=0)
    dist.gather(torch.ones(5), [torch.zeros(5) for _ in range(ws)] if rank == 1 else None, dst=1)
    dist.all_to_all_single(torch.zeros(ws * 2), torch.ones(ws * 2))
    dist.barrier()
    dist.monitored_barrier(timeout=None)
    with warnings.catch_warnings():  # deprecated APIs, still served
        warnings.simplefilter("ignore")
        dist.all_reduce_coalesced([torch.ones(2), torch.ones(3)])
        dist.all_gather_coalesced([[torch.zeros(2), torch.zeros(3)] for _ in range(ws)], [torch.ones(2), torch.ones(3)])
    # p2p ring: send to the right, receive from the left
    right, left = (rank + 1) % ws, (rank - 1) % ws
    if rank % 2 == 0:
        dist.send(torch.ones(6), right)
        dist.recv(torch.zeros(6), left)
    else:
        dist.recv(torch.zeros(6), left)
        dist.send(torch.ones(6), right)
    send = dist.isend(torch.ones(7), right)
    recv = dist.irecv(torch.zeros(7), left)
    send.wait()
    recv.wait()
    reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.ones(8), right),
                                   dist.P2POp(dist.irecv, torch.zeros(8), left)])
    for req in reqs:
        req.wait()
    with dist._coalescing_manager(async_ops=True) as cm:
        dist.all_reduce(torch.ones(9))
        dist.all_reduce(torch.ones(9))
    cm.wait()
    # keyword arguments (the C hot path reads them by name)
    dist.all_reduce(tensor=t, op=dist.ReduceOp.MIN)
    dist.broadcast(tensor=t, src=1, group=None, async_op=True).wait()
    sub = dist.new_group([0, 2])
    if rank in (0, 2):
        dist.all_reduce(torch.ones(10), group=sub)
        dist.all_reduce(torch.ones(10), group=sub)
    flightrec.dump("coverage")
    from flightrec import arming

    readers = {type(group.read_seq).__name__ for group in arming._state.recorder.groups.by_pg.values() if group}
    with open(os.path.join(out, f"wrapper-{rank}.txt"), "w") as handle:  # which hot path recorded
        handle.write(f"{type(dist.all_reduce).__name__} {'+'.join(sorted(readers))}")
    dist.destroy_process_group()


def ring_wrap(rank: int, world_size: int, port: int, out: str, buffer: int, ops: int) -> None:
    assert flightrec.enable(dir=out, buffer=buffer, timeout_s=60)
    init_rank(rank, world_size, port)
    t = torch.ones(2)
    for _ in range(ops):
        dist.all_reduce(t)
    flightrec.dump("wrap")
    dist.destroy_process_group()


def failing_op(rank: int, world_size: int, port: int, out: str, waited: bool = False) -> None:
    """Rank 1 dies before the second all_reduce; rank 0's all_reduce (or, `waited`, its Work's wait) then fails."""
    assert flightrec.enable(dir=out, timeout_s=60)
    init_rank(rank, world_size, port)
    t = torch.ones(4)
    dist.all_reduce(t)
    if rank == 1:
        os._exit(0)
    try:
        if waited:
            dist.all_reduce(t, async_op=True).wait()
        else:
            dist.all_reduce(t)
    except Exception:  # noqa: BLE001 - expected: the peer is gone
        os._exit(3)
    os._exit(4)


def exit_dump(rank: int, world_size: int, port: int, out: str) -> None:
    os.environ["FLIGHTREC_DUMP_ON_EXIT"] = "1"
    assert flightrec.enable(dir=out, timeout_s=60)
    init_rank(rank, world_size, port)
    for _ in range(3):
        dist.all_reduce(torch.ones(3))
    dist.destroy_process_group()


def blocked_forever(rank: int, world_size: int, port: int, out: str) -> None:
    """Rank 0 sleeps; the others block in all_reduce. Long timeout: only a manual trigger dumps."""
    assert flightrec.enable(dir=out, timeout_s=600)
    init_rank(rank, world_size, port)
    dist.all_reduce(torch.ones(2))
    with open(os.path.join(out, f".ready-{rank}"), "w") as handle:
        handle.write(str(os.getpid()))
    if rank == 0:
        time.sleep(120)
    dist.all_reduce(torch.ones(2))


def ddp_training(rank: int, world_size: int, port: int, out: str) -> None:
    assert flightrec.enable(dir=out, timeout_s=60)
    init_rank(rank, world_size, port)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
    # PyTorch's recorder learns of the last all-reduce's completion from gloo's thread: wait for it
    from flightrec.record import torch_recorder

    pg = dist.group.WORLD
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        done = torch_recorder.completed_seqs(torch_recorder.read(include_entries=False))
        if done and max(done.values()) >= pg._get_sequence_number_for_group():
            break
        time.sleep(0.1)
    flightrec.dump("ddp")
    dist.destroy_process_group()


def unwritable(rank: int, world_size: int, port: int, out: str, result: str) -> None:
    assert flightrec.enable(dir=out, timeout_s=0.3)
    init_rank(rank, world_size, port)
    if rank == 1:
        time.sleep(1.5)  # the others time out and try (and fail) to dump
    for _ in range(5):
        dist.all_reduce(torch.ones(2))
    path = flightrec.dump("explicit")
    with open(f"{result}.{rank}", "w") as handle:
        handle.write(repr(path))
    dist.destroy_process_group()


def with_stacks(rank: int, world_size: int, port: int, out: str) -> None:
    os.environ["FLIGHTREC_STACKS"] = "1"
    assert flightrec.enable(dir=out, timeout_s=60)
    init_rank(rank, world_size, port)
    _nested_call()
    flightrec.dump("stacks")
    dist.destroy_process_group()


def _nested_call() -> None:
    dist.all_reduce(torch.ones(2))


def exit_while_store_call_in_flight(rank: int, world_size: int, port: int, out: str) -> None:
    """Rank 0 (the store host) leaves; rank 1 exits while its watchdog is reconnecting to that store.

    A daemon thread that comes back from a C++ call while the interpreter finalises dies through
    std::terminate (Python ends it with pthread_exit), so our exit hook must outwait that call.
    Exit code 5: the watchdog thread outlived the exit hook.
    """
    from flightrec import arming

    os.environ["FLIGHTREC_DUMP_ON_EXIT"] = "1"
    assert flightrec.enable(dir=out, timeout_s=60)
    init_rank(rank, world_size, port)
    dist.all_reduce(torch.ones(3))
    dist.barrier()
    if rank == 0:
        os._exit(0)
    time.sleep(0.5)  # rank 0 and its store are gone
    watchdog = arming.current().watchdog
    watchdog.store._store = None
    watchdog.store._next_connect = 0.0
    watchdog._next_store_poll = 0.0
    watchdog.wake()
    time.sleep(0.3)  # the watchdog is now inside TCPStore() retrying the dead port
    task = f"/proc/self/task/{watchdog._thread.native_id}"  # the OS's view: is the thread still there?
    assert os.path.exists(task)
    arming._at_exit()
    gone_by = time.monotonic() + 0.5  # a joined thread's task lingers a moment
    while os.path.exists(task) and time.monotonic() < gone_by:
        time.sleep(0.01)
    os._exit(5 if os.path.exists(task) else 0)


def predicted_counter_steps(rank: int, world_size: int, port: int, out: str) -> None:
    """Python all_reduces long enough for the recorder to predict the backend counter, with
    collectives issued straight on the ProcessGroup (as C++ code does) in between."""
    from flightrec.arming import current
    from flightrec.record.recorder import TRUST_AFTER

    assert flightrec.enable(dir=out, timeout_s=60)
    init_rank(rank, world_size, port)
    world = dist.group.WORLD
    t = torch.ones(4)
    for i in range(60):
        dist.all_reduce(t)
        if i in (20, 21, 45):
            world.allreduce([t]).wait()  # not through torch.distributed: invisible to the wrappers
        if i % 10 == 9:
            peer = 1 - rank
            if rank == 0:
                dist.send(t, peer)
            else:
                dist.recv(t, peer)
    state = current().recorder.groups.get(world)
    assert state is not None and state.steps["all_reduce"][1] >= TRUST_AFTER, state.steps
    flightrec.dump("predicted")
    dist.destroy_process_group()


def seq_readers(rank: int, world_size: int, port: int, out: str) -> None:
    """The built torch reader's counter against pybind's, after collectives, p2p ops and on a subgroup;
    and the same error where a backend keeps no counter."""
    import json

    from flightrec.record import cpp_reader

    init_rank(rank, world_size, port)
    sub = dist.new_group([0, 1])
    world = dist.group.WORLD
    readers = {"world": (cpp_reader.seq_reader(world), world), "sub": (cpp_reader.seq_reader(sub), sub)}
    pairs = []

    def compare() -> None:
        pairs.append({name: [reader(), pg._get_sequence_number_for_group()] for name, (reader, pg) in readers.items()})

    compare()
    t = torch.ones(4)
    dist.all_reduce(t)
    compare()
    if rank == 0:
        dist.send(t, 1)
    else:
        dist.recv(t, 0)
    dist.all_reduce(t, group=sub, async_op=True).wait()
    dist.barrier()
    compare()
    from torch.testing._internal.distributed import fake_pg  # registers the "fake" backend

    assert fake_pg.FakeStore is not None

    fake = dist.new_group([0, 1], backend="fake")  # a backend that keeps no counter
    errors = {}
    for name, read in (("reader", cpp_reader.seq_reader(fake)), ("pybind", fake._get_sequence_number_for_group)):
        try:
            errors[name] = repr(read())
        except Exception as exc:  # noqa: BLE001
            errors[name] = type(exc).__name__
    with open(os.path.join(out, f"seq-{rank}.json"), "w") as handle:
        json.dump({"pairs": pairs, "types": [type(r).__name__ for r, _ in readers.values()], "errors": errors}, handle)
    dist.destroy_process_group()


def unwaited_async(rank: int, world_size: int, port: int, out: str) -> None:
    """An async op nobody waits on: the watchdog's poll must complete it and drop its Work."""
    import json

    from flightrec import arming

    assert flightrec.enable(dir=out, timeout_s=60)
    init_rank(rank, world_size, port)
    rec = arming._state.recorder
    work = dist.all_reduce(torch.ones(4), async_op=True)
    entry = next(e for e in rec.ring.snapshot() if e.api == "all_reduce")
    deadline = time.monotonic() + 20
    while entry.state != "completed" and time.monotonic() < deadline:
        time.sleep(0.05)
    result = {"state": entry.state, "work_done": work.is_completed(), "by_work": len(rec.by_work),
              "pending": len(rec.pending), "wrapper": type(dist.all_reduce).__name__,
              "slot_empty": rec.async_slot is None or rec.async_slot.entry is None}
    with open(os.path.join(out, f"unwaited-{rank}.json"), "w") as handle:
        json.dump(result, handle)
    dist.barrier()
    dist.destroy_process_group()


def ops_in_flight(rank: int, world_size: int, port: int, out: str) -> None:
    """What the watchdog sees as in flight while rank 0 waits for a late rank 1: a blocking op
    (the C hot path files it in no table: its thread's in_leaf holds it), then an async one."""
    import json
    import threading

    from flightrec import arming

    assert flightrec.enable(dir=out, timeout_s=60)
    init_rank(rank, world_size, port)
    rec = arming._state.recorder
    dist.barrier()
    seen: dict[str, object] = {}
    if rank == 0:
        def look() -> None:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                found = rec.in_flight()
                if found:
                    seen["blocking"] = [(e.api, e.state, e.seq) for e in found]
                    seen["blocking_in_pending"] = len(rec.pending)
                    return
                time.sleep(0.01)

        watcher = threading.Thread(target=look)
        watcher.start()
        dist.all_reduce(torch.ones(3))
        watcher.join()
    else:
        time.sleep(1.0)
        dist.all_reduce(torch.ones(3))
    if rank == 1:
        time.sleep(1.5)
    work = dist.all_reduce(torch.ones(3), async_op=True)
    if rank == 0:
        seen["async"] = [(e.api, e.state, e.seq) for e in rec.in_flight()]

        def look_while_waiting() -> None:  # the C hot path takes the op out of by_work while it waits
            time.sleep(0.3)
            seen["waiting"] = [(e.api, e.state, e.seq) for e in rec.in_flight()]

        watcher = threading.Thread(target=look_while_waiting)
        watcher.start()
        work.wait()
        watcher.join()
    else:
        work.wait()
    seen["after"] = [(e.api, e.state) for e in rec.in_flight()]
    with open(os.path.join(out, f"in-flight-{rank}.json"), "w") as handle:
        json.dump(seen, handle)
    dist.barrier()
    dist.destroy_process_group()


def in_flight_past_the_ring(rank: int, world_size: int, port: int, out: str) -> None:
    """Rank 0 posts an irecv nobody has sent yet, then 10 collectives push it out of its 4-entry ring."""
    assert flightrec.enable(dir=out, buffer=4, timeout_s=60)
    init_rank(rank, world_size, port)
    box = torch.zeros(3)
    work = dist.irecv(box, src=1) if rank == 0 else None
    for _ in range(10):
        dist.all_reduce(torch.ones(2))
    if rank == 0:
        flightrec.dump("in-flight")
    dist.barrier()
    if rank == 1:
        dist.send(torch.ones(3), dst=0)
    else:
        work.wait()
    dist.barrier()
    dist.destroy_process_group()


# Code that says it is a library's (its frames' file names), the way an FSDP2 hook runs under torch's
# no_grad decorator: the user's code calls it, it calls torch.distributed.
_LIBRARY_CODE = """
def decorate_context(fn, *args):
    return fn(*args)

def issue_in_a_thread(fn, *args):
    import threading
    worker = threading.Thread(target=decorate_context, args=(fn, *args))
    worker.start()
    worker.join()
"""
LIBRARY_FILE = "/opt/venv/lib/python3.11/site-packages/torch/utils/_contextlib.py"
_library: dict = {}
exec(compile(_LIBRARY_CODE, LIBRARY_FILE, "exec"), _library)  # noqa: S102 - frames named as a library's


def through_a_library(rank: int, world_size: int, port: int, out: str) -> None:
    """An op issued from library code the user's code called (its site: the user's line), and one
    issued from library code alone, on a thread (its site: the first library frame)."""
    assert flightrec.enable(dir=out, timeout_s=60)
    init_rank(rank, world_size, port)
    for _ in range(3):  # again from the same place: the C path's one-entry cache must not change it
        _library["decorate_context"](dist.all_reduce, torch.ones(2))  # the user's line
    _library["issue_in_a_thread"](dist.all_reduce, torch.ones(2))
    flightrec.dump("sites")
    dist.destroy_process_group()
