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

import binascii
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from .memory import release_free_memory

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

try:  # optional: serialises list rows in C, so shapes and dtypes factorise without a per-row str()
    import orjson as _orjson
except ImportError:  # pragma: no cover - depends on the environment
    _orjson = None

WIDENED_COLUMNS = ("rank", *INT_COLUMNS)  # int64 in the table, sent between processes in 32 bits when they fit
_INT32_MIN, _INT32_MAX = int(np.iinfo(np.int32).min), int(np.iinfo(np.int32).max)
_INT64_MIN, _INT64_MAX = int(np.iinfo(np.int64).min), int(np.iinfo(np.int64).max)
_INT_DEFAULTS = {"id": 0, "seq": -1, "pg_seq": -1, "peer": -1, "root": -1, "unit": -1}

Columns = dict[str, Any]


@dataclass
class Coded:
    """A string column as int32 codes (-1 = missing) into `cats`, a list of distinct strings."""

    codes: np.ndarray
    cats: list[str]

    def __len__(self) -> int:
        return len(self.codes)

    def values(self) -> np.ndarray:
        """The strings (None where missing), for the few places that need them per row."""
        table = np.asarray([*self.cats, None], dtype=object)
        return table[self.codes]


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
            if _INT32_MIN <= int(value.min()) and int(value.max()) <= _INT32_MAX:
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


def encode(values: Any) -> Coded:
    """Factorise a column of str (or lists: shapes, dtypes) into codes and distinct strings.

    The per-row work happens inside numpy/pandas; `str` of each distinct value is taken once, and
    values whose text collides (1 and "1") share one code.
    """
    if isinstance(values, Coded):
        return values
    if len(values) <= SMALL_COLUMN:
        return _encode_small(list(values))
    arr = values.astype(object) if isinstance(values, np.ndarray) else pd.Series(values, dtype=object).to_numpy()
    try:
        codes, uniques = pd.factorize(arr)
    except TypeError:  # unhashable rows (lists: shapes, dtypes)
        return _encode_unhashable(arr)
    return _dedupe(codes.astype(np.int32), [str(u) for u in uniques])


SMALL_COLUMN = 256  # below this many rows a dict beats pandas' fixed cost (a reader's per-op columns)


def _encode_small(values: list[Any]) -> Coded:
    """`encode` of a short column, with the same results: missing values (None, NaN, NA) coded -1,
    unhashable ones (lists) keyed and written as their JSON form."""
    try:
        keys: list[Any] = [None if _missing(v) else v for v in values]
        index: dict[Any, int] = {}
        codes = [index.setdefault(k, len(index)) if k is not None else -1 for k in keys]
        cats = [str(k) for k in index]
    except TypeError:  # a list among them: every row keyed by its serialised form, as the large path does
        arr = np.empty(len(values), dtype=object)
        for i, v in enumerate(values):  # element by element: numpy would read equal-length lists as a 2-D array
            arr[i] = v
        return _encode_unhashable(arr)
    return _dedupe(np.asarray(codes, dtype=np.int32), cats)


def _missing(value: Any) -> bool:
    return value is None or value is pd.NA or (isinstance(value, float) and value != value)


def _encode_unhashable(arr: np.ndarray) -> Coded:
    """Factorise rows by their serialised bytes (C speed), then take `str` of each distinct value once
    (of its JSON form where orjson made the key, so that a tuple and a list of equal items read alike)."""
    keys = serialised_keys(arr)
    codes, uniques = pd.factorize(keys)
    codes = codes.astype(np.int32)
    firsts = first_rows(codes) if len(codes) else np.zeros(0, dtype=np.int64)
    cats: list[str] = []
    remap = np.empty(len(uniques) + 1, dtype=np.int32)
    remap[-1] = -1
    for i, key in enumerate(uniques):
        value = _orjson.loads(key) if isinstance(key, bytes) else arr[firsts[i]]
        if value is None or (isinstance(value, float) and value != value):  # null / NaN: missing
            remap[i] = -1
        else:
            remap[i] = len(cats)
            cats.append(str(value))
    return _dedupe(remap[codes], cats)


_CUT = "\x00"  # serialised as `"\u0000"`
_CUT_TEXT = b',"\\u0000",'


