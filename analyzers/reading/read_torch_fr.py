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

The per-pair p2p numbering is in torch_fr_p2p.py, the recorder, `pg_config`, `pg_status` and traceback
parsing in torch_fr_meta.py; this module maps the entries.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from ..constants import COMPLETED, ENQUEUED, STARTED, TORCH_DTYPE_NAMES
from ..keys import first_rows, group_ids
from .codes import Coded, dtype_text, serialised_keys, text_column
from .columns import Templated, expand_batch, finish_columns
from .pickle_columns import CodedColumn, Column, ColumnarEntries, OpColumn, ScalarColumn
from .rankdump import DumpError, GroupInfo, RankDump
from .torch_fr_meta import (
    DEFAULT_GROUP_NAMES,
    PYTORCH,
    TORCH_NPU,
    TORCHCOMMS,
    _default_group,
    _pg_config_groups,
    _recorder,
    parse_pg_status,
)
from .torch_fr_p2p import _pair_seq

PROFILING_NAME = re.compile(
    r"^(?:(?P<backend>[A-Za-z0-9_]+):)?(?P<op>[A-Za-z0-9_]+)(?:\s+(?P<a>\d+)\s*(?P<arrow>->|<-)\s*(?P<b>\d+))?"
)
STATE_MAP = {"scheduled": ENQUEUED, "started": STARTED, "completed": COMPLETED}
STATE_CATS = [ENQUEUED, STARTED, COMPLETED, "unknown"]  # one list for every rank: a batch merges it once
UNKNOWN_STATE = STATE_CATS.index("unknown")
REQUIRED = ("process_group", "profiling_name", "collective_seq_id", "record_id", "state")
VERSION = re.compile(r"^[12]\.\d+$")

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


def parse(obj: dict[str, Any], file: str, rank: int | None, fmt: str, lazy: bool = False) -> RankDump:
    """Validate and normalise one decoded PyTorch flight-recorder dump. `lazy`: leave the entries as
    `Templated` (per-op columns not yet taken onto the entries) for a reader that expands a batch of
    ranks at once (columns.expand_batch)."""
    if rank is None:
        raise DumpError("PyTorch flight-recorder dump whose file name ends in no rank number")
    version = str(obj.get("version"))
    if not VERSION.match(version):
        raise DumpError(f"unsupported PyTorch flight-recorder version {version!r} (1.x or 2.x expected)")
    raw = obj.get("entries", [])
    if isinstance(raw, ColumnarEntries):  # decoded by the C reader (pickle_columns)
        fields: dict[str, Sequence[Any]] = {name: raw.column(name) for name in raw.names}
    elif not isinstance(raw, list):
        raise DumpError("`entries` is not a list of records")
    else:
        fields = _fields(raw)
    recorder = _recorder(obj, fields.get("process_group", ()))
    groups = _pg_config_groups(obj.get("pg_config"), rank if recorder == TORCHCOMMS else None)
    pg_status = parse_pg_status(obj.get("pg_status"))
    notes: list[str] = []
    meta: dict[str, Any] = {
        "version": f"torch-fr {version}", "comm_lib_version": obj.get("comm_lib_version"), "recorder": recorder
    }
    _default_group(groups, meta)
    if not raw:
        return RankDump(rank, file, fmt, finish_columns({}, rank), groups, [], meta, pg_status, True, [NOTE_NO_STACKS])
    missing = [c for c in REQUIRED if c not in fields]
    if missing:
        raise DumpError(f"entries lack field(s) {', '.join(missing)}")
    try:
        ops = _Ops(_sorted_by_record_id(fields), groups)
        entries, backend, no_events = _entries(ops, rank, pg_status, notes, recorder)
        if not lazy:
            entries = expand_batch([entries])
    except (KeyError, ValueError, TypeError, IndexError) as exc:
        raise DumpError(f"bad entries: {exc}") from None
    known = {g.name: g for g in groups}
    for name, desc in ops.group_descs().items():
        if name not in known:
            groups.append(GroupInfo(name=name, desc=desc, backend=backend))
            _default_group(groups[-1:], meta)
        else:
            known[name].desc = known[name].desc or desc
            known[name].backend = known[name].backend or backend
    meta["backends"] = [backend] if backend else []
    meta["first_id"] = int(ops.record_id[0])
    meta["wall_offset_ns"] = 0  # time_created_ns is already wall-clock time
    notes.append(NOTE_NO_STACKS)
    if "frames" not in fields:
        notes.append(NOTE_NO_FRAMES)
    if no_events:
        notes.append(NOTE_GLOO if backend == "gloo" and recorder == PYTORCH else NOTE_NO_EVENTS)
    return RankDump(
        rank=rank,
        file=file,
        fmt=fmt,
        entries=entries,
        groups=groups,
        threads=[],
        meta=meta,
        pg_status=pg_status,
        completion_reliable=not no_events,
        notes=notes,
    )


