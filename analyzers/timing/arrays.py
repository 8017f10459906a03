"""Column helpers the timing modules share.

Why: the timing pass reads tens of millions of rows at 16k ranks, so each of its modules takes integer
columns without whole-column copies, keeps them as narrow as their values allow, and reduces per id
in one scattered pass instead of a group-by; these are those few moves, written once.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..keys import fits_int32


def _gather(series: pd.Series, rows: np.ndarray | None = None, missing: int = -1) -> np.ndarray:
    """`rows` of an integer column as int64 (nulls as `missing`), without converting the whole
    column first: at scale each full-length temporary is a quarter of a gigabyte."""
    if series.dtype == np.int64:
        values = series.to_numpy()  # a view
        return values if rows is None else values[rows]
    array = series.array if rows is None else series.array.take(rows)
    return np.asarray(array.to_numpy(dtype="int64", na_value=missing))


def _int32(values: np.ndarray) -> np.ndarray:
    """`values` in 32 bits when they fit (ranks, sequence numbers, instance ids), else unchanged."""
    return values.astype(_narrow(values), copy=False)


def _codes(column: pd.Series) -> tuple[np.ndarray, pd.Index]:
    """A text column as integer codes and their labels (str), however it is stored."""
    cat = column.astype("category")
    return cat.cat.codes.to_numpy(), pd.Index([str(c) for c in cat.cat.categories], dtype=object)


def _narrow(values: np.ndarray) -> type:
    """int32 when every value fits (ranks, sequence numbers, peers), else int64."""
    return np.int32 if fits_int32(values) else np.int64


def _per_id(reduce: np.ufunc, ids: np.ndarray, values: np.ndarray) -> np.ndarray:
    """`reduce` (np.maximum, np.minimum, np.fmin) of `values` over the rows of each id, back on every
    row: a groupby-transform on small non-negative ids, as one scattered reduction."""
    out = np.zeros(int(ids.max()) + 1 if len(ids) else 0, dtype=values.dtype)
    out[ids] = values  # each id seeded with one of its members' own values (whichever write lands last)
    reduce.at(out, ids, values)
    return out[ids]
