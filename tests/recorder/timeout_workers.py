"""Rank functions for tests/recorder/test_group_timeouts.py (module level so spawn can import them).

There is no NCCL on the test machines: where a test needs a group whose backend ends its ops at the
group's timeout, `simulate_nccl` tells the rule (group_timeouts.ENDS_OPS_AT_TIMEOUT) to treat gloo so,
inside the ranks; the groups, their timeouts and the watchdog are all real.
"""

from __future__ import annotations

import datetime
import gzip
import json
import os
import time

import torch
import torch.distributed as dist

import flightrec
from flightrec.arming import current
from flightrec.record import group_timeouts
from tests.helpers import init_rank


def simulate_nccl() -> None:
    """gloo's groups now count as ending their ops at their timeout, as NCCL's do (no variable turns it off)."""
    group_timeouts.ENDS_OPS_AT_TIMEOUT["gloo"] = ((), ())


def _init(rank: int, world_size: int, port: int, timeout_s: float | None = None) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), OMP_NUM_THREADS="1")
    if timeout_s is None:
        init_rank(rank, world_size, port)
    else:
        dist.init_process_group("gloo", rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=timeout_s))


def _name(pg: object) -> str:
    """The name the recorder keys the group by (torch 2.1's groups carry none: c10d's `pg_names`)."""
    try:
        return str(pg.group_name)  # type: ignore[attr-defined]
    except (AttributeError, RuntimeError):
        return str(dist.distributed_c10d._world.pg_names[pg])


def _limits_settled(bound_s: float = 10.0) -> None:
    """Wait until the watchdog derived its limits from every group registered so far."""
    armed = current()
    assert armed is not None
    deadline = time.monotonic() + bound_s
    while armed.watchdog._limits_gen != armed.recorder.groups.timeouts_gen:
        assert time.monotonic() < deadline, "the watchdog never derived its limits"
        time.sleep(0.05)


def _state(names: dict[str, str]) -> dict[str, object]:
    armed = current()
    assert armed is not None
    registry, limits = armed.recorder.groups, armed.watchdog.limits
    return {
        "names": names,
        "timeouts": {label: registry.timeout_of(name) for label, name in names.items()},
        "limits": {label: limits.seconds(name) for label, name in names.items()},
        "notes": {label: limits.note(name) for label, name in names.items()},
        "settings": armed.settings.as_dict(),
    }


def _write(out: str, rank: int, result: dict[str, object]) -> None:
    with open(os.path.join(out, f"result-{rank}.json"), "w") as handle:
        json.dump(result, handle)


def gloo_groups(rank: int, world_size: int, port: int, out: str) -> None:
    """Real gloo groups with explicit and default timeouts; FLIGHTREC_TIMEOUT unset."""
    os.environ.pop("FLIGHTREC_TIMEOUT", None)
    assert flightrec.enable(dir=out)
    _init(rank, world_size, port, timeout_s=40)
    short = dist.new_group([0, 1], timeout=datetime.timedelta(seconds=7))
    plain = dist.new_group([0, 1])
    names = {"world": _name(dist.group.WORLD), "short": _name(short), "plain": _name(plain)}
    _limits_settled()
    result = _state(names)
    setter = getattr(dist.distributed_c10d, "_set_pg_timeout", None)  # torch 2.2+
    if setter is not None:
        setter(datetime.timedelta(seconds=11), short)
        current().recorder.groups.refresh_timeouts()  # the watchdog does this every few seconds
        _limits_settled()
        result["after_set"] = _state(names)["timeouts"]
    dist.all_reduce(torch.ones(1), group=short)
    flightrec.dump()
    _write(out, rank, result)
    dist.barrier()
    dist.destroy_process_group()


def derived_limit(rank: int, world_size: int, port: int, out: str) -> None:
    """A (simulated) NCCL group of 8 s: rank 1 joins its all_reduce after 6 s, before the group's
    timeout but after flightrec's derived limit of 4 s."""
    os.environ.pop("FLIGHTREC_TIMEOUT", None)
    os.environ["TORCH_NCCL_DUMP_ON_TIMEOUT"] = "1"
    os.environ["TORCH_FR_DUMP_TEMP_FILE"] = os.path.join(out, "torch_trace_rank_")
    simulate_nccl()
    assert flightrec.enable(dir=out)
    _init(rank, world_size, port)
    group = dist.new_group([0, 1], timeout=datetime.timedelta(seconds=8))
    names = {"world": _name(dist.group.WORLD), "group": _name(group)}
    _limits_settled()
    result = _state(names)
    dist.barrier()
    start = time.monotonic()
    if rank == 1:  # keep both hang dumps before joining: the recovery replaces them (reason `recovered`, then `exit`)
        _keep_dump(out, 0, "timeout", start + 6.5)
        _keep_dump(out, 1, "peer_request", start + 6.5)
        time.sleep(max(0.0, start + 6.0 - time.monotonic()))
    result["t_call_ns"] = time.time_ns()
    dist.all_reduce(torch.ones(3), group=group)
    result["t_return_ns"] = time.time_ns()
    _write(out, rank, result)
    dist.barrier()
    dist.destroy_process_group()


def _keep_dump(out: str, rank: int, reason: str, until: float) -> None:
    """Copy rank `rank`'s dump to hang-rank-NNNNN.json.gz once it reads `reason` (dumps are renamed into
    place whole), or give up at monotonic time `until`."""
    path = os.path.join(out, f"rank-{rank:05d}.json.gz")
    while time.monotonic() < until:
        try:
            with open(path, "rb") as handle:
                data = handle.read()
            if json.loads(gzip.decompress(data))["reason"] == reason:
                with open(os.path.join(out, f"hang-rank-{rank:05d}.json.gz"), "wb") as handle:
                    handle.write(data)
                return
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.05)


def explicit_setting(rank: int, world_size: int, port: int, out: str, simulated: bool) -> None:
    """FLIGHTREC_TIMEOUT=10 with groups of 6 s and 8 s (created together), then one of 9 s."""
    os.environ["FLIGHTREC_TIMEOUT"] = "10"
    if simulated:
        simulate_nccl()
    assert flightrec.enable(dir=out)
    _init(rank, world_size, port)
    six = dist.new_group([0, 1], timeout=datetime.timedelta(seconds=6))
    eight = dist.new_group([0, 1], timeout=datetime.timedelta(seconds=8))
    _limits_settled()
    nine = dist.new_group([0, 1], timeout=datetime.timedelta(seconds=9))
    _limits_settled()
    time.sleep(0.6)  # a tick after the last derivation: any further warning would be out by now
    names = {"six": _name(six), "eight": _name(eight), "nine": _name(nine)}
    _write(out, rank, _state(names))
    dist.barrier()
    dist.destroy_process_group()