def _entries(
    ops: _Ops, rank: int, pg_status: dict[str, dict[str, int]] | None, notes: list[str], recorder: str
) -> tuple[Templated, str, bool]:
    """flightrec's columns (per-op ones left as templates); also the backend and whether completion
    rests on `retired` alone."""
    t = ops.templates
    codes = ops.codes
    n = len(codes)
    backend = next((b for b in t.backend if b), "hccl" if recorder == TORCH_NPU else "")
    is_p2p = t.is_p2p[codes]
    record_id = ops.record_id
    op_id = _ints(ops.get("op_id"), n)
    coll_raw = _ints(ops.get("collective_seq_id"), n)  # PyTorch's own tests write seq ids as strings
    group = t.group_id[codes]
    seq = _group_seq(coll_raw, group, is_p2p, recorder, int(record_id[0]) > 0, notes)

    states = _StateCodes(ops.get("state"))
    times = {name: _ns(ops.get(field), n) for name, field in TIME_FIELDS.items()}
    seen = [times["t_complete_ns"], _ns(ops.get("time_discovered_started_ns"), n)]  # any event observed at all
    no_events = "retired" in ops.fields and not states.any_event() and not any(
        bool((~t_.isna() & (t_ > 0)).any()) for t_ in seen
    )
    p2p_rows = np.flatnonzero(is_p2p & (t.peer[codes] >= 0))
    if len(p2p_rows):
        done = states.completed()[p2p_rows] if not no_events else np.zeros(len(p2p_rows), dtype=bool)
        numbered, anchored = _pair_seq(t.pair[codes[p2p_rows]], done)
        seq[p2p_rows] = numbered
        if int(record_id[0]) > 0 and not anchored.all():
            notes.append(NOTE_P2P_WRAPPED)
        if recorder == TORCHCOMMS:
            notes.append(NOTE_TORCHCOMMS_P2P)

    # a coalesced block shares one seq id; without `p2p_seq_id` a p2p op carries the group's current
    # collective seq, shared by every send and recv until the next collective: no unit can be told then
    p2p_raw = _ints(ops.get("p2p_seq_id"), n) if "p2p_seq_id" in ops.fields else -2 - record_id
    unit = np.full(n, -1, dtype=np.int64)
    if recorder != TORCHCOMMS:  # torchcomms: one op per seq id, no coalescing
        key = group_ids([group, is_p2p.astype(np.int64), np.where(is_p2p, p2p_raw, coll_raw)])
        size = np.bincount(key)
        dup = size[key] > 1
        if dup.any():
            lowest = np.full(len(size), np.iinfo(np.int64).max, dtype=np.int64)
            np.minimum.at(lowest, key[dup], record_id[dup])
            unit[dup] = lowest[key[dup]]

    state = states.mapped()
    if no_events:
        state = _retired_state(ops, op_id, pg_status)
    if recorder == TORCH_NPU and not all(t.named):
        notes.append(NOTE_NPU_NAMES)
    per_entry: dict[str, Any] = {
        "id": record_id, "seq": seq, "pg_seq": op_id, "unit": unit, "state": state, **times,
    }
    return Templated(rank, n, per_entry, t.columns(), codes, t.count), backend, no_events


