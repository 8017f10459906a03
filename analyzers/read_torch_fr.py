"""Reader for PyTorch's built-in flight recorder and the recorders that copy its schema.

Covers PyTorch (schemas 1.x-2.10, pickle and JSON; NCCL, gloo), torchcomms' FlightRecorderHook and
torch_npu's HCCL recorder (see docs/report-format.md, "Inputs", for what each writes).

Why: most hangs happen in jobs that never ran flightrec, but one of these recorders is often on. Its
entries are mapped onto flightrec's columns: `collective_seq_id` is the group sequence (shifted to
start at 1 where a recorder counts from 0, since flightrec's seq 0 means "none"), p2p ops get a
per-pair sequence (k-th send a->b matches the k-th recv b<-a), `nccl:recv 1<-0` names become op and
peer. Completion comes from what the format observed (device events; else `retired` and
pg_status), never from the op-name prefix. What the format cannot say is left to the loader's notes
instead of being guessed.
"""

from __future__ import annotations

import json
import operator
import re
from typing import Any

import numpy as np
import pandas as pd

from .columns import dtype_text, finish_columns, first_rows, serialised_keys, text_column
from .constants import COMPLETED, ENQUEUED, MAX_RANKS, STARTED, TORCH_DTYPE_NAMES
from .rankdump import DumpError, GroupInfo, RankDump

PROFILING_NAME = (
    r"^(?:(?P<backend>[A-Za-z0-9_]+):)?(?P<op>[A-Za-z0-9_]+)(?:\s+(?P<a>\d+)\s*(?P<arrow>->|<-)\s*(?P<b>\d+))?"
)
STATE_MAP = {"scheduled": ENQUEUED, "started": STARTED, "completed": COMPLETED}
REQUIRED = ("process_group", "profiling_name", "collective_seq_id", "record_id", "state")
PAIR_ANCHOR = 1 << 20  # a pair's last completed transfer: see _pair_seq (rings hold far fewer entries)
NPU_DEFAULT_GROUP = "group_name_0"  # torch_npu names groups `group_name_<torch group name>`, with an empty desc
DEFAULT_GROUP_NAMES = ("0", NPU_DEFAULT_GROUP)
# backends fr_trace accepts as a `profiling_name` prefix; torchcomms uses the backend as the group desc
BACKEND_NAMES = frozenset({"nccl", "ncclx", "xccl", "gloo", "rccl", "rcclx", "mccl", "hccl"})
VERSION = re.compile(r"^[12]\.\d+$")
PY_TRACEBACK_SUFFIX = "_py_traceback"
THREAD_LINE = re.compile(r"^thread (.+):\s*$")
THREAD_NAME = re.compile(r"^<(\w+)\(([^,()]+)")
FRAME_LINE = re.compile(r'^\s*File "([^"]*)", line (\d+), in (.+?)\s*$')
TORCHCOMMS, TORCH_NPU, PYTORCH = "torchcomms", "torch_npu", "pytorch"

NOTE_GLOO = (
    "PyTorch's gloo recorder records no timestamps, no send/recv and an empty pg_config, and marks ops "
    "`retired` even when they timed out: completion is taken from `retired` and pg_status, and a "
    "rank's last op is treated as still waiting when a member never entered it"
)
NOTE_NO_EVENTS = (
    "this recorder observed no device events (every entry `scheduled`): completion is taken from `retired` and "
    "pg_status, which cannot tell a finished op from one that failed or timed out, and a rank's last op is "
    "treated as still waiting when a member never entered it"
)
NOTE_NO_FRAMES = "PyTorch's JSON dump carries no Python frames: call sites and stacks are unknown"
NOTE_NPU_NAMES = (
    "torch_npu records no op names (`profiling_name` is empty): ops show as 'unknown', are matched by group and "
    "sequence, and their sizes are not compared (what a size should be depends on the op)"
)
NOTE_TORCHCOMMS_SEQ = (
    "torchcomms numbers ops with one counter for all its communicators and the ring wrapped: sequence numbers "
    "of groups other than the busiest may not line up across ranks"
)
NOTE_TORCHCOMMS_P2P = "torchcomms records send/recv without their peer: point-to-point ops are not matched"
NOTE_NO_STACKS = "PyTorch's recorder dumps no thread stacks: a stalled rank's current stack is unknown"
NOTE_P2P_WRAPPED = (
    "the PyTorch ring wrapped: per-pair p2p sequence numbers are counted from the oldest entry kept and "
    "may not line up with the peer's"
)