def serialised_keys(values: Any) -> np.ndarray:
    """One hashable key per row of unhashable values (lists, dicts), equal values getting equal keys.

    With orjson, the whole column is serialised in one call, a NUL string after each value, and cut
    at those: ~5x cheaper than a call per row, whose fixed cost dominates small values. A value
    holding that same text only adds cuts: the count no longer matches and the per-row path decides.
    """
    rows = values if isinstance(values, list) else list(values)
    if _orjson is not None and rows:
        spaced = [_CUT] * (2 * len(rows))
        spaced[::2] = rows
        try:
            text = _orjson.dumps(spaced)
        except TypeError:
            text = b""
        parts = (text[1:-1] + b",").split(_CUT_TEXT)
        if len(parts) == len(rows) + 1 and not parts[-1]:
            keys = np.empty(len(rows), dtype=object)
            keys[:] = parts[:-1]
            return keys
    return np.fromiter(map(repr, rows), dtype=object, count=len(rows))


def text_column(values: Any, rewrite: Callable[[str], str] | None = None) -> Coded:
    """Lists (shapes, dtypes) as text; `rewrite` reformats each *distinct* text once."""
    coded = encode(values)
    return recode(coded, rewrite) if rewrite is not None else coded


def recode(coded: Coded, func: Callable[[str], str], memo: dict[tuple[str, ...], Coded] | None = None) -> Coded:
    """Apply `func` to each distinct string (not to each row). `memo` keeps the result per list of
    strings, so that ranks with the same strings share one rewritten list (and the merge's union
    of categories treats it once)."""
    if memo is None:
        return _dedupe(coded.codes, [func(c) for c in coded.cats])
    key = tuple(coded.cats)
    table = memo.get(key)  # old code -> new code (`codes`), and the new strings
    if table is None:
        if len(memo) >= MEMO_LIMIT:
            memo.clear()
        table = memo[key] = _dedupe(np.arange(len(key), dtype=np.int32), [func(c) for c in key])
    if bool((table.codes == np.arange(len(table.codes))).all()):
        return Coded(coded.codes, table.cats)
    return Coded(np.where(coded.codes >= 0, table.codes[np.clip(coded.codes, 0, None)], -1).astype(np.int32), table.cats)


def _dedupe(codes: np.ndarray, cats: list[str]) -> Coded:
    if len(set(cats)) == len(cats):
        return Coded(codes, cats)
    index: dict[str, int] = {}
    remap = np.asarray([index.setdefault(c, len(index)) for c in cats], dtype=np.int32)
    return Coded(np.where(codes >= 0, remap[np.clip(codes, 0, None)], -1).astype(np.int32), list(index))


def dtype_text(text: str) -> str:
    """`['float32', 'float32']` -> `float32,float32` (applied per distinct value)."""
    return text.strip("[]").replace("'", "").replace('"', "").replace(" ", "")


def decode_coded(cols: dict[str, Any], n: int) -> Columns:
    """Dictionary-encoded columns (`{"values": [...], "codes": [...]}`) as `Coded`, or as object arrays
    for the free-text columns; plain arrays pass through."""
    out: Columns = {}
    for name, raw in cols.items():
        if not isinstance(raw, dict):
            out[name] = raw
            continue
        values = raw["values"]
        codes = _code_array(raw["codes"], name)
        if len(codes) != n:
            raise ValueError(f"column {name!r} has {codes.size} codes for {n} entries")
        if len(codes) and (int(codes.min()) < -1 or int(codes.max()) >= len(values)):
            raise ValueError(f"column {name!r} has codes outside its {len(values)} values")
        if name in OBJECT_COLUMNS:
            table = np.empty(len(values) + 1, dtype=object)
            table[:-1] = values
            out[name] = table[codes]  # code -1 picks the trailing None
            continue
        nulls = [i for i, v in enumerate(values) if v is None]
        texts = [str(v) for v in values]
        if nulls:  # a null listed among the values: its rows are missing
            remap = np.arange(len(values) + 1, dtype=np.int32)
            remap[nulls] = -1
            remap[-1] = -1
            codes = remap[codes]
        out[name] = _dedupe(codes, texts)
    return out


def split_templates(cols: dict[str, Any], templates: dict[str, Any], n: int) -> tuple[Columns, Columns, np.ndarray, int]:
    """A dump's entries and templates, checked and decoded but not yet taken onto the entries: the per-entry columns, the
    template columns (`count` rows each), and each entry's template row (`which`)."""
    both = sorted(set(cols) & set(templates) - {"template"})
    if both:
        raise ValueError(f"column(s) {', '.join(both[:5])} both in entries and in templates")
    lengths = {len(v["codes"]) if isinstance(v, dict) else len(v) for v in templates.values()}
    if len(lengths) > 1:
        raise ValueError(f"template columns have different lengths {sorted(lengths)}")
    count = lengths.pop() if lengths else 0
    raw = cols.get("template")
    if raw is None:
        if n and templates:
            raise ValueError("entries have no `template` column")
        raw = []
    if not isinstance(raw, list | np.ndarray):
        raise ValueError("column 'template' is not an array")
    which = _code_array(raw, "template")
    if len(which) != n:
        raise ValueError(f"column 'template' has {len(which)} codes for {n} entries")
    if n and templates and (int(which.min()) < 0 or int(which.max()) >= count):
        raise ValueError(f"column 'template' has codes outside its {count} templates")
    return decode_coded({k: v for k, v in cols.items() if k != "template"}, n), _decode_templates(templates, count), which, count


