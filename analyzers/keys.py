"""Integer keys over rows: several integer columns packed into one int64, numbered, deduplicated.

Why: grouping, factorising or sorting one int64 column is several times cheaper than doing it over
several columns, and the analysis keys (rank, group code, seq, peer) are small integers; a presence
table numbers a small key space without hashing tens of millions of rows.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd


def fits_int32(values: np.ndarray) -> bool:
    """Every value fits in 32 bits (an empty column does): ranks, sequence numbers, peers, instance
    ids, sent or kept in half the bytes of int64."""
    return not len(values) or (-(1 << 31) <= int(values.min()) and int(values.max()) < 1 << 31)


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


def first_rows(ids: np.ndarray) -> np.ndarray:
    """For ids 0..k-1 (as from `group_ids`), the index of each id's first row: one scattered min."""
    first = np.full(int(ids.max()) + 1 if len(ids) else 0, len(ids), dtype=np.int64)
    np.minimum.at(first, ids, np.arange(len(ids)))
    return first
