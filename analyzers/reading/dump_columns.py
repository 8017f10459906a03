"""A flightrec dump's columns (docs/dump-format.md) decoded: dictionary-encoded and packed integer columns,
and the `templates` each entry points at, checked, into the entry table's column types.
"""

from __future__ import annotations

import binascii
from typing import Any

import numpy as np
import pandas as pd

from .codes import MEMO_LIMIT, dedupe
from .columns import OBJECT_COLUMNS, Columns

try:  # optional (flightrec[fast]): keys the template memo in one C call
    import orjson as _orjson
except ImportError:  # pragma: no cover - depends on the environment
    _orjson = None


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
        out[name] = dedupe(codes, texts)
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


_INT64_MIN, _INT64_MAX = int(np.iinfo(np.int64).min), int(np.iinfo(np.int64).max)
_PACKED_DTYPES = {name: np.dtype(name) for name in ("<i1", "<i2", "<i4", "<i8")}


def unpack(column: dict[str, Any], name: str) -> Any:
    """A packed integer column (flightrec/format/packed.py) as int64, in a few numpy calls:
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
