"""The normalised entry table: its columns, their dtypes, and how it is built column-wise.

Why: flightrec dumps and PyTorch's own recorder dumps are different shapes; both readers produce the
same columns so that matching and the wait graph never look at a file format. Strings are
categorical (millions of rows share a few hundred distinct ops, groups, shapes and call sites);
shape and dtype lists are stored as their text (`[[4], [2, 4]]`, `float32,float32`) so that they can
be compared, grouped and counted with vectorised pandas operations.

Each reader returns `Columns`: plain numpy arrays, and `Coded` (integer codes + distinct strings)
for the string columns. They are small to send back from a worker process, and one merge at the end
(`concat_entries`) unifies the codes of all ranks and builds the single DataFrame.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from ..keys import fits_int32
from ..memory import release_free_memory
from .codes import Coded, encode

CATEGORY_COLUMNS = (
    "group",
    "kind",
    "op",
    "api",
    "reduce_op",
    "in_shapes",
    "out_shapes",
    "in_dtypes",
    "out_dtypes",
    "state",
    "thread",
    "site",
    "source",
)


INT_COLUMNS = ("id", "seq", "pg_seq", "peer", "root", "unit")


NULLABLE_INT_COLUMNS = ("t_enqueue_ns", "t_complete_ns", "t_dev_start_ns", "t_dev_end_ns")


BOOL_COLUMNS = ("is_async",)


OBJECT_COLUMNS = ("error", "stack")


# Column order of `Analysis.entries` (rank first, then the dump format's order).
ENTRY_COLUMNS = (
    "rank",
    "id",
    "group",
    "seq",
    "pg_seq",
    "kind",
    "op",
    "api",
    "peer",
    "root",
    "reduce_op",
    "in_shapes",
    "out_shapes",
    "in_dtypes",
    "out_dtypes",
    "is_async",
    "unit",
    "state",
    "error",
    "t_enqueue_ns",
    "t_complete_ns",
    "t_dev_start_ns",
    "t_dev_end_ns",
    "thread",
    "site",
    "stack",
    "source",
)


# Added by a sampled read (sample.py): recent (bool), gap_ns (float), weight (int).
SAMPLE_COLUMNS = ("recent", "gap_ns", "weight")


WIDENED_COLUMNS = ("rank", *INT_COLUMNS)  # int64 in the table, sent between processes in 32 bits when they fit






_INT_DEFAULTS = {"id": 0, "seq": -1, "pg_seq": -1, "peer": -1, "root": -1, "unit": -1}


Columns = dict[str, Any]


@dataclass
class AllNull:
    """A column with every value null, as its length only: what readers send back for the columns a
    CPU job never fills (errors, stacks, device times), instead of arrays of nulls to pickle."""

    n: int

    def __len__(self) -> int:
        return self.n

    def real(self, name: str) -> Any:
        if name in NULLABLE_INT_COLUMNS:
            return pd.arrays.IntegerArray(np.zeros(self.n, dtype=np.int64), np.ones(self.n, dtype=bool))
        return np.empty(self.n, dtype=object)  # numpy fills an object array with None


def slim(cols: Columns) -> Columns:
    """The same columns, smaller to send between processes: all-null columns as `AllNull`, codes in
    the smallest integer type their categories allow, integer columns in 32 bits where they fit
    (a third of the bytes the parent receives at 16k ranks; `concat_columns` widens them back)."""
    out: Columns = {}
    for name, value in cols.items():
        if name in WIDENED_COLUMNS and isinstance(value, np.ndarray) and value.dtype == np.int64 and len(value):
            if fits_int32(value):
                value = value.astype(np.int32)
        elif isinstance(value, Coded):
            small = np.int8 if len(value.cats) < 127 else np.int16 if len(value.cats) < 32767 else np.int32
            value = Coded(value.codes.astype(small), value.cats)
        elif name in NULLABLE_INT_COLUMNS and isinstance(value, pd.arrays.IntegerArray) and bool(value.isna().all()):
            value = AllNull(len(value))
        elif name in OBJECT_COLUMNS and isinstance(value, np.ndarray) and bool((value == None).all()):  # noqa: E711
            value = AllNull(len(value))
        out[name] = value
    return out




def finish_columns(cols: Columns, rank: int) -> Columns:
    """Normalise one rank's columns to the table's types, filling absent ones with defaults."""
    lengths = {len(v) for v in cols.values() if v is not None and not np.isscalar(v)}
    if len(lengths) > 1:
        raise ValueError(f"entry columns have different lengths {sorted(lengths)}")
    n = lengths.pop() if lengths else 0
    out: Columns = {"rank": np.full(n, rank, dtype=np.int64)}
    for name in ENTRY_COLUMNS[1:]:
        out[name] = finish_column(name, cols.get(name), n)
    return out


def finish_column(name: str, raw: Any, n: int) -> Any:
    """One column (`n` rows; None: the dump lacks it) in the table's type, defaults filled in."""
    if name in CATEGORY_COLUMNS:
        return Coded(np.full(n, -1, dtype=np.int32), []) if raw is None else encode(raw)
    if name in INT_COLUMNS:
        return _int_column(_full(raw, n, _INT_DEFAULTS[name]), _INT_DEFAULTS[name])
    if raw is None and name in NULLABLE_INT_COLUMNS + OBJECT_COLUMNS:
        return AllNull(n)  # a column the dump lacks (device times on CPU, stacks): no array of nulls
    if name in NULLABLE_INT_COLUMNS:
        return nullable_ints(raw, n)
    if name in BOOL_COLUMNS:
        return _bool_column(raw, n)
    if isinstance(raw, np.ndarray) and raw.dtype == object:
        return raw
    return pd.Series(raw, dtype=object).to_numpy()