MEMO_LIMIT = 4096  # entries per reader-process memo before it starts over
_TEMPLATE_MEMO: dict[tuple[str, int, bytes], Any] = {}


def _decode_templates(templates: dict[str, Any], count: int) -> Columns:
    """`decode_coded` of a templates table, each column remembered by its content. Ranks of one role
    have the same ops, so a reader decodes each distinct column once, and the ranks' columns share one
    list of strings: the merge then unions each shared list once instead of once per rank. The
    decoded values are shared, so nothing downstream may change them in place."""
    if _orjson is None:
        return decode_coded(templates, count)
    out: Columns = {}
    for name, raw in templates.items():
        try:
            key = (name, count, _orjson.dumps(raw, option=_orjson.OPT_SERIALIZE_NUMPY))
        except TypeError:  # something orjson cannot serialise: decoded (and checked) without the memo
            out.update(decode_coded({name: raw}, count))
            continue
        value = _TEMPLATE_MEMO.get(key)
        if value is None:
            value = decode_coded({name: raw}, count)[name]
            if len(_TEMPLATE_MEMO) >= MEMO_LIMIT:
                _TEMPLATE_MEMO.clear()
            _TEMPLATE_MEMO[key] = value
        out[name] = value
    return out


_PACKED_DTYPES = {name: np.dtype(name) for name in ("<i1", "<i2", "<i4", "<i8")}


def unpack(column: dict[str, Any], name: str) -> Any:
    """A packed integer column (flightrec/packed.py) as int64, in a few numpy calls:
    hex bytes of little-endian differences, summed from `start`; `nulls`
    positions masked (an Int64 array)."""
    dtype = _PACKED_DTYPES.get(column.get("dtype"))  # type: ignore[arg-type]
    data = column.get("data")
    if dtype is None or not isinstance(data, str):
        raise ValueError(f"column {name!r} is packed with dtype {str(column.get('dtype'))[:20]!r} "
                         f"(expected one of {', '.join(_PACKED_DTYPES)}) or without hex data")
    try:
        raw = binascii.unhexlify(data)  # ~1.4x faster than bytes.fromhex (which also skips spaces)
    except (binascii.Error, ValueError):
        raise ValueError(f"column {name!r} has packed data that is not hex") from None
    if len(raw) % dtype.itemsize:
        raise ValueError(f"column {name!r} has {len(raw)} packed bytes, not a whole number of {dtype.itemsize}-byte values")
    start = column.get("start", 0)
    if type(start) is not int or not _INT64_MIN <= start <= _INT64_MAX:
        raise ValueError(f"column {name!r} has a packed start {str(start)[:24]!r} that is not a 64-bit integer")
    values = np.cumsum(np.frombuffer(raw, dtype=dtype), dtype=np.int64)
    if start:
        values += start
    nulls = column.get("nulls")
    if not nulls:
        return values
    try:
        at = np.asarray(nulls, dtype=np.int64)
        mask = np.zeros(len(values), dtype=bool)
        mask[at] = True
    except (TypeError, ValueError, IndexError):
        raise ValueError(f"column {name!r} lists nulls that are not positions among its {len(values)} values") from None
    return pd.arrays.IntegerArray(values, mask)


def _code_array(raw: Any, name: str) -> np.ndarray:
    """Codes straight into int32 (`fromiter` with a fixed dtype skips numpy's type discovery: ~2x
    faster than `asarray` on the ~20 lists of every dump); packed codes arrive as an array."""
    if isinstance(raw, np.ndarray):
        if len(raw) and (int(raw.min()) < np.iinfo(np.int32).min or int(raw.max()) > np.iinfo(np.int32).max):
            raise ValueError(f"column {name!r} has codes outside any list of values")
        return raw.astype(np.int32)
    if not isinstance(raw, list):
        raise ValueError(f"column {name!r} has codes that are not integers")
    try:
        return np.fromiter(raw, dtype=np.int32, count=len(raw))
    except OverflowError:
        raise ValueError(f"column {name!r} has codes outside any list of values") from None
    except TypeError:
        raise ValueError(f"column {name!r} has codes that are not integers") from None


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
    for name in ENTRY_COLUMNS:
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
    return pd.DataFrame(data, columns=list(ENTRY_COLUMNS), copy=False)


