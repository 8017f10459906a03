"""String columns as integer codes into their distinct strings (`Coded`), made without a per-row loop.

Why: millions of rows share a few hundred distinct ops, groups, shapes and call sites; each distinct
value is turned into text once, and rows carry a small integer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from ..keys import first_rows

try:  # optional: serialises list rows in C, so shapes and dtypes factorise without a per-row str()
    import orjson as _orjson
except ImportError:  # pragma: no cover - depends on the environment
    _orjson = None


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
    return dedupe(codes.astype(np.int32), [str(u) for u in uniques])


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
    return dedupe(np.asarray(codes, dtype=np.int32), cats)


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
    return dedupe(remap[codes], cats)


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
        return dedupe(coded.codes, [func(c) for c in coded.cats])
    key = tuple(coded.cats)
    table = memo.get(key)  # old code -> new code (`codes`), and the new strings
    if table is None:
        if len(memo) >= MEMO_LIMIT:
            memo.clear()
        table = memo[key] = dedupe(np.arange(len(key), dtype=np.int32), [func(c) for c in key])
    if bool((table.codes == np.arange(len(table.codes))).all()):
        return Coded(coded.codes, table.cats)
    return Coded(np.where(coded.codes >= 0, table.codes[np.clip(coded.codes, 0, None)], -1).astype(np.int32), table.cats)


def dedupe(codes: np.ndarray, cats: list[str]) -> Coded:
    """`codes` into `cats` with equal strings made one category (values whose text is the same)."""
    if len(set(cats)) == len(cats):
        return Coded(codes, cats)
    index: dict[str, int] = {}
    remap = np.asarray([index.setdefault(c, len(index)) for c in cats], dtype=np.int32)
    return Coded(np.where(codes >= 0, remap[np.clip(codes, 0, None)], -1).astype(np.int32), list(index))


def dtype_text(text: str) -> str:
    """`['float32', 'float32']` -> `float32,float32` (applied per distinct value)."""
    return text.strip("[]").replace("'", "").replace('"', "").replace(" ", "")


MEMO_LIMIT = 4096  # entries per reader-process memo before it starts over