@dataclass
class Templated:
    """One rank's entries with its template columns not yet taken onto them.

    Why: taking ~15 template columns onto 2,000 entries, normalising ~30 columns and merging them
    cost a reader ~0.6 ms per file in per-column calls; a batch of ranks does each once for the
    whole batch (`expand_batch`), and ranks with equal template columns share them.
    """

    rank: int
    n: int
    cols: Columns  # the per-entry columns, decoded
    templates: Columns  # the template columns, decoded, `count` rows each
    which: np.ndarray  # each entry's template row
    count: int

    def __len__(self) -> int:
        return self.n


def expand_batch(parts: Sequence[Templated]) -> Columns:
    """The entry table of several ranks, as `concat_columns` of each one's `finish_columns` of its
    expanded templates gives it: template columns are finished (once per shared column), stacked,
    and taken onto all the entries in one step."""
    offsets = np.cumsum([0] + [p.count for p in parts])
    which = np.concatenate([p.which.astype(np.int64) + offset for p, offset in zip(parts, offsets, strict=False)]) \
        if parts else np.zeros(0, dtype=np.int64)
    ns = [p.n for p in parts]
    data: Columns = {"rank": np.repeat(np.asarray([p.rank for p in parts], dtype=np.int64), ns)}
    in_templates = set().union(*(p.templates for p in parts)) if parts else set()
    finished: dict[int, tuple[Any, Any]] = {}  # id of a shared template column -> (it, finished)

    def finish_shared(name: str, raw: Any, count: int) -> Any:
        if raw is None:
            return finish_column(name, None, count)
        known = finished.get(id(raw))
        if known is None:
            known = finished[id(raw)] = (raw, finish_column(name, raw, count))
        return known[1]

    for name in ENTRY_COLUMNS[1:]:
        if name in in_templates:
            table = concat_column(name, [finish_shared(name, p.templates.get(name), p.count) for p in parts])
            data[name] = _take_rows_of(table, which)
        elif any(name in p.cols for p in parts):
            data[name] = concat_column(name, [finish_column(name, p.cols.get(name), p.n) for p in parts])
        else:  # in no dump of the batch (root, unit on most): filled once, not once per rank
            data[name] = finish_column(name, None, len(which))
    return data