def concat_entries(parts: Sequence[Columns], consume: bool = False) -> pd.DataFrame:
    """One DataFrame from per-rank (or per-batch) columns: codes unified once, each column built once."""
    return to_frame(concat_columns(parts, consume))


def column_range(column: np.ndarray) -> tuple[int, int]:
    """(lowest value, number of values from lowest to highest) of an integer column; (0, 1) if empty."""
    if not len(column):
        return 0, 1
    low = int(column.min())
    return low, int(column.max()) - low + 1


def pack_keys(columns: Sequence[np.ndarray], ranges: Sequence[tuple[int, int]] | None = None) -> np.ndarray | None:
    """One int64 per row that is equal exactly when every one of the integer `columns` is (mixed
    radix over each column's range, first column most significant), or None when the ranges do not
    fit in 62 bits. `ranges`: each column's `column_range`, when the caller has them already.

    Why: grouping, factorising or sorting one int64 column is several times cheaper than doing it
    over several columns, and the analysis keys (rank, group code, seq, peer) are small integers.
    """
    key: np.ndarray | None = None
    span = 1
    for i, column in enumerate(columns):
        low, width = ranges[i] if ranges is not None else column_range(column)
        span *= width
        if span >= 1 << 62:
            return None
        if key is None:
            key = column.astype(np.int64)  # a copy: the steps below work in place
        else:
            key *= width
            key += column
        if low:
            key -= low
    return key if key is not None else np.zeros(0, dtype=np.int64)


def group_ids(columns: Sequence[np.ndarray], sort: bool = False) -> np.ndarray:
    """0..k-1 per distinct row of the integer `columns`: numbered in order of first appearance, or
    (`sort`) in order of the rows' values, first column first. One packed key factorised once; a
    multi-column group-by when the key does not fit."""
    key = pack_keys(columns)
    if key is None:
        frame = pd.DataFrame({str(i): c for i, c in enumerate(columns)})
        return frame.groupby(list(frame.columns), sort=sort).ngroup().to_numpy()
    return pd.factorize(key, sort=sort)[0]


def dense_ids(columns: list[np.ndarray]) -> np.ndarray:
    """0..k-1 per distinct row of the integer `columns`, in key order. When the packed key space is
    small next to the rows (a collective's group and seq), a presence table numbers them without
    hashing (a hash table over tens of millions of rows costs seconds and a gigabyte)."""
    key = pack_keys(columns)
    if key is None or not len(key):
        return group_ids(columns, sort=True)
    span = int(key.max()) + 1
    if span > 2 * len(key) or span >= 1 << 31:
        return pd.factorize(key, sort=True)[0]
    present = np.zeros(span, dtype=bool)
    present[key] = True
    number = np.cumsum(present, dtype=np.int32)
    number -= 1
    return number[key].astype(np.int64)


PRESENCE_LIMIT = 1 << 28  # cells of a presence table (bytes): ~270 MB at most, freed at once


def distinct_rows(columns: Sequence[np.ndarray]) -> list[np.ndarray] | None:
    """The distinct rows of the integer `columns`, sorted (first column first), as one array per
    column; None when their packed key space is too large for a presence table.

    Why: at 16k ranks the distinct (rank, group) pairs are ~100k among 30 million rows; marking
    each row's packed key in a table of flags and reading the set flags back costs two passes
    over the rows, where hashing them (`group_ids`) costs a hash table sized for all of them."""
    if not len(columns[0]):
        return [c[:0].astype(np.int64) for c in columns]
    ranges = [column_range(c) for c in columns]
    span = 1
    for _, width in ranges:
        span *= width  # Python ints: no overflow on the way to the limit
    if span > PRESENCE_LIMIT:
        return None
    present = np.zeros(span, dtype=bool)
    present[pack_keys(columns, ranges)] = True  # fits: span is far below 2**62
    flat = np.flatnonzero(present)
    out: list[np.ndarray] = []
    for low, width in reversed(ranges):
        out.append(flat % width + low)
        flat //= width
    return out[::-1]


