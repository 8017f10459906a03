"""What the running torch release offers that the recorder uses: the one place for version differences.

flightrec runs on torch 2.1 (Ascend clusters with torch_npu) through the newest release (docs/compat.md).
Features are detected, never inferred from the version string (vendor builds backport and remove
things). Each missing feature costs some detail of the dump; `not_recorded()` names those losses so
the dump can say what this torch could not record (`not_recorded` in docs/dump-format.md).
"""

from __future__ import annotations

import functools
from typing import Any

import torch


def _c10d() -> Any:
    return getattr(torch._C, "_distributed_c10d", None)


def has_builtin_recorder() -> bool:
    """PyTorch's own flight recorder readable from Python for every backend (`_dump_fr_trace_json`)."""
    return hasattr(_c10d(), "_dump_fr_trace_json")


def has_device_event() -> bool:
    """The device-generic `torch.Event` (CUDA, and Ascend through torch_npu) that device timing uses."""
    return hasattr(torch, "Event")


def has_group_desc() -> bool:
    """ProcessGroup.group_desc (`new_group(group_desc=...)`): groups carry a description."""
    pg = getattr(_c10d(), "ProcessGroup", None)
    return pg is not None and hasattr(pg, "group_desc")


def has_group_name_attribute() -> bool:
    """ProcessGroup.group_name; older releases keep names only in c10d's `_world.pg_names`."""
    pg = getattr(_c10d(), "ProcessGroup", None)
    return pg is not None and hasattr(pg, "group_name")


def gloo_tensor_collectives() -> bool:
    """gloo serves all_gather_into_tensor and reduce_scatter_tensor (torch 2.1 raises "no support for
    _allgather_base"): probed on a one-rank gloo group of its own, which touches no network and no job group."""
    try:
        import datetime

        from torch.distributed import HashStore

        pg = _c10d().ProcessGroupGloo(HashStore(), 0, 1, datetime.timedelta(seconds=10))
        pg._allgather_base(torch.zeros(1), torch.zeros(1)).wait()
        return True
    except Exception:  # noqa: BLE001 - RuntimeError("no support ..."), or no gloo at all
        return False


def join_hook_name(c10d: Any) -> str:
    """Where a process joins its default group, for the start-up hook to arm in: `_update_default_pg`
    (every release from 2.0), else `init_process_group` itself."""
    return "_update_default_pg" if callable(getattr(c10d, "_update_default_pg", None)) else "init_process_group"


def nccl_default_timeout(c10d: Any) -> Any:
    """NCCL's own default group timeout (10 min, `default_pg_nccl_timeout`, torch 2.2+), or None where
    NCCL groups take c10d's general default (30 min) as on earlier releases."""
    return getattr(c10d, "default_pg_nccl_timeout", None)


def nccl_trace_dump() -> Any:
    """PyTorch's separate NCCL recorder dump (`_dump_nccl_trace_json`), or None on builds without NCCL
    or releases without it."""
    return getattr(_c10d(), "_dump_nccl_trace_json", None)


@functools.lru_cache(maxsize=1)
def _has_accelerator() -> bool:
    try:
        return bool(torch.cuda.is_available()) or hasattr(torch, "npu")
    except Exception:  # noqa: BLE001 - a broken driver: no device timing either way
        return False


def not_recorded() -> list[dict[str, str]]:
    """What the recorder cannot record with this torch, as {"what", "why"} (the dump's `not_recorded`)."""
    losses = []
    if not has_builtin_recorder():
        losses.append({
            "what": "cpp_op_detail",
            "why": "this torch has no flight recorder readable from Python (_dump_fr_trace_json): collectives "
                   "issued from C++ (DDP's Reducer, FSDP) are recorded with op 'unknown', no shapes, and no "
                   "completion from pg_status",
        })
    if not has_device_event() and _has_accelerator():  # a CPU-only job has no device times on any torch
        losses.append({
            "what": "device_timing",
            "why": "this torch has no device-generic torch.Event: no device start/end times (t_dev_start_ns, "
                   "t_dev_end_ns) on any device",
        })
    if not has_group_desc():
        losses.append({"what": "group_desc", "why": "this torch's process groups carry no description: desc is ''"})
    return losses


def group_ranks(pg: Any) -> list[int]:
    """The global ranks of `pg`'s members. torch 2.1 records the default group's members only after
    `_update_default_pg` (where the start-up hook arms the recorder): until then they are every rank."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    try:
        return list(dist.get_process_group_ranks(pg))
    except KeyError:
        if pg is not None and pg is getattr(c10d._world, "default_pg", None):
            return list(range(pg.size()))
        raise
