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

from .. import log
from . import torch_compat


def enabled() -> bool:
    for name in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"):
        raw = os.environ.get(name)
        if raw is not None:
            try:
                return int(raw) > 0
            except ValueError:
                return False
    return torch_compat.has_builtin_recorder()


def read(include_entries: bool) -> dict[str, Any] | None:
    """PyTorch's recorders as one JSON dump (a dict), or None when none is readable: the built-in one
    (gloo's, and every backend's that writes to it) and, where its buffer is set, ProcessGroupNCCL's own
    (`read_nccl`), which alone knows NCCL groups: their C++-issued ops (DDP's Reducer) and how far each
    group completed.

    Each recorder numbers its groups on its own (`pg_id`, the key of `pg_status`), so where both are
    read their groups are joined by name, found in each one's entries: entries and `pg_status` are then
    keyed by group name (NCCL's counters win for a group both know); an NCCL group none of whose
    entries is left cannot be named, and its counters are left out (its completion stays unknown)
    rather than credited to another group of the same number."""
    nccl = read_nccl(include_entries)
    if nccl is None:
        return _read_generic(include_entries) if enabled() else None
    generic = _read_generic(True) if enabled() else None
    if generic is None:
        return nccl
    nccl = nccl if include_entries else read_nccl(True)  # naming its groups needs its entries
    if nccl is None:
        return generic
    generic_names, nccl_names = uid_to_group_name(generic), uid_to_group_name(nccl)
    merged = dict(generic)
    merged["entries"] = _named_entries(generic, generic_names) + _named_entries(nccl, nccl_names)
    merged["pg_status"] = {**{generic_names.get(str(uid), str(uid)): v for uid, v in (generic.get("pg_status") or {}).items()},
                           **{nccl_names[str(uid)]: v for uid, v in (nccl.get("pg_status") or {}).items()
                              if str(uid) in nccl_names}}
    return merged


def _named_entries(fr: dict[str, Any], names: dict[str, str]) -> list[Any]:
    """`fr`'s entries with `pg_id` replaced by the group's name (`names`), where known."""
    return [e | {"pg_id": names.get(str(e.get("pg_id")), e.get("pg_id"))} if isinstance(e, dict) else e
            for e in fr.get("entries") or []]


def _read_generic(include_entries: bool) -> dict[str, Any] | None:
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


# A hang dump (flightrec's `timeout`, and a peer's dump on its request) carries PyTorch's own recorder
# state too: what NCCL's watchdog will act on, and write itself with TORCH_NCCL_DUMP_ON_TIMEOUT, once the
# group's timeout passes (it may abort the process right after). Kept small: the newest entries only.
HANG_REASONS = ("timeout", "peer_request")
KEPT_ENTRIES = 32
ENTRY_FIELDS = ("record_id", "pg_id", "process_group", "collective_seq_id", "p2p_seq_id", "op_id", "profiling_name",
                "is_p2p", "state", "retired", "time_created_ns", "time_discovered_started_ns",
                "time_discovered_completed_ns", "timeout_ms", "input_sizes", "input_dtypes", "output_sizes")


def _env_flag(names: tuple[str, ...]) -> bool | None:
    """The first of `names` set, as PyTorch reads a boolean; None when none is set (its default applies)."""
    for name in names:
        raw = os.environ.get(name)
        if raw is not None:
            return raw.strip().lower() in ("1", "true", "yes", "on", "y")
    return None


def read_nccl(include_entries: bool = True) -> dict[str, Any] | None:
    """PyTorch's NCCL recorder (a recorder of its own, beside the one `read` reads), or None. Read only
    where its buffer is set explicitly (TORCH_FR_BUFFER_SIZE / TORCH_NCCL_TRACE_BUFFER_SIZE > 0): its
    default differs between releases, and dumping a disabled recorder aborts the process."""
    dump = torch_compat.nccl_trace_dump()
    if dump is None:
        return None
    for name in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"):
        raw = os.environ.get(name)
        if raw is not None:
            break
    else:
        return None
    try:
        if int(raw) <= 0:
            return None
        return json.loads(dump(includeCollectives=include_entries))
    except Exception as exc:  # noqa: BLE001
        log.warn_once("torch-fr-nccl", f"PyTorch's NCCL flight recorder could not be read: {exc!r}")
        return None


def _compact(fr: dict[str, Any]) -> dict[str, Any]:
    entries = [e for e in fr.get("entries") or [] if isinstance(e, dict)]
    return {"pg_status": fr.get("pg_status"), "version": fr.get("version"), "entries_total": len(entries),
            "entries": [{k: e[k] for k in ENTRY_FIELDS if k in e} for e in entries[-KEPT_ENTRIES:]]}


def summary(fr: dict[str, Any] | None, hang: bool) -> dict[str, Any] | None:
    """The dump's `torch_fr` (docs/dump-format.md): `pg_status` always; in a hang dump also the newest
    entries with their key fields, the same of PyTorch's NCCL recorder (`nccl`), and whether and where
    PyTorch writes its own dump on timeout."""
    nccl = read_nccl() if hang else None
    if fr is None and nccl is None:
        return None
    if not hang:
        return {"pg_status": (fr or {}).get("pg_status")}
    out = _compact(fr) if fr is not None else {"pg_status": None, "version": None, "entries_total": None, "entries": None}
    out["nccl"] = _compact(nccl) if nccl is not None else None
    out["dump_on_timeout"] = _env_flag(("TORCH_NCCL_DUMP_ON_TIMEOUT",))
    prefix = os.environ.get("TORCH_FR_DUMP_TEMP_FILE") or os.environ.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
    out["dump_prefix"] = prefix or None
    return out