# `time_discovered_started_ns` is not read: it is when PyTorch's watchdog noticed the start event, a
# polled time, not when the device started the op (flightrec's `t_dev_start_ns` is a measurement)
TIME_FIELDS = {
    "t_enqueue_ns": "time_created_ns",
    "t_complete_ns": "time_discovered_completed_ns",
}


def _fields(raw: list[Any]) -> dict[str, Sequence[Any]]:
    """The entries as one sequence per field. Fast path: every record has the first one's fields
    (what a recorder writes), taken out with one C-level itemgetter pass, not a per-record dict walk."""
    if not raw:
        return {}
    if set(map(type, raw)) != {dict} and not all(isinstance(e, dict) for e in raw):
        raise DumpError("`entries` is not a list of records")
    keys = list(raw[0])
    if len(keys) > 1 and sum(map(len, raw)) == len(keys) * len(raw):
        try:
            return dict(zip(keys, zip(*map(operator.itemgetter(*keys), raw), strict=True), strict=True))
        except KeyError:  # a record with other fields (as many of them)
            pass
    every = list(dict.fromkeys(k for e in raw for k in e))
    return {k: [e.get(k) for e in raw] for k in every}


def _sorted_by_record_id(fields: dict[str, Sequence[Any]]) -> dict[str, Sequence[Any]]:
    """The fields with the entries in record-id order (a dump's own order, but JSON may be hand-made)."""
    ids = _ids(fields["record_id"])
    order = np.argsort(ids, kind="stable")
    if len(ids) < 2 or bool((order == np.arange(len(ids))).all()):
        return {**fields, "record_id": ids}
    pick = operator.itemgetter(*order.tolist())
    return {**{k: v.take(order) if isinstance(v, Column) else pick(v) for k, v in fields.items()}, "record_id": ids[order]}


def _ids(values: Sequence[Any]) -> np.ndarray:
    if _plain_ints(values):
        return values.values  # type: ignore[attr-defined, no-any-return]
    try:
        return np.fromiter(values, dtype=np.int64, count=len(values))
    except (TypeError, ValueError, OverflowError):  # strings in hand-built JSON; anything else is an error
        return pd.to_numeric(pd.Series(values, dtype=object), errors="raise").astype(np.int64).to_numpy()


class _Ops:
    """A ring's entries: the per-entry fields, and the distinct ops they repeat (`templates`, one per
    distinct group, name, flags, sizes, dtypes, thread and frames), each entry's op in `codes`.

    Why: a 2,000-entry ring repeats a few dozen ops, so each is parsed and formatted once and the
    entries take the results by code; the key of an entry's op is made for the whole ring in one
    serialisation (codes.serialised_keys)."""

    def __init__(self, fields: dict[str, Sequence[Any]], groups: list[GroupInfo]) -> None:
        self.fields = fields
        self.record_id: np.ndarray = fields["record_id"]  # type: ignore[assignment]
        names = [f for f in TEMPLATE_FIELDS if f in fields]
        coded = [fields[f] for f in names]
        digests: dict[str, int] = {}
        if coded and all(isinstance(c, OpColumn) and c.source is coded[0].source for c in coded):
            # the C reader coded the entries by op already
            source = coded[0].source  # type: ignore[attr-defined]
            if coded[0].codes is source.op_codes:  # entries in the ring's order: ops numbered as they appear
                self.codes = source.op_codes
                values = {f: fields[f].uniques for f in names}  # type: ignore[attr-defined]
                digests = source.op_digests  # the ops in the C reader's order: its digests hold
            else:  # reordered by record id: renumbered by first appearance, as below
                codes, order = pd.factorize(coded[0].codes)  # type: ignore[attr-defined]
                self.codes = codes.astype(np.int64)
                values = {f: [fields[f].uniques[i] for i in order.tolist()] for f in names}  # type: ignore[attr-defined]
        else:
            per_row = list(zip(*(fields[f] for f in names), strict=True))
            codes, _ = pd.factorize(serialised_keys(per_row))
            self.codes = codes.astype(np.int64)
            first = first_rows(self.codes).tolist()
            values = {f: [fields[f][i] for i in first] for f in names}
        self.templates = _OpTemplates(values, groups, digests)

    def get(self, field: str) -> Sequence[Any] | None:
        return self.fields.get(field)

    def group_descs(self) -> dict[str, str]:
        return self.templates.descs


