"""Read PyTorch's built-in flight recorder from inside the process, safely.

It tells us what the Python API cannot see: the op names and sizes of C++-issued collectives and,
through `pg_status`, which backend sequence numbers have completed. Calling its dump functions
with the recorder disabled (`TORCH_FR_BUFFER_SIZE=0`) aborts the process, so we never do.
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch

from . import log


def enabled() -> bool:
    for name in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"):
        raw = os.environ.get(name)
        if raw is not None:
            try:
                return int(raw) > 0
            except ValueError:
                return False
    return hasattr(torch._C._distributed_c10d, "_dump_fr_trace_json")


def read(include_entries: bool) -> dict[str, Any] | None:
    """The built-in recorder's JSON dump as a dict, or None when unavailable."""
    if not enabled():
        return None
    try:
        raw = torch._C._distributed_c10d._dump_fr_trace_json(includeCollectives=include_entries)
        return json.loads(raw)
    except Exception as exc:  # noqa: BLE001
        log.warn_once("torch-fr", f"PyTorch's flight recorder could not be read: {exc!r}")
        return None


def completed_seqs(status: dict[str, Any] | None) -> dict[str, int]:
    """pg uid -> last completed backend sequence number, from `pg_status`."""
    out: dict[str, int] = {}
    for uid, fields in ((status or {}).get("pg_status") or {}).items():
        try:
            out[str(uid)] = int(fields.get("last_completed_collective", -1))
        except (TypeError, ValueError, AttributeError):
            continue
    return out


def uid_to_group_name(fr: dict[str, Any] | None) -> dict[str, str]:
    """pg uid -> group name, from entries where the recorder names both; uid == name otherwise."""
    mapping: dict[str, str] = {}
    for entry in (fr or {}).get("entries") or []:
        pg = entry.get("process_group")
        if isinstance(pg, (list, tuple)) and pg and "pg_id" in entry:
            mapping[str(entry["pg_id"])] = str(pg[0])
    return mapping


def op_name(profiling_name: str) -> str:
    """`gloo:all_reduce` / `nccl:all_reduce` / `hccl:allreduce` -> our op name."""
    name = profiling_name.split(":", 1)[-1]
    return {"allreduce": "all_reduce", "allgather": "all_gather", "_allgather_base": "all_gather_into_tensor",
            "reduce_scatter_tensor_coalesced": "reduce_scatter_tensor",
            "allgather_into_tensor_coalesced": "all_gather_into_tensor",
            "_reduce_scatter_base": "reduce_scatter_tensor"}.get(name, name)


_DTYPES = {"Float": "float32", "Double": "float64", "Half": "float16", "BFloat16": "bfloat16", "Long": "int64",
           "Int": "int32", "Short": "int16", "Char": "int8", "Byte": "uint8", "Bool": "bool",
           "ComplexFloat": "complex64", "ComplexDouble": "complex128"}


def tensor_meta(sizes: Any, dtypes: Any) -> list[tuple[tuple[int, ...], str]]:
    """The recorder's (shape, dtype) pairs from its `input_sizes` / `input_dtypes` lists."""
    sizes, dtypes = list(sizes or []), list(dtypes or [])
    dtypes += ["unknown"] * (len(sizes) - len(dtypes))
    return [(tuple(size), _DTYPES.get(str(dtype), str(dtype).lower())) for size, dtype in zip(sizes, dtypes, strict=False)]
