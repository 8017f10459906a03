"""Reader for flightrec's own dumps (docs/dump-format.md).

Why: the dump is already column-oriented, so it becomes a DataFrame without a per-entry Python loop;
this module only validates the top level and turns lists (shapes, dtypes) into comparable text.
Text columns are dictionary-encoded (text is made once per distinct value, the codes go straight
into numpy), each distinct op is stored once in `templates`, and the integer columns are packed
into hex strings (flightrec/format/packed.py), so their numbers are never Python ints at all.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..constants import FMT_FLIGHTREC, MAX_RANKS, SUPPORTED_FLIGHTREC_SCHEMAS, TORCH_DTYPE_NAMES
from .codes import Coded, dtype_text, encode, recode, text_column
from .columns import Columns, Templated, expand_batch
from .dump_columns import split_templates, unpack
from .rankdump import DumpError, GroupInfo, RankDump
from .torch_fr_meta import parse_pg_status

FORMAT_TAG = "flightrec-dump"
REQUIRED_COLUMNS = ("id", "group", "seq", "kind", "op", "state")
PACKED_ENCODING = "delta"  # flightrec/format/packed.py: the recorder's writer (the analyzer does not import the recorder)
META_FIELDS = (
    "world_size",
    "local_rank",
    "host",
    "pid",
    "job_id",
    "launcher",
    "attempt",
    "store",
    "armed_wall_ns",
    "torch_version",
    "python_version",
    "flightrec_version",
    "backends",
    "reason",
    "reason_detail",
    "dump_time_ns",
    "clock",
    "capacity",
    "recorded",
    "dropped",
    "recorder_errors",
    "exception",
    "exit_record",
    "progress",
    "settings",
    "node_rank",
    "local_world_size",
    "graph_captured_ops",
    "not_recorded",
    "recovered",
)
NOTE_GRAPHS = ("collectives captured into CUDA graphs are recorded once, when captured: their replays run "
               "without the recorder seeing them, and they have no device times")


def is_flightrec(obj: Any) -> bool:
    """True for a decoded flightrec dump (checked by its `format` tag, not by the file name)."""
    return isinstance(obj, dict) and obj.get("format") == FORMAT_TAG


def parse(obj: dict[str, Any], file: str, rank_hint: int | None, lazy: bool = False) -> RankDump:
    """Validate and normalise one decoded flightrec dump. `lazy`: leave the entries as `Templated`
    (template columns not yet taken onto them) for a reader that expands a batch of ranks at once
    (columns.expand_batch)."""
    version = obj.get("schema_version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise DumpError(f"flightrec dump without an integer schema_version (got {version!r})")
    if version not in SUPPORTED_FLIGHTREC_SCHEMAS:
        *head, last = (str(v) for v in SUPPORTED_FLIGHTREC_SCHEMAS)
        readable = f"{', '.join(head)} and {last}" if head else last
        raise DumpError(f"unsupported flightrec schema_version {version} (this analyzer reads {readable})")
    rank = obj.get("rank")
    if not isinstance(rank, int) or rank < 0:
        if rank_hint is None:
            raise DumpError(f"dump has rank {rank!r} and the file name names no rank")
        rank = rank_hint
    world = obj.get("world_size")
    for what, value in (("rank", rank), ("world_size", world)):
        if isinstance(value, int) and value >= MAX_RANKS:
            raise DumpError(f"implausible {what} {str(value)[:24]} (more than {MAX_RANKS} ranks)")
    summary = "entries" not in obj and isinstance(obj.get("recent"), dict)
    body = obj["recent"] if summary else obj  # a summary read: its recent ops stand for the ring
    try:
        cols = _table(body, "entries")
        templates = _table(body, "templates")
    except ValueError as exc:
        raise DumpError(f"bad entries: {exc}") from None
    missing = [c for c in REQUIRED_COLUMNS if c not in cols and c not in templates]
    ids = cols.get("id")
    n = 0 if ids is None else len(ids)
    if missing and n:
        raise DumpError(f"entries lack column(s) {', '.join(missing)}")
    try:
        entries: Columns | Templated
        per_entry, table, which, count = split_templates(cols, templates, n)  # a lone file is a batch of one
        lengths = {len(v) for v in per_entry.values() if v is not None and not np.isscalar(v)} | ({n} if table else set())
        if len(lengths) > 1:  # as finish_columns says it
            raise ValueError(f"entry columns have different lengths {sorted(lengths)}")
        entries = Templated(rank, n, _normalise(per_entry), _normalise(table), which, count)
        if not lazy:
            entries = expand_batch([entries])
    except (ValueError, TypeError, IndexError) as exc:
        raise DumpError(f"bad entries: {exc}") from None

    groups = [_group(g) for g in obj.get("groups") or [] if isinstance(g, dict) and "name" in g]
    meta = {k: obj.get(k) for k in META_FIELDS}
    meta["version"] = f"flightrec {obj.get('flightrec_version')} schema {version}"
    meta["summary_only"] = summary
    recent = obj.get("recent")
    if not summary and isinstance(recent, dict) and isinstance(recent.get("entries"), dict):
        ids = recent["entries"].get("id")  # a sampled read keeps these rows (loader)
        try:
            meta["recent_ids"] = np.asarray(unpack(ids, "recent id") if _is_packed(ids) else ids, dtype=np.int64)
        except (ValueError, TypeError, DumpError):  # a damaged `recent`: a sampled read then keeps the whole ring
            meta["recent_ids"] = None
    first_ids = (entries.cols if isinstance(entries, Templated) else entries).get("id")
    meta["first_id"] = int(first_ids[0]) if first_ids is not None and len(first_ids) else None
    clock = obj.get("clock") if isinstance(obj.get("clock"), dict) else {}
    if isinstance(clock.get("wall_ns"), int) and isinstance(clock.get("mono_ns"), int):
        meta["wall_offset_ns"] = clock["wall_ns"] - clock["mono_ns"]  # entry times are monotonic
    torch_fr = obj.get("torch_fr") or {}
    pg_status = torch_fr.get("pg_status") if isinstance(torch_fr, dict) else None
    threads = [t for t in obj.get("threads") or [] if isinstance(t, dict)]
    return RankDump(
        rank=rank,
        file=file,
        fmt=FMT_FLIGHTREC,
        entries=entries,
        groups=groups,
        threads=threads,
        meta=meta,
        pg_status=parse_pg_status(pg_status),
        notes=([NOTE_GRAPHS] if isinstance(obj.get("graph_captured_ops"), int) and obj["graph_captured_ops"] > 0 else [])
        + _not_recorded_notes(obj),
    )


def _not_recorded_notes(obj: dict[str, Any]) -> list[str]:
    """The recorder's own word on what its torch release could not record (`not_recorded`), one note each."""
    losses = obj.get("not_recorded")
    if not isinstance(losses, list):
        return []
    torch_version = obj.get("torch_version") or "?"
    return [f"not recorded with torch {torch_version}: {x['what']} ({x.get('why', '')})" for x in losses
            if isinstance(x, dict) and isinstance(x.get("what"), str)]