TEMPLATE_FIELDS = ("process_group", "pg_id", "profiling_name", "is_p2p", "input_sizes", "output_sizes",
                   "input_dtypes", "output_dtypes", "thread_name", "frames")


class _OpTemplates:
    """Each distinct op read once: its group, parsed name, peer, sizes, dtypes, call site. `digests`: the
    C reader's hash of each field's values over the ops (empty: none), under which columns are shared."""

    def __init__(self, values: dict[str, list[Any]], groups: list[GroupInfo], digests: dict[str, int] | None = None) -> None:
        self.values = values
        self.digests = digests or {}
        self.count = count = len(values["process_group"])
        pgs = values["process_group"]
        self.group = [str(p[0]) if isinstance(p, (list, tuple)) and p else "nan" for p in pgs]
        self.descs = {str(p[0]): str(p[1]) if len(p) > 1 else "" for p in pgs if isinstance(p, (list, tuple)) and p}
        self.group_id = _numbered(self.group)
        matches = [PROFILING_NAME.match("" if v is None else str(v)) for v in values["profiling_name"]]
        self.backend = [m.group("backend") if m else None for m in matches]
        self.named = [bool(m) for m in matches]
        self.op = [m.group("op") if m else "unknown" for m in matches]
        flagged = [str(v).lower() in ("true", "1", "1.0") for v in values.get("is_p2p", [False] * count)]
        self.is_p2p = np.asarray(
            [f or op in ("send", "recv") or bool(m and m.group("arrow")) for f, op, m in zip(flagged, self.op, matches, strict=True)],
            dtype=bool,
        )  # torchcomms: is_p2p always false
        self.peer = _global_peers(self.group, [m.group("b") if m else None for m in matches], self.is_p2p, groups)
        self.pair = _numbered(list(zip(self.group, self.op, self.peer.tolist(), strict=True)))
        uid = values.get("pg_id")
        self.uid = [str(u) for u in uid] if uid is not None else self.group  # pg_status's key (need not be the name)

    def columns(self) -> dict[str, Any]:
        """The per-op columns of the entry table (`count` rows each).

        Ranks of one role run the same ops, in groups of their own: each column that depends on some
        fields alone (sizes and dtypes on the name and sizes, call sites on the frames) is made once per
        reader process for equal values and shared (the same objects, so a batch also finishes them
        once, columns.expand_batch). The C reader's digests only find the candidate; the values
        themselves must be equal."""
        v, n = self.values, self.count
        payload = self._shared(PAYLOAD_FIELDS, self._payload)
        site, stack = self._shared(("frames",), lambda: _sites(v.get("frames"), n))
        thread = v.get("thread_name")
        from_torch_fr = self._shared((), lambda: np.full(n, "torch_fr", dtype=object))  # the api and the source
        return {
            "group": np.asarray(self.group, dtype=object),
            "kind": self._shared(("profiling_name", "is_p2p"), lambda: np.where(self.is_p2p, "p2p", "coll").astype(object)),
            "op": payload["op"],
            "api": from_torch_fr,
            "peer": self.peer,
            "in_shapes": payload["in_shapes"],
            "out_shapes": payload["out_shapes"],
            "in_dtypes": payload["in_dtypes"],
            "out_dtypes": payload["out_dtypes"],
            "is_async": np.zeros(n, dtype=bool),
            "thread": self._shared(("thread_name",), lambda: np.asarray(thread, dtype=object)) if thread is not None else None,
            "site": site,
            "stack": stack,
            "source": from_torch_fr,
        }

    def _shared(self, fields: tuple[str, ...], make: Callable[[], Any]) -> Any:
        """`make()`, or what it gave for another ring whose `fields` held equal values (same op count)."""
        digests = self.digests
        if not digests or not all(f in digests or f not in self.values for f in fields):
            return make()
        key = (fields, self.count, tuple(digests.get(f, 0) for f in fields))
        values = tuple(self.values.get(f) for f in fields)
        known = _SHARED.get(key)
        if known is not None and known[0] == values:
            return known[1]
        made = make()
        if len(_SHARED) >= SHARED_MAX:
            _SHARED.clear()
        _SHARED[key] = (values, made)
        return made

    def _payload(self) -> dict[str, Any]:
        v, n = self.values, self.count
        op = np.asarray(self.op, dtype=object)
        in_shapes = text_column(v.get("input_sizes", [None] * n))
        out_shapes = text_column(v.get("output_sizes", [None] * n))
        in_dtypes = text_column(v.get("input_dtypes", [None] * n), _torch_dtypes)
        out_dtypes = text_column(v.get("output_dtypes", [None] * n), _torch_dtypes)
        # a coalesced block's closing marker (`nccl:coalesced`, fr_trace's `ALLGATHER_coalesced` with `[[]]` sizes)
        # carries no tensors of its own: its empty sizes are not a payload to compare
        marker = np.char.endswith(op.astype(str), "coalesced") & _blank(in_shapes) & _blank(out_shapes)
        if marker.any():
            in_shapes, out_shapes, in_dtypes, out_dtypes = (_drop(c, marker) for c in (in_shapes, out_shapes, in_dtypes, out_dtypes))
        return {"op": op, "in_shapes": in_shapes, "out_shapes": out_shapes, "in_dtypes": in_dtypes, "out_dtypes": out_dtypes}