def _take_rows_of(column: Any, rows: np.ndarray) -> Any:
    if isinstance(column, AllNull):
        return AllNull(len(rows))
    if isinstance(column, Coded):
        return Coded(column.codes[rows], column.cats)
    if isinstance(column, pd.arrays.IntegerArray):
        return column.take(rows)
    return column[rows]


_BOOLS = frozenset((True, False))


def _bool_column(raw: Any, n: int) -> np.ndarray:
    if raw is None:
        return np.zeros(n, dtype=bool)
    if isinstance(raw, np.ndarray) and raw.dtype == bool:  # already a bool array (nothing to convert)
        return raw
    if isinstance(raw, list):
        try:
            plain = _BOOLS.issuperset(raw)  # true/false (or 1/0) only; checked in C
        except TypeError:  # unhashable values
            plain = False
        if plain:
            return np.fromiter(raw, dtype=bool, count=len(raw))
    return pd.Series(raw, dtype=object).fillna(False).astype(bool).to_numpy()


def nullable_ints(raw: Any, n: int) -> Any:
    """An Int64 column from a list with nulls; ints are taken in C, never through a float (ns > 2^53)."""
    if raw is None:
        return pd.arrays.IntegerArray(np.zeros(n, dtype=np.int64), np.ones(n, dtype=bool))
    if isinstance(raw, pd.arrays.IntegerArray) and raw.dtype == "Int64":
        return raw
    if isinstance(raw, np.ndarray) and raw.dtype == np.int64:  # unpacked: no nulls
        return pd.arrays.IntegerArray(raw, np.zeros(len(raw), dtype=bool))
    if isinstance(raw, list):
        try:  # the common case: no nulls, ints straight into numpy (a null raises TypeError)
            values = np.fromiter(raw, dtype=np.int64, count=len(raw))
        except (TypeError, ValueError, OverflowError):
            values = None
        if values is not None:
            return pd.arrays.IntegerArray(values, np.zeros(len(values), dtype=bool))
        arr = np.empty(len(raw), dtype=object)
        arr[:] = raw
        mask = arr == None  # noqa: E711 - elementwise, in C (pd.isna on objects is ~5x slower)
        filled = np.where(mask, 0, arr)
        try:
            values = filled.astype(np.int64)
            exact = bool((values == filled).all())
        except (TypeError, ValueError, OverflowError):
            exact = False
        if not exact:  # floats, text, huge numbers: pandas decides (and raises) as before
            return pd.array(raw, dtype="Int64")
        return pd.arrays.IntegerArray(values, mask)
    return pd.array(raw, dtype="Int64")


def _int_column(values: Any, default: int) -> np.ndarray:
    try:
        if isinstance(values, list):
            return np.fromiter(values, dtype=np.int64, count=len(values))
        return np.asarray(values, dtype=np.int64)
    except (TypeError, ValueError):  # None or odd values inside: the slow, forgiving path
        series = pd.to_numeric(pd.Series(values, dtype=object), errors="coerce")
        return series.fillna(default).astype(np.int64).to_numpy()


def _full(raw: Any, n: int, default: int) -> Any:
    return np.full(n, default, dtype=np.int64) if raw is None else raw


def concat_columns(parts: Sequence[Columns], consume: bool = False, trim: bool = True) -> Columns:
    """Several ranks' columns as one set of columns: string codes unified, arrays concatenated.

    `consume=True` empties the parts column by column as the result grows, so merging holds about
    one copy of the entries instead of two (`trim`: and hands the freed pages back to the OS). Worker processes use it to send one table per batch of
    files instead of one per rank (a few large arrays pickle at memory speed; 16,384 small ones
    made the parent process the bottleneck).
    """
    parts = [p for p in parts if p is not None] or [finish_columns({}, 0)]
    data: Columns = {}
    for name in ENTRY_COLUMNS:
        data[name] = concat_column(name, [p.pop(name) if consume else p[name] for p in parts])
        if consume and trim:
            release_free_memory()  # the pieces just freed are small heap blocks: hand their pages back
    return data