def _table(obj: dict[str, Any], key: str) -> dict[str, Any]:
    """`entries` or `templates`: an object of columns, each an array, a packed integer array or a
    {values, codes} object (codes possibly packed); packed ones are unpacked here."""
    cols = obj.get(key)
    if not isinstance(cols, dict):
        raise DumpError(f"`{key}` is not an object of columns")
    not_lists = [str(k) for k, v in cols.items() if not isinstance(v, list) and not _is_coded(v) and not _is_packed(v)]
    if not_lists:
        raise DumpError(f"{key} column(s) {', '.join(not_lists[:5])[:120]} are not arrays, packed arrays or "
                        "{values, codes} objects")
    out = dict(cols)
    for name, value in cols.items():
        if _is_packed(value):
            out[name] = unpack(value, str(name))
        elif isinstance(value, dict) and _is_packed(value["codes"]):
            out[name] = {**value, "codes": unpack(value["codes"], str(name))}
    return out


def _is_packed(value: Any) -> bool:
    return isinstance(value, dict) and value.get("encoding") == PACKED_ENCODING


def _is_coded(value: Any) -> bool:
    return (isinstance(value, dict) and isinstance(value.get("values"), list)
            and (isinstance(value.get("codes"), list) or _is_packed(value.get("codes"))))