PAYLOAD_FIELDS = ("profiling_name", "input_sizes", "output_sizes", "input_dtypes", "output_dtypes")


_SHARED: dict[tuple[Any, ...], tuple[tuple[Any, ...], Any]] = {}
SHARED_MAX = 4096  # columns kept per reader process (a job has a few op sets per pipeline stage and role)


def _numbered(values: list[Any]) -> np.ndarray:
    """0..k-1 per distinct value, in order of first appearance (a few dozen ops: a dict beats pandas)."""
    index: dict[Any, int] = {}
    return np.asarray([index.setdefault(v, len(index)) for v in values], dtype=np.int64)


class _StateCodes:
    """The `state` field (`scheduled`, `started`, `completed`) factorised once."""

    def __init__(self, values: Sequence[Any] | None) -> None:
        if isinstance(values, CodedColumn):  # the C reader factorised it already
            self.codes = values.codes
            self.text = [str(u) for u in values.uniques]
            return
        arr = np.empty(len(values) if values is not None else 0, dtype=object)
        if values is not None:
            arr[:] = list(values)
        codes, uniques = pd.factorize(arr)
        self.codes = codes
        self.text = [str(u) for u in uniques]

    def any_event(self) -> bool:
        return any(t in ("started", "completed") for t in self.text)

    def completed(self) -> np.ndarray:
        table = np.asarray([t == "completed" for t in self.text] + [False], dtype=bool)
        return table[self.codes]

    def mapped(self) -> Coded:
        table = np.asarray([STATE_CATS.index(STATE_MAP.get(t, "unknown")) for t in self.text] + [UNKNOWN_STATE],
                           dtype=np.int32)
        return Coded(table[self.codes], STATE_CATS)


def _ints(values: Sequence[Any] | None, n: int) -> np.ndarray:
    """An id column as int64 (-1 where missing); JSON dumps and PyTorch's tests may give numbers as strings."""
    if values is None:
        return np.full(n, -1, dtype=np.int64)
    if _plain_ints(values, missing_ok=True):
        return np.where(values.missing, -1, values.values)  # type: ignore[attr-defined]
    try:
        return np.fromiter(values, dtype=np.int64, count=n)
    except (TypeError, ValueError, OverflowError):
        return pd.to_numeric(pd.Series(values, dtype=object), errors="coerce").fillna(-1).astype(np.int64).to_numpy()