def concat_column(name: str, pieces: list[Any]) -> Any:
    """One column of several parts, joined: codes unified, arrays concatenated."""
    if all(isinstance(p, AllNull) for p in pieces):
        return AllNull(sum(len(p) for p in pieces))
    pieces = [p.real(name) if isinstance(p, AllNull) else p for p in pieces]
    if name in CATEGORY_COLUMNS:
        return _union(pieces)
    if name in NULLABLE_INT_COLUMNS:
        return _concat_nullable(pieces)
    if name in WIDENED_COLUMNS:  # sent in 32 bits by `slim`: the table keeps 64
        return np.concatenate(pieces, dtype=np.int64) if len(pieces) > 1 else pieces[0].astype(np.int64, copy=False)
    return np.concatenate(pieces) if len(pieces) > 1 else pieces[0]


def to_frame(cols: Columns) -> pd.DataFrame:
    """The entry table: string columns as pandas categoricals, columns in ENTRY_COLUMNS order."""
    data: dict[str, Any] = {}
    names = [*ENTRY_COLUMNS, *(n for n in SAMPLE_COLUMNS if n in cols)]
    for name in names:
        value = cols.pop(name)
        if isinstance(value, Coded):
            value = pd.Categorical.from_codes(value.codes, categories=pd.Index(value.cats, dtype=object))
        elif isinstance(value, AllNull):
            value = value.real(name)
        if isinstance(value, np.ndarray) and value.dtype == object:
            # typed up front: pandas would otherwise scan every row to infer a type (~0.5 s per
            # column at 16k ranks, where errors and stacks are usually all None)
            value = pd.Series(value, dtype=object, copy=False)
        data[name] = value
    # copy=False: the columns are fresh, and consolidating them into 2-D blocks would copy them all once more
    return pd.DataFrame(data, columns=names, copy=False)


def concat_entries(parts: Sequence[Columns], consume: bool = False) -> pd.DataFrame:
    """One DataFrame from per-rank (or per-batch) columns: codes unified once, each column built once."""
    return to_frame(concat_columns(parts, consume))


def take_rows(cols: Columns, keep: np.ndarray) -> Columns:
    """The rows of `cols` where `keep` (a boolean mask or an index array) selects them."""
    out: Columns = {}
    for name, value in cols.items():
        if isinstance(value, AllNull):
            out[name] = AllNull(int(keep.sum()) if keep.dtype == bool else len(keep))
        else:
            out[name] = Coded(value.codes[keep], value.cats) if isinstance(value, Coded) else value[keep]
    return out


def _concat_nullable(pieces: list[Any]) -> Any:
    """Int64 pieces joined as one array (values and masks concatenated, no Series per rank)."""
    arrays = [p if isinstance(p, pd.arrays.IntegerArray) else pd.array(p, dtype="Int64") for p in pieces]
    arrays = [a if a.dtype == "Int64" else a.astype("Int64") for a in arrays]
    return pd.arrays.IntegerArray._concat_same_type(arrays)


def _union(pieces: list[Coded]) -> Coded:
    index: dict[str, int] = {}
    codes = []
    remaps: dict[int, np.ndarray | None] = {}  # by id of a list of strings several pieces share (alive here)
    for piece in pieces:
        key = id(piece.cats)
        if key in remaps:
            remap = remaps[key]
        else:
            remap = np.asarray([index.setdefault(c, len(index)) for c in piece.cats] + [-1], dtype=np.int32)
            if bool((remap[:-1] == np.arange(len(remap) - 1)).all()):
                remap = None  # same codes in the union (the usual case): no per-row remap
            remaps[key] = remap
        codes.append(piece.codes if remap is None else remap[piece.codes])  # code -1 picks the trailing -1
    merged = np.concatenate(codes) if codes else np.empty(0, dtype=np.int32)
    return Coded(merged, list(index))


def empty_entries() -> pd.DataFrame:
    """An entry table with no rows but every column and dtype."""
    return concat_entries([finish_columns({}, 0)])