def ids_within_ranks(rank: np.ndarray, other: np.ndarray, sort: bool = False, pieces: int = 16) -> np.ndarray:
    """`group_ids([rank, other], sort)`. Rows sorted by rank (the usual case) are hashed a slice of
    ranks at a time, since a pair never spans two slices: one hash table over tens of millions of
    rows is sized for all of them, a gigabyte at 16k ranks."""
    if not len(rank):
        return np.zeros(0, dtype=np.int64)
    if not bool((np.diff(rank) >= 0).all()):
        return group_ids([rank, other], sort=sort)
    bounds = np.searchsorted(rank, np.linspace(rank[0], rank[-1] + 1, pieces + 1)[1:-1], side="left")
    out = np.empty(len(rank), dtype=np.int64)
    base = 0
    for lo, hi in zip(np.concatenate([[0], bounds]), np.concatenate([bounds, [len(rank)]]), strict=True):
        if hi > lo:
            ids = group_ids([rank[lo:hi], other[lo:hi]], sort=sort)
            out[lo:hi] = ids + base
            base += int(ids.max()) + 1
    return out


def is_value(column: pd.Series, value: str) -> np.ndarray:
    """`column == value` for a categorical column, compared on its codes (no string per row)."""
    if isinstance(column.dtype, pd.CategoricalDtype):
        found = column.cat.categories.get_indexer([value])[0]
        return column.cat.codes.to_numpy() == found if found >= 0 else np.zeros(len(column), dtype=bool)
    return (column == value).to_numpy(dtype=bool, na_value=False)


TRANSFER_KEY = ("group", "src", "dst", "seq")


@dataclass
class Transfers:
    """Every send of the entry table matched to its receive, as two row positions per pair.

    Why one object: the payload check (matching) and the link timing (stragglers) need the same
    join, which at 16k ranks in a pipeline is millions of rows and a second or more per join.
    """

    send: np.ndarray  # row positions in the entry table
    recv: np.ndarray

    def __len__(self) -> int:
        return len(self.send)


def pair_transfers(entries: pd.DataFrame) -> Transfers:
    """Each send (kind p2p, op send, known peer and seq) joined to its receive on (group, src, dst,
    seq): one packed int64 key when it fits, several times cheaper than merging on four columns."""
    if "peer" not in entries.columns or entries.empty:
        return Transfers(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
    seq, peer = entries["seq"].to_numpy(), entries["peer"].to_numpy()
    rows = np.flatnonzero(is_value(entries["kind"], "p2p") & (seq > 0) & (peer >= 0))
    if not len(rows):
        return Transfers(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
    is_send = is_value(entries["op"], "send")[rows]
    rank, peer = entries["rank"].to_numpy()[rows], peer[rows]
    table = pd.DataFrame({
        "group": pd.Categorical(entries["group"]).codes[rows], "seq": seq[rows],
        "src": np.where(is_send, rank, peer), "dst": np.where(is_send, peer, rank), "row": rows,
    })
    packed = pack_keys([table[c].to_numpy() for c in TRANSFER_KEY])
    if packed is not None:
        pairs = _join_on_unique(packed[is_send], packed[~is_send])
        if pairs is not None:
            return Transfers(rows[is_send][pairs[0]], rows[~is_send][pairs[1]])
    on = ["key"] if packed is not None else list(TRANSFER_KEY)
    if packed is not None:
        table = table[["row"]].assign(key=packed)
    pairs = table[is_send].merge(table.loc[~is_send, [*on, "row"]], on=on, suffixes=("_s", "_r"))
    return Transfers(pairs["row_s"].to_numpy(), pairs["row_r"].to_numpy())


def _join_on_unique(left: np.ndarray, right: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Inner join of two int64 key arrays as (left positions, right positions), in left order (as
    pandas' merge gives), by sorting `right` and searching it: no hash table over millions of keys.
    None when a key repeats in `right` (the caller then merges)."""
    order = np.argsort(right, kind="stable")
    ordered = right[order]
    if len(ordered) > 1 and bool((ordered[1:] == ordered[:-1]).any()):
        return None
    at = np.minimum(np.searchsorted(ordered, left), max(len(ordered) - 1, 0))
    hit = np.flatnonzero(ordered[at] == left) if len(ordered) else np.zeros(0, dtype=np.int64)
    return hit, order[at[hit]]


def first_rows(ids: np.ndarray) -> np.ndarray:
    """For ids 0..k-1 (as from `group_ids`), the index of each id's first row: one scattered min."""
    first = np.full(int(ids.max()) + 1 if len(ids) else 0, len(ids), dtype=np.int64)
    np.minimum.at(first, ids, np.arange(len(ids)))
    return first


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
