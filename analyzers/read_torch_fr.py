"""Reader for PyTorch's built-in flight recorder (schema 2.x; NCCL, gloo and torch_npu's HCCL).

Why: most hangs happen in jobs that never ran flightrec, but PyTorch's recorder is often on. Its
entries are mapped onto flightrec's columns: `collective_seq_id` is the group sequence, p2p ops get a
per-pair sequence (k-th send a->b matches the k-th recv b<-a), `nccl:recv 1<-0` names become op and
peer. What the format cannot say (gloo: no timestamps, no p2p, `retired` set even on ops that timed
out, an empty `pg_config`) is left to the loader's notes instead of being guessed.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pandas as pd

from .columns import dtype_text, finish_columns, text_column
from .constants import COMPLETED, ENQUEUED, MAX_RANKS, STARTED, TORCH_DTYPE_NAMES
from .rankdump import DumpError, GroupInfo, RankDump

PROFILING_NAME = (
    r"^(?:(?P<backend>[A-Za-z0-9_]+):)?(?P<op>[A-Za-z0-9_]+)(?:\s+(?P<a>\d+)\s*(?P<arrow>->|<-)\s*(?P<b>\d+))?"
)
STATE_MAP = {"scheduled": ENQUEUED, "started": STARTED, "completed": COMPLETED}
REQUIRED = ("process_group", "profiling_name", "collective_seq_id", "record_id", "state")
DEFAULT_GROUP_NAMES = ("0",)

NOTE_GLOO = (
    "PyTorch's gloo recorder records no timestamps, no send/recv and an empty pg_config, and marks ops "
    "`retired` even when they timed out: completion is taken from `retired` and pg_status, and a "
    "rank's last op is treated as still waiting when a member never entered it"
)
NOTE_NO_FRAMES = "PyTorch's JSON dump carries no Python frames: call sites and stacks are unknown"
NOTE_NO_STACKS = "PyTorch's recorder dumps no thread stacks: a stalled rank's current stack is unknown"
NOTE_P2P_WRAPPED = (
    "the PyTorch ring wrapped: per-pair p2p sequence numbers are counted from the oldest entry kept and "
    "may not line up with the peer's"
)


def is_torch_fr(obj: Any) -> bool:
    """True for a decoded PyTorch flight-recorder dump (pickle or `_dump_fr_trace_json`)."""
    return isinstance(obj, dict) and "entries" in obj and "version" in obj and ("pg_config" in obj or "pg_status" in obj)


def parse(obj: dict[str, Any], file: str, rank: int | None, fmt: str) -> RankDump:
    """Validate and normalise one decoded PyTorch flight-recorder dump."""
    if rank is None:
        raise DumpError("PyTorch flight-recorder dump whose file name ends in no rank number")
    version = str(obj.get("version"))
    if not version.startswith("2."):
        raise DumpError(f"unsupported PyTorch flight-recorder version {version!r} (2.x expected)")
    raw = obj.get("entries")
    if not isinstance(raw, list) or not all(isinstance(e, dict) for e in raw):
        raise DumpError("`entries` is not a list of records")
    groups = _pg_config_groups(obj.get("pg_config"))
    pg_status = parse_pg_status(obj.get("pg_status"))
    notes: list[str] = []
    meta: dict[str, Any] = {"version": f"torch-fr {version}", "comm_lib_version": obj.get("comm_lib_version")}
    if not raw:
        return RankDump(rank, file, fmt, finish_columns({}, rank), groups, [], meta, pg_status, True, [NOTE_NO_STACKS])
    df = pd.DataFrame.from_records(raw)
    missing = [c for c in REQUIRED if c not in df.columns]
    if missing:
        raise DumpError(f"entries lack field(s) {', '.join(missing)}")
    df = df.sort_values("record_id", kind="stable").reset_index(drop=True)
    try:
        cols, backend, gloo = _columns(df, groups, pg_status, notes)
    except (KeyError, ValueError, TypeError, IndexError) as exc:
        raise DumpError(f"bad entries: {exc}") from None
    known = {g.name for g in groups}
    for name, desc in _entry_groups(df).items():
        if name not in known:
            groups.append(GroupInfo(name=name, desc=desc, backend=backend))
        else:
            for g in groups:
                if g.name == name:
                    g.desc = g.desc or desc
                    g.backend = g.backend or backend
    meta["backends"] = [backend] if backend else []
    meta["first_id"] = int(df["record_id"].iloc[0])
    meta["wall_offset_ns"] = 0  # time_created_ns is already wall-clock time
    notes.append(NOTE_NO_STACKS)
    if "frames" not in df.columns:
        notes.append(NOTE_NO_FRAMES)
    if gloo:
        notes.append(NOTE_GLOO)
    return RankDump(
        rank=rank,
        file=file,
        fmt=fmt,
        entries=finish_columns(cols, rank),
        groups=groups,
        threads=[],
        meta=meta,
        pg_status=pg_status,
        completion_reliable=not gloo,
        notes=notes,
    )


def _columns(
    df: pd.DataFrame, groups: list[GroupInfo], pg_status: dict[str, dict[str, int]] | None, notes: list[str]
) -> tuple[dict[str, Any], str, bool]:
    group = df["process_group"].str[0].astype(str)
    parsed = df["profiling_name"].astype(str).str.extract(PROFILING_NAME)
    backends = parsed["backend"].dropna().unique()
    backend = str(backends[0]) if len(backends) else ""
    op = parsed["op"].fillna("unknown")
    is_p2p = df["is_p2p"].fillna(False).astype(bool) if "is_p2p" in df.columns else op.isin(("send", "recv"))
    is_p2p = is_p2p | parsed["arrow"].notna()
    record_id = df["record_id"].astype(np.int64)
    op_id = df["op_id"].fillna(-1).astype(np.int64) if "op_id" in df.columns else pd.Series(-1, index=df.index)

    peer = _global_peers(group, pd.to_numeric(parsed["b"], errors="coerce"), is_p2p, groups)
    seq = df["collective_seq_id"].fillna(-1).astype(np.int64).where(~is_p2p, -1)
    if is_p2p.any():
        p2p = pd.DataFrame({"group": group, "op": op, "peer": peer})[is_p2p & (peer >= 0)]
        seq.loc[p2p.index] = p2p.groupby(["group", "op", "peer"], sort=False).cumcount().to_numpy() + 1
        if int(record_id.iloc[0]) > 0:
            notes.append(NOTE_P2P_WRAPPED)

    raw_seq = df["p2p_seq_id"].fillna(-1).astype(np.int64).where(is_p2p, df["collective_seq_id"]) if (
        "p2p_seq_id" in df.columns
    ) else df["collective_seq_id"]
    unit_key = pd.DataFrame({"g": group, "p": is_p2p, "s": raw_seq})
    dup = unit_key.duplicated(keep=False)
    unit = pd.Series(-1, index=df.index, dtype=np.int64)
    if dup.any():
        unit[dup] = record_id[dup].groupby([unit_key["g"][dup], unit_key["p"][dup], unit_key["s"][dup]]).transform("min")

    gloo = backend == "gloo"
    state = df["state"].astype(str).map(STATE_MAP).fillna("unknown")
    if gloo:
        state = _gloo_state(df, group, op_id, pg_status)

    frames = df["frames"] if "frames" in df.columns else pd.Series([None] * len(df))
    site, stack = _sites(frames)
    cols: dict[str, Any] = {
        "id": record_id.to_numpy(),
        "group": group.to_numpy(dtype=object),
        "seq": seq.to_numpy(),
        "pg_seq": op_id.to_numpy(),
        "kind": np.where(is_p2p, "p2p", "coll"),
        "op": op.to_numpy(dtype=object),
        "api": np.full(len(df), "torch_fr", dtype=object),
        "peer": peer.to_numpy(),
        "in_shapes": text_column(df.get("input_sizes", pd.Series([None] * len(df)))),
        "out_shapes": text_column(df.get("output_sizes", pd.Series([None] * len(df)))),
        "in_dtypes": text_column(df.get("input_dtypes", pd.Series([None] * len(df))), _torch_dtypes),
        "out_dtypes": text_column(df.get("output_dtypes", pd.Series([None] * len(df))), _torch_dtypes),
        "is_async": np.zeros(len(df), dtype=bool),
        "unit": unit.to_numpy(),
        "state": state.to_numpy(dtype=object),
        "t_enqueue_ns": _ns(df.get("time_created_ns")),
        "t_complete_ns": _ns(df.get("time_discovered_completed_ns")),
        "t_dev_start_ns": _ns(df.get("time_discovered_started_ns")),
        "thread": df["thread_name"].to_numpy(dtype=object) if "thread_name" in df.columns else None,
        "site": site,
        "stack": stack,
        "source": np.full(len(df), "torch_fr", dtype=object),
    }
    return cols, backend, gloo


def _gloo_state(
    df: pd.DataFrame, group: pd.Series, op_id: pd.Series, pg_status: dict[str, dict[str, int]] | None
) -> pd.Series:
    """gloo: an op is pending when not `retired`, or when pg_status has not seen it complete."""
    retired = df["retired"].fillna(True).astype(bool) if "retired" in df.columns else pd.Series(True, index=df.index)
    pending = ~retired
    if pg_status:  # keyed by the backend's pg uid (`pg_id`), which need not equal the group name
        uid = df["pg_id"].astype(str) if "pg_id" in df.columns else group
        last = uid.map({k: v.get("last_completed_collective", -1) for k, v in pg_status.items()})
        pending |= last.notna() & (op_id > last.fillna(np.iinfo(np.int64).max))
    return pd.Series(np.where(pending, STARTED, COMPLETED), index=df.index)


def _global_peers(group: pd.Series, local: pd.Series, is_p2p: pd.Series, groups: list[GroupInfo]) -> pd.Series:
    """Group-local peer numbers of `send a->b` / `recv a<-b` to global ranks (-1 when unknown)."""
    peer = pd.Series(-1, index=group.index, dtype=np.int64)
    members = {g.name: g.ranks for g in groups}
    for name in group[is_p2p].unique():
        rows = is_p2p & (group == name) & local.notna()
        loc = local[rows].astype(np.int64).to_numpy()
        ranks = members.get(name)
        if ranks:
            table = np.asarray(sorted(ranks), dtype=np.int64)
            ok = loc < len(table)
            peer.loc[rows[rows].index[ok]] = table[loc[ok]]
        elif name in DEFAULT_GROUP_NAMES:
            peer.loc[rows] = loc
    return peer


def _sites(frames: pd.Series) -> tuple[list[str | None], list[list[str] | None]]:
    """Call site (innermost frame outside torch) and stack (outermost first) per entry.

    PyTorch keeps a bounded ring (2,000 entries by default), so this per-entry pass is bounded too.
    """
    site: list[str | None] = []
    stack: list[list[str] | None] = []
    for fr in frames:
        if not isinstance(fr, list) or not fr:
            site.append(None)
            stack.append(None)
            continue
        lines = [f"{f.get('filename')}:{f.get('line')} in {f.get('name')}" for f in fr if isinstance(f, dict)]
        user = next((ln for ln in lines if "/torch/" not in ln and "typing_extensions" not in ln), lines[0] if lines else None)
        site.append(user)
        stack.append(lines[::-1])
    return site, stack


def _ns(values: Any) -> Any:
    """Nanosecond column; PyTorch writes 0 (JSON) or None (pickle) for 'not observed'."""
    if values is None:
        return None
    arr = pd.array(pd.Series(values, dtype=object), dtype="Int64")
    arr[arr <= 0] = pd.NA
    return arr


def _torch_dtypes(text: str) -> str:
    return ",".join(TORCH_DTYPE_NAMES.get(t, t) for t in dtype_text(text).split(",") if t)


def _entry_groups(df: pd.DataFrame) -> dict[str, str]:
    pairs = df["process_group"].drop_duplicates()
    return {str(p[0]): str(p[1]) if len(p) > 1 else "" for p in pairs}


def _pg_config_groups(cfg: Any) -> list[GroupInfo]:
    out: list[GroupInfo] = []
    if not isinstance(cfg, dict):
        return out
    for name, info in cfg.items():
        if not name or not isinstance(info, dict):
            continue
        ranks = _parse_ranks(info.get("ranks"))
        out.append(GroupInfo(name=str(name), desc=str(info.get("desc") or ""), ranks=ranks))
    return out


def _parse_ranks(value: Any) -> tuple[int, ...] | None:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if isinstance(value, list) and value and all(isinstance(r, int) and 0 <= r < MAX_RANKS for r in value):
        return tuple(value)
    return None


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