def _plain_ints(values: Sequence[Any], missing_ok: bool = False) -> bool:
    """An integer column from the C reader (with no missing values unless `missing_ok`)."""
    return isinstance(values, ScalarColumn) and values.values.dtype == np.int64 and (
        missing_ok or not values.missing.any()
    )


def _flags(values: Sequence[Any]) -> np.ndarray:
    """A boolean field as bools (missing = False); hand-built JSON may spell them "true"/"1"."""
    if isinstance(values, ScalarColumn) and values.values.dtype == np.bool_:
        return values.values & ~values.missing
    try:
        plain = BOOLS.issuperset(values)
    except TypeError:
        plain = False
    if plain:
        return np.fromiter(values, dtype=bool, count=len(values))
    return np.asarray([str(v).lower() in ("true", "1", "1.0") for v in values], dtype=bool)


BOOLS = frozenset((True, False))


def _group_seq(
    raw: np.ndarray, group: np.ndarray, is_p2p: np.ndarray, recorder: str, wrapped: bool, notes: list[str]
) -> np.ndarray:
    """Per-group collective sequence numbers, from 1 (flightrec's 0 means "no sequence").

    PyTorch's NCCL/gloo and torch_npu count each group's collectives from 1. torchcomms counts every op of
    every communicator with one counter from 0, and PyTorch's own analyzer tests put ops at "0": those are
    renumbered so that a group's k-th collective is k on every rank (from the ids' order within the group,
    which holds while the ring has not wrapped; after a wrap the raw counter + 1 is the best left).
    """
    coll = ~is_p2p & (raw >= 0)
    seq = np.where(coll, raw, -1)
    if recorder != TORCHCOMMS and not bool(((raw == 0) & coll).any()):
        return seq
    if recorder == TORCHCOMMS and len(np.unique(group[coll])) > 1:
        if not wrapped:
            rows = np.flatnonzero(coll)
            seq[rows] = _dense_rank(group[rows], raw[rows])
            return seq
        notes.append(NOTE_TORCHCOMMS_SEQ)
    return np.where(coll, raw + 1, seq)


def _dense_rank(group: np.ndarray, value: np.ndarray) -> np.ndarray:
    """Rank (from 1, ties equal, no gaps) of each value among its group's values."""
    order = np.lexsort((value, group))
    g, v = group[order], value[order]
    first = np.ones(len(order), dtype=bool)
    first[1:] = g[1:] != g[:-1]
    new = first.copy()
    new[1:] |= v[1:] != v[:-1]
    count = np.cumsum(new)
    out = np.empty(len(order), dtype=np.int64)
    out[order] = count - count[first][np.cumsum(first) - 1] + 1
    return out


def _blank(coded: Coded) -> np.ndarray:
    """Rows whose size list is empty (`[]`, `[[]]`) or absent."""
    empty = np.asarray([c.replace(" ", "") in ("[]", "[[]]", "") for c in coded.cats] + [True], dtype=bool)
    return empty[np.where(coded.codes >= 0, coded.codes, len(coded.cats))]


def _drop(coded: Coded, rows: np.ndarray) -> Coded:
    """`coded` with the given rows set to missing."""
    return Coded(np.where(rows, -1, coded.codes).astype(coded.codes.dtype), coded.cats)


def _retired_state(ops: _Ops, op_id: np.ndarray, pg_status: dict[str, dict[str, int]] | None) -> Coded:
    """Without device events: an op is pending when not `retired`, or when pg_status has not seen it complete."""
    retired = ops.get("retired")
    pending = ~_flags(retired) if retired is not None else np.zeros(len(op_id), dtype=bool)
    if pg_status:  # keyed by the backend's pg uid (`pg_id`), which need not equal the group name
        last = [pg_status[u].get("last_completed_collective", -1) if u in pg_status else None for u in ops.templates.uid]
        known = np.asarray([x is not None for x in last], dtype=bool)[ops.codes]
        limit = np.asarray([x if x is not None else -1 for x in last], dtype=np.int64)[ops.codes]
        pending |= known & (op_id > limit)
    return Coded(np.where(pending, STATE_CATS.index(STARTED), STATE_CATS.index(COMPLETED)).astype(np.int32), STATE_CATS)