_DTYPE_TEXTS: dict[tuple[str, ...], Coded] = {}  # per reader process: dtype lists rewritten once (codes.recode)


def _normalise(cols: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {k: v for k, v in cols.items()}
    for name in ("in_shapes", "out_shapes"):
        if name in cols:
            out[name] = text_column(cols[name])
    for name in ("in_dtypes", "out_dtypes"):
        if name in cols:  # already coded: rewritten per distinct value
            out[name] = recode(encode(cols[name]), _dtypes, _DTYPE_TEXTS)
    return out


# per reader process, bounded below: (length, first, last) -> [(the list as read, its checked tuple)]
_MEMBERS_SEEN: dict[tuple[Any, ...], list[tuple[list[Any], tuple[int, ...]]]] = {}


def _members(ranks: list[Any], group: str) -> tuple[int, ...]:
    """Member ranks as ints, checked. The world group lists every rank in every dump: a list this
    process has already checked costs one list comparison (in C) and returns the same tuple, which
    the loader then shares without hashing it."""
    key = (len(ranks), ranks[0], ranks[-1])
    try:
        candidates = _MEMBERS_SEEN.setdefault(key, [])
    except TypeError:  # unhashable ends: not ranks
        raise DumpError(f"group {group[:40]!r} has implausible member ranks") from None
    for seen, members in candidates:
        if seen == ranks:
            return members
    arr = np.asarray(ranks)
    members = tuple(ranks) if arr.dtype.kind == "i" and arr.ndim == 1 else tuple(int(r) for r in ranks)
    if not (0 <= min(members) and max(members) < MAX_RANKS):
        raise DumpError(f"group {group[:40]!r} has implausible member ranks")
    if len(_MEMBERS_SEEN) > 4096:
        _MEMBERS_SEEN.clear()
    _MEMBERS_SEEN.setdefault(key, []).append((ranks, members))
    return members


_LOWER_DTYPES = {k.lower(): v for k, v in TORCH_DTYPE_NAMES.items()}


def _dtypes(text: str) -> str:
    """Python-side names (`float32`) stay; C++-side names (`float`, `long`) become torch dtype names."""
    return ",".join(_LOWER_DTYPES.get(t, t) for t in dtype_text(text).split(",") if t)


def _range_members(spec: dict[str, Any], group: str) -> range:
    """`{"start", "stop", "step"}` members (Python's range), checked. Kept a range until the loader
    shares it as a tuple (rankdump.SharedMembers): the world group of 131,072 ranks crosses from a
    reader process as three numbers, not as 131,072 ints per batch."""
    bounds = (spec.get("start"), spec.get("stop"), spec.get("step", 1))
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in bounds) or bounds[2] <= 0:
        raise DumpError(f"group {group[:40]!r} has a bad member range {str(spec)[:80]}")
    span = range(int(bounds[0]), int(bounds[1]), int(bounds[2]))
    if not span or span[0] < 0 or span[-1] >= MAX_RANKS:
        raise DumpError(f"group {group[:40]!r} has implausible member ranks")
    return span


def _group(g: dict[str, Any]) -> GroupInfo:
    ranks = g.get("ranks")
    name = str(g["name"])
    if isinstance(ranks, dict):
        members: tuple[int, ...] | range | None = _range_members(ranks, name)
    else:
        members = _members(ranks, name) if isinstance(ranks, list) and ranks else None
    return GroupInfo(name=name, desc=str(g.get("desc") or ""), backend=str(g.get("backend") or ""), ranks=members)


__all__ = ["is_flightrec", "parse"]
