"""What a PyTorch-schema dump says besides its entries: which recorder wrote it, its groups
(`pg_config`), its progress counters (`pg_status`), and torch_npu's Python traceback side file.

Why apart from the entry reader: these are small, format-specific parsers of loosely typed fields
(ranks as `"[0, 1]"` or `"0,1"`, counters as strings or ints), shared by flightrec's own reader
(`pg_status`) and the file identification (the `_py_traceback` suffix), none of which needs the
entries.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Sequence
from typing import Any

from ..constants import MAX_RANKS
from .pickle_columns import CodedColumn
from .rankdump import GroupInfo

NPU_DEFAULT_GROUP = "group_name_0"  # torch_npu names groups `group_name_<torch group name>`, with an empty desc
DEFAULT_GROUP_NAMES = ("0", NPU_DEFAULT_GROUP)
# backends fr_trace accepts as a `profiling_name` prefix; torchcomms uses the backend as the group desc
BACKEND_NAMES = frozenset({"nccl", "ncclx", "xccl", "gloo", "rccl", "rcclx", "mccl", "hccl"})
PY_TRACEBACK_SUFFIX = "_py_traceback"
THREAD_LINE = re.compile(r"^thread (.+):\s*$")
THREAD_NAME = re.compile(r"^<(\w+)\(([^,()]+)")
FRAME_LINE = re.compile(r'^\s*File "([^"]*)", line (\d+), in (.+?)\s*$')
TORCHCOMMS, TORCH_NPU, PYTORCH = "torchcomms", "torch_npu", "pytorch"


def _recorder(obj: dict[str, Any], process_groups: Sequence[Any]) -> str:
    """Which recorder wrote the dump: they share PyTorch's schema but differ in what their fields mean."""
    cfg = obj.get("pg_config") if isinstance(obj.get("pg_config"), dict) else {}
    names = [str(k) for k in cfg]
    pairs = _distinct_pairs(process_groups)
    names += [str(p[0]) for p in pairs]
    descs = [str(p[1]) for p in pairs if len(p) > 1]
    if "hccl_comm_state" in obj or any(n.startswith("group_name_") for n in names):
        return TORCH_NPU
    bare = [v.get("ranks") for v in cfg.values() if isinstance(v, dict) and isinstance(v.get("ranks"), str)]
    if any(r and not r.lstrip().startswith("[") for r in bare) or (descs and all(d in BACKEND_NAMES for d in descs)):
        return TORCHCOMMS  # comma-separated ranks, and the backend as every group's desc
    return PYTORCH


def _distinct_pairs(values: Sequence[Any]) -> list[tuple[Any, ...]]:
    """The distinct `process_group` values that are [name, desc] pairs, each once (deduplicated in C)."""
    if isinstance(values, CodedColumn):
        values = values.uniques
    try:
        distinct = list(dict.fromkeys(values))  # pickles: tuples
    except TypeError:
        try:
            distinct = list(dict.fromkeys(map(tuple, values)))  # JSON: lists
        except TypeError:
            distinct = [v for v in values if isinstance(v, (list, tuple))]
    return [tuple(p) for p in distinct if _is_pair(p)]


def _is_pair(value: Any) -> bool:
    """A `process_group` value as recorders write it: [name, desc] (a list in JSON, a tuple in pickles)."""
    return isinstance(value, (list, tuple)) and len(value) > 0 and all(isinstance(v, (str, int)) for v in value)


def _default_group(groups: list[GroupInfo], meta: dict[str, Any]) -> None:
    """torch_npu's default group `group_name_0` has an empty desc: name it, and take the world size from it."""
    for g in groups:
        if g.name == NPU_DEFAULT_GROUP:
            g.desc = g.desc or "default_pg"
            if g.ranks:
                meta["world_size"] = len(g.ranks)


def _pg_config_groups(cfg: Any, own_rank: int | None = None) -> list[GroupInfo]:
    """Groups from `pg_config`. `own_rank` (torchcomms): early torchcomms listed comm-local ranks 0..n-1,
    later ones global ranks; a list without the dump's own rank cannot be global and is dropped."""
    out: list[GroupInfo] = []
    if not isinstance(cfg, dict):
        return out
    for name, info in cfg.items():
        if not name or not isinstance(info, dict):
            continue
        ranks = _parse_ranks(info.get("ranks"))
        if ranks is not None and own_rank is not None and own_rank not in ranks:
            ranks = None
        out.append(GroupInfo(name=str(name), desc=str(info.get("desc") or ""), ranks=ranks))
    return out


def _parse_ranks(value: Any) -> tuple[int, ...] | None:
    """`"[0, 1]"` (PyTorch, torch_npu), `"0,1"` (torchcomms) or a list; None when absent or odd."""
    if isinstance(value, str):
        return _ranks_text(value)
    return _rank_tuple(value)


@functools.lru_cache(maxsize=1024)
def _ranks_text(text: str) -> tuple[int, ...] | None:
    """Cached: every rank's dump spells the world group's 16,384 members the same way, and a worker
    reads hundreds of them (the same tuple back also lets the loader share it without hashing it)."""
    text = text.strip()
    try:
        return _rank_tuple(json.loads(text if text.startswith("[") else f"[{text}]"))
    except ValueError:
        return None


def _rank_tuple(value: Any) -> tuple[int, ...] | None:
    if isinstance(value, list) and value and set(map(type, value)) == {int} and 0 <= min(value) and max(value) < MAX_RANKS:
        return tuple(value)
    return None


def parse_py_traceback(text: str) -> list[dict[str, Any]]:
    """torch_npu's `<prefix><rank>_py_traceback` side file as flightrec thread records.

    Written by ProcessGroupHCCL::dumpPythonTraceback: `pid: N`, then per thread `thread <repr or id>:`
    followed by `traceback.format_list` lines (`  File "f", line N, in fn` and the source line),
    outermost frame first, which is the order flightrec's own `stack` uses.
    """
    threads: list[dict[str, Any]] = []
    for line in text.splitlines():
        head = THREAD_LINE.match(line)
        if head:
            label = head.group(1)
            named = THREAD_NAME.search(label)
            name = named.group(2) if named else f"thread-{label}"
            threads.append({
                "name": name,
                "ident": int(label) if label.isdigit() else None,
                "is_main": bool(named and (named.group(1) == "_MainThread" or name == "MainThread")),
                "stack": [],
            })
            continue
        frame = FRAME_LINE.match(line)
        if frame and threads:
            threads[-1]["stack"].append(f"{frame.group(1)}:{frame.group(2)} in {frame.group(3)}")
    return threads


def parse_pg_status(status: Any) -> dict[str, dict[str, int]] | None:
    """`pg_status` with its counters as ints (JSON dumps give strings, pickles ints); None if absent."""
    if not isinstance(status, dict):
        return None
    out: dict[str, dict[str, int]] = {}
    for pg, fields in status.items():
        if isinstance(fields, dict):
            clean = {}
            for k, v in fields.items():
                try:
                    clean[k] = int(v)
                except (TypeError, ValueError):
                    continue
            out[str(pg)] = clean
    return out