def _global_peers(group: list[str], local: list[str | None], is_p2p: np.ndarray, groups: list[GroupInfo]) -> np.ndarray:
    """Group-local peer numbers of `send a->b` / `recv a<-b` to global ranks (-1 when unknown), per op."""
    members = {g.name: _sorted_ranks(g.ranks) if g.ranks else None for g in groups}
    peer = np.full(len(group), -1, dtype=np.int64)
    for i, (name, b) in enumerate(zip(group, local, strict=True)):
        if not is_p2p[i] or b is None:
            continue
        ranks = members.get(name)
        if ranks:
            peer[i] = ranks[int(b)] if int(b) < len(ranks) else -1
        elif name in DEFAULT_GROUP_NAMES:
            peer[i] = int(b)
    return peer


def _sorted_ranks(ranks: tuple[int, ...]) -> tuple[int, ...]:
    """`ranks` sorted, once per member tuple: every rank's dump lists the world group's 16,384 members
    (the same tuple object for the same text, `_ranks_text`), and a reader sorts each only once."""
    known = _SORTED.get(id(ranks))
    if known is not None and known[0] is ranks:
        return known[1]
    if len(_SORTED) >= SHARED_MAX:
        _SORTED.clear()
    done = tuple(sorted(ranks))
    _SORTED[id(ranks)] = (ranks, done)  # the tuple is held: its id stays its own
    return done


_SORTED: dict[int, tuple[tuple[int, ...], tuple[int, ...]]] = {}


def _sites(frames: list[Any] | None, count: int) -> tuple[np.ndarray, np.ndarray]:
    """Call site (innermost frame outside torch) and stack (outermost first) per op."""
    site = np.empty(count, dtype=object)
    stack = np.empty(count, dtype=object)
    for i, fr in enumerate(frames or []):
        if not isinstance(fr, list) or not fr:
            continue
        lines = [f"{f.get('filename')}:{f.get('line')} in {f.get('name')}" for f in fr if isinstance(f, dict)]
        site[i] = next((ln for ln in lines if "/torch/" not in ln and "typing_extensions" not in ln),
                       lines[0] if lines else None)
        stack[i] = lines[::-1]
    return site, stack


def _ns(values: Sequence[Any] | None, n: int) -> Any:
    """Nanosecond column (Int64, never through a float: ns > 2^53); PyTorch writes 0 (JSON) or None
    (pickle) for 'not observed'."""
    if values is None:
        return pd.arrays.IntegerArray(np.zeros(n, dtype=np.int64), np.ones(n, dtype=bool))
    if _plain_ints(values, missing_ok=True):
        ints = values.values  # type: ignore[attr-defined]
        return pd.arrays.IntegerArray(ints.copy(), values.missing | (ints <= 0))  # type: ignore[attr-defined]
    try:  # no nulls: straight into numpy
        ints = np.fromiter(values, dtype=np.int64, count=n)
        return pd.arrays.IntegerArray(ints, ints <= 0)
    except (TypeError, ValueError, OverflowError):
        pass
    arr = np.empty(n, dtype=object)
    arr[:] = values
    missing = arr == None  # noqa: E711 - elementwise, in C
    try:
        ints = np.where(missing, 0, arr).astype(np.int64)
    except (TypeError, ValueError, OverflowError):  # text in hand-built JSON
        number = pd.to_numeric(pd.Series(arr), errors="coerce")
        missing = number.isna().to_numpy()
        ints = number.fillna(0).astype(np.int64).to_numpy()
    return pd.arrays.IntegerArray(ints, missing | (ints <= 0))


def _torch_dtypes(text: str) -> str:
    return ",".join(TORCH_DTYPE_NAMES.get(t, t) for t in dtype_text(text).split(",") if t)