def is_torch_fr(obj: Any) -> bool:
    """True for a decoded PyTorch-schema flight-recorder dump (pickle or JSON). `entries` may be absent:
    PyTorch's and torchcomms' JSON dumps of an empty ring leave the key out."""
    return isinstance(obj, dict) and "version" in obj and ("pg_config" in obj or "pg_status" in obj) and (
        "entries" in obj or "comm_lib_version" in obj or "nccl_comm_state" in obj
    )


def parse(obj: dict[str, Any], file: str, rank: int | None, fmt: str) -> RankDump:
    """Validate and normalise one decoded PyTorch flight-recorder dump."""
    if rank is None:
        raise DumpError("PyTorch flight-recorder dump whose file name ends in no rank number")
    version = str(obj.get("version"))
    if not VERSION.match(version):
        raise DumpError(f"unsupported PyTorch flight-recorder version {version!r} (1.x or 2.x expected)")
    raw = obj.get("entries", [])
    if not isinstance(raw, list):
        raise DumpError("`entries` is not a list of records")
    df = _frame(raw)
    recorder = _recorder(obj, df)
    groups = _pg_config_groups(obj.get("pg_config"), rank if recorder == TORCHCOMMS else None)
    pg_status = parse_pg_status(obj.get("pg_status"))
    notes: list[str] = []
    meta: dict[str, Any] = {
        "version": f"torch-fr {version}", "comm_lib_version": obj.get("comm_lib_version"), "recorder": recorder
    }
    _default_group(groups, meta)
    if not raw:
        return RankDump(rank, file, fmt, finish_columns({}, rank), groups, [], meta, pg_status, True, [NOTE_NO_STACKS])
    missing = [c for c in REQUIRED if c not in df.columns]
    if missing:
        raise DumpError(f"entries lack field(s) {', '.join(missing)}")
    try:
        df["record_id"] = pd.to_numeric(df["record_id"], errors="raise").astype(np.int64)
        df = df.sort_values("record_id", kind="stable").reset_index(drop=True)
        cols, backend, no_events = _columns(df, groups, pg_status, notes, recorder)
    except (KeyError, ValueError, TypeError, IndexError) as exc:
        raise DumpError(f"bad entries: {exc}") from None
    known = {g.name for g in groups}
    for name, desc in _entry_groups(df).items():
        if name not in known:
            groups.append(GroupInfo(name=name, desc=desc, backend=backend))
            _default_group(groups[-1:], meta)
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
    if no_events:
        notes.append(NOTE_GLOO if backend == "gloo" and recorder == PYTORCH else NOTE_NO_EVENTS)
    return RankDump(
        rank=rank,
        file=file,
        fmt=fmt,
        entries=finish_columns(cols, rank),
        groups=groups,
        threads=[],
        meta=meta,
        pg_status=pg_status,
        completion_reliable=not no_events,
        notes=notes,
    )


def _columns(
    df: pd.DataFrame, groups: list[GroupInfo], pg_status: dict[str, dict[str, int]] | None, notes: list[str],
    recorder: str,
) -> tuple[dict[str, Any], str, bool]:
    """flightrec's columns from the entries; also the backend and whether completion rests on `retired` alone."""
    tmpl = _Templates(df)
    group = pd.Series(tmpl.take(_group_names(tmpl.unique("process_group")).to_numpy(dtype=object)), index=df.index)
    parsed = _parse_names(tmpl.unique("profiling_name")).iloc[tmpl.codes].reset_index(drop=True)
    backends = parsed["backend"].dropna().unique()
    backend = str(backends[0]) if len(backends) else ("hccl" if recorder == TORCH_NPU else "")
    op = parsed["op"].fillna("unknown")
    flagged = _flags(df["is_p2p"]) if "is_p2p" in df.columns else pd.Series(False, index=df.index)
    is_p2p = flagged | op.isin(("send", "recv")) | parsed["arrow"].notna()  # torchcomms: is_p2p always false
    record_id = df["record_id"]
    op_id = _ints(df["op_id"]) if "op_id" in df.columns else pd.Series(-1, index=df.index, dtype=np.int64)
    coll_raw = _ints(df["collective_seq_id"])  # PyTorch's own tests write seq ids as strings

    peer = _global_peers(group, pd.to_numeric(parsed["b"], errors="coerce"), is_p2p, groups)
    seq = _group_seq(coll_raw, group, is_p2p, recorder, int(record_id.iloc[0]) > 0, notes)
    states = df["state"].astype(str)
    no_events = _no_events(df, states)
    if is_p2p.any():
        p2p = pd.DataFrame({"group": group, "op": op, "peer": peer})[is_p2p & (peer >= 0)]
        done = states.loc[p2p.index].to_numpy() == "completed"
        numbered, anchored = _pair_seq(p2p, done if not no_events else np.zeros(len(p2p), dtype=bool))
        seq.loc[p2p.index] = numbered
        if int(record_id.iloc[0]) > 0 and not anchored.all():
            notes.append(NOTE_P2P_WRAPPED)
        if recorder == TORCHCOMMS:
            notes.append(NOTE_TORCHCOMMS_P2P)

    # a coalesced block shares one seq id; without `p2p_seq_id` a p2p op carries the group's current
    # collective seq, shared by every send and recv until the next collective: no unit can be told then
    lone = pd.Series(-2 - record_id.to_numpy(), index=df.index)
    p2p_raw = _ints(df["p2p_seq_id"]) if "p2p_seq_id" in df.columns else lone
    raw_seq = p2p_raw.where(is_p2p, coll_raw)
    unit_key = pd.DataFrame({"g": group, "p": is_p2p, "s": raw_seq})
    dup = unit_key.duplicated(keep=False) & (recorder != TORCHCOMMS)  # torchcomms: one op per seq id, no coalescing
    unit = pd.Series(-1, index=df.index, dtype=np.int64)
    if dup.any():
        unit[dup] = record_id[dup].groupby([unit_key["g"][dup], unit_key["p"][dup], unit_key["s"][dup]]).transform("min")

    state = states.map(STATE_MAP).fillna("unknown")
    if no_events:
        state = _retired_state(df, group, op_id, pg_status)
    if recorder == TORCH_NPU and bool((parsed["op"].isna()).any()):
        notes.append(NOTE_NPU_NAMES)

    site, stack = (tmpl.take(v) for v in _sites(tmpl.unique("frames")))
    in_shapes = tmpl.take_coded(text_column(tmpl.unique("input_sizes")))
    out_shapes = tmpl.take_coded(text_column(tmpl.unique("output_sizes")))
    in_dtypes = tmpl.take_coded(text_column(tmpl.unique("input_dtypes"), _torch_dtypes))
    out_dtypes = tmpl.take_coded(text_column(tmpl.unique("output_dtypes"), _torch_dtypes))
    # a coalesced block's closing marker (`nccl:coalesced`, fr_trace's `ALLGATHER_coalesced` with `[[]]` sizes)
    # carries no tensors of its own: its empty sizes are not a payload to compare
    marker = (op.str.endswith("coalesced") & _blank(in_shapes) & _blank(out_shapes)).to_numpy()
    if marker.any():
        in_shapes, out_shapes, in_dtypes, out_dtypes = (_drop(c, marker) for c in (in_shapes, out_shapes, in_dtypes, out_dtypes))
    cols: dict[str, Any] = {
        "id": record_id.to_numpy(),
        "group": group.to_numpy(dtype=object),
        "seq": seq.to_numpy(),
        "pg_seq": op_id.to_numpy(),
        "kind": np.where(is_p2p, "p2p", "coll"),
        "op": op.to_numpy(dtype=object),
        "api": np.full(len(df), "torch_fr", dtype=object),
        "peer": peer.to_numpy(),
        "in_shapes": in_shapes,
        "out_shapes": out_shapes,
        "in_dtypes": in_dtypes,
        "out_dtypes": out_dtypes,
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
    return cols, backend, no_events


def _frame(raw: list[Any]) -> pd.DataFrame:
    """The entries as a table of object columns. Fast path: every record has the first one's fields
    (what a recorder writes), taken out with one C-level itemgetter pass, not a per-record dict walk."""
    if not raw:
        return pd.DataFrame()
    if set(map(type, raw)) != {dict}:
        if not all(isinstance(e, dict) for e in raw):
            raise DumpError("`entries` is not a list of records")
    keys = list(raw[0])
    try:
        rows = list(map(operator.itemgetter(*keys), raw)) if len(keys) > 1 else None
    except KeyError:
        rows = None
    if rows is None or sum(map(len, raw)) != len(keys) * len(raw):  # some record has other fields
        return pd.DataFrame.from_records(raw)
    columns = {}
    for key, values in zip(keys, zip(*rows, strict=True), strict=True):
        column = np.empty(len(values), dtype=object)
        column[:] = values
        columns[key] = column
    return pd.DataFrame(columns, copy=False)


def _pair_seq(p2p: pd.DataFrame, done: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-pair sequence numbers of send/recv rows (k-th send a->b pairs with the k-th recv b<-a), and
    which rows were anchored.

    Counting from the oldest entry kept breaks once the ring wrapped: the two sides dropped different
    numbers of older ops. A completed transfer completed on both sides, so each side's last completed
    op of a pair is the same transfer: numbering every op of the pair from it (at PAIR_ANCHOR) lines the
    two sides up whatever each ring dropped. A pair with nothing completed on record (or a recorder
    that cannot see completion) is counted from its oldest entry kept.
    """
    keys = [p2p["group"], p2p["op"], p2p["peer"]]
    position = p2p.groupby(keys, sort=False).cumcount().to_numpy() + 1
    last_done = pd.Series(np.where(done, position, 0), index=p2p.index).groupby(keys, sort=False).transform("max")
    anchor = last_done.to_numpy()
    anchored = anchor > 0
    return np.where(anchored, PAIR_ANCHOR + position - anchor, position), anchored


def _ints(values: pd.Series) -> pd.Series:
    """An id column as int64 (-1 where missing); JSON dumps and PyTorch's tests may give numbers as strings."""
    return pd.to_numeric(values, errors="coerce").fillna(-1).astype(np.int64)


def _flags(values: pd.Series) -> pd.Series:
    """A boolean field as bools (missing = False); hand-built JSON may spell them "true"/"1"."""
    if values.dtype == bool:
        return values
    text = values.astype(str).str.lower()
    return text.isin(("true", "1", "1.0"))


def _group_seq(
    raw: pd.Series, group: pd.Series, is_p2p: pd.Series, recorder: str, wrapped: bool, notes: list[str]
) -> pd.Series:
    """Per-group collective sequence numbers, from 1 (flightrec's 0 means "no sequence").

    PyTorch's NCCL/gloo and torch_npu count each group's collectives from 1. torchcomms counts every op of
    every communicator with one counter from 0, and PyTorch's own analyzer tests put ops at "0": those are
    renumbered so that a group's k-th collective is k on every rank (from the ids' order within the group,
    which holds while the ring has not wrapped; after a wrap the raw counter + 1 is the best left).
    """
    coll = ~is_p2p & (raw >= 0)
    seq = raw.where(coll, -1)
    if recorder != TORCHCOMMS and not bool(((raw == 0) & coll).any()):
        return seq
    if recorder == TORCHCOMMS and group[coll].nunique() > 1:
        if not wrapped:
            dense = raw[coll].groupby(group[coll]).rank(method="dense").astype(np.int64)
            seq.loc[dense.index] = dense
            return seq
        notes.append(NOTE_TORCHCOMMS_SEQ)
    return seq.where(~coll, raw + 1)


def _no_events(df: pd.DataFrame, states: pd.Series) -> bool:
    """True when the recorder saw no device event at all (gloo, torchcomms on CPU): every entry is
    `scheduled` and no discovery time was set, so only `retired` and pg_status say what finished."""
    if "retired" not in df.columns or bool(states.isin(("started", "completed")).any()):
        return False
    for col in ("time_discovered_started_ns", "time_discovered_completed_ns"):
        if col in df.columns and bool((pd.to_numeric(df[col], errors="coerce").fillna(0) > 0).any()):
            return False
    return True


def _blank(coded: Any) -> pd.Series:
    """Rows whose size list is empty (`[]`, `[[]]`) or absent."""
    empty = np.asarray([c.replace(" ", "") in ("[]", "[[]]", "") for c in coded.cats] + [True], dtype=bool)
    return pd.Series(empty[np.where(coded.codes >= 0, coded.codes, len(coded.cats))])


def _drop(coded: Any, rows: np.ndarray) -> Any:
    """`coded` with the given rows set to missing."""
    return type(coded)(np.where(rows, -1, coded.codes).astype(coded.codes.dtype), coded.cats)


def _retired_state(
    df: pd.DataFrame, group: pd.Series, op_id: pd.Series, pg_status: dict[str, dict[str, int]] | None
) -> pd.Series:
    """Without device events: an op is pending when not `retired`, or when pg_status has not seen it complete."""
    retired = _flags(df["retired"]) if "retired" in df.columns else pd.Series(True, index=df.index)
    pending = ~retired
    if pg_status:  # keyed by the backend's pg uid (`pg_id`), which need not equal the group name
        uid = df["pg_id"].astype(str) if "pg_id" in df.columns else group
        last = uid.map({k: v.get("last_completed_collective", -1) for k, v in pg_status.items()})
        pending |= last.notna() & (op_id > last.fillna(np.iinfo(np.int64).max))
    return pd.Series(np.where(pending, STARTED, COMPLETED), index=df.index)


def _recorder(obj: dict[str, Any], df: pd.DataFrame) -> str:
    """Which recorder wrote the dump: they share PyTorch's schema but differ in what their fields mean."""
    cfg = obj.get("pg_config") if isinstance(obj.get("pg_config"), dict) else {}
    names = [str(k) for k in cfg]
    descs: list[str] = []
    if "process_group" in df.columns:
        pairs = df["process_group"].drop_duplicates()
        names += [str(p[0]) for p in pairs if isinstance(p, (list, tuple)) and p]
        descs = [str(p[1]) for p in pairs if isinstance(p, (list, tuple)) and len(p) > 1]
    if "hccl_comm_state" in obj or any(n.startswith("group_name_") for n in names):
        return TORCH_NPU
    bare = [v.get("ranks") for v in cfg.values() if isinstance(v, dict) and isinstance(v.get("ranks"), str)]
    if any(r and not r.lstrip().startswith("[") for r in bare) or (descs and all(d in BACKEND_NAMES for d in descs)):
        return TORCHCOMMS  # comma-separated ranks, and the backend as every group's desc
    return PYTORCH


def _default_group(groups: list[GroupInfo], meta: dict[str, Any]) -> None:
    """torch_npu's default group `group_name_0` has an empty desc: name it, and take the world size from it."""
    for g in groups:
        if g.name == NPU_DEFAULT_GROUP:
            g.desc = g.desc or "default_pg"
            if g.ranks:
                meta["world_size"] = len(g.ranks)


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


class _Templates:
    """The distinct ops of a ring (group, name, sizes, dtypes, frames): a 2,000-entry ring repeats a few
    dozen, so each is parsed and formatted once and the rows take the results by code. One serialised key
    per row (C speed) groups them."""

    FIELDS = ("process_group", "profiling_name", "input_sizes", "output_sizes", "input_dtypes", "output_dtypes",
              "frames")

    def __init__(self, df: pd.DataFrame) -> None:
        self.fields = [f for f in self.FIELDS if f in df.columns]
        arrays = [df[f].to_numpy(dtype=object) for f in self.fields]
        rows = np.empty(len(df), dtype=object)
        rows[:] = list(zip(*arrays, strict=True))
        codes, uniques = pd.factorize(serialised_keys(rows))
        self.codes = codes
        self.first = first_rows(codes)
        self.columns = {f: a[self.first] for f, a in zip(self.fields, arrays, strict=True)}
        self.n = len(uniques)

    def unique(self, field: str) -> pd.Series:
        """The field's value of each distinct op (None where the format has no such field)."""
        values = self.columns.get(field)
        return pd.Series(values if values is not None else [None] * self.n, dtype=object)

    def take(self, per_op: np.ndarray) -> np.ndarray:
        return np.asarray(per_op, dtype=object)[self.codes]

    def take_coded(self, per_op: Any) -> Any:
        return type(per_op)(per_op.codes[self.codes], per_op.cats)


def _group_names(pairs: pd.Series) -> pd.Series:
    """The group name of each entry's `process_group` ([name, desc]), each distinct pair read once."""
    values = pairs.to_numpy(dtype=object)
    try:
        codes, uniques = pd.factorize(values)  # pickles: tuples
    except TypeError:  # JSON: lists
        codes, uniques = pd.factorize(serialised_keys(values))
        uniques = [values[i] for i in first_rows(codes).tolist()]
    names = np.array([str(p[0]) if isinstance(p, (list, tuple)) and p else "nan" for p in uniques] + ["nan"],
                     dtype=object)
    return pd.Series(names[np.where(codes >= 0, codes, len(uniques))], index=pairs.index, dtype=object)


def _parse_names(names: pd.Series) -> pd.DataFrame:
    """`profiling_name` split into backend, op and p2p endpoints: each distinct name parsed once (a ring
    repeats a few dozen names), the rows taken by code."""
    codes, uniques = pd.factorize(names.fillna("").astype(str).to_numpy(dtype=object))
    parsed = pd.Series(uniques, dtype=object).str.extract(PROFILING_NAME)
    return parsed.iloc[np.where(codes >= 0, codes, 0)].reset_index(drop=True)


def _sites(frames: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """Call site (innermost frame outside torch) and stack (outermost first) per entry.

    Each distinct list of frames is formatted once: rows are grouped by their frames' serialised bytes
    (C speed), so a 2,000-entry ring of a few dozen call sites costs a few dozen formattings.
    """
    values = frames.to_numpy(dtype=object)
    codes, uniques = pd.factorize(serialised_keys(values))
    site = np.empty(len(uniques), dtype=object)
    stack = np.empty(len(uniques), dtype=object)
    for i, row in enumerate(first_rows(codes).tolist()):
        fr = values[row]
        if not isinstance(fr, list) or not fr:
            continue
        lines = [f"{f.get('filename')}:{f.get('line')} in {f.get('name')}" for f in fr if isinstance(f, dict)]
        site[i] = next((ln for ln in lines if "/torch/" not in ln and "typing_extensions" not in ln),
                       lines[0] if lines else None)
        stack[i] = lines[::-1]
    return site[codes], stack[codes]


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
        text = value.strip()
        try:
            value = json.loads(text if text.startswith("[") else f"[{text}]")
        except ValueError:
            return None
    if isinstance(value, list) and value and all(isinstance(r, int) and 0 <= r < MAX_RANKS for r in value):
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
