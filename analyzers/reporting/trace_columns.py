"""The entry table's columns as the trace reads them: nullable integers without a float on the way,
strings and codes through a categorical's categories (not per row), nanoseconds as microseconds.

Why apart: every part of the trace (placement, op text, markers) reads columns the same way, and
exactness here is what keeps wall-clock nanoseconds (~1.8e18) from being rounded.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd


def ints(column: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """A nullable integer column as (int64 values with 0 where null, mask of the non-null): no float
    on the way, wall-clock nanoseconds (~1.8e18) do not fit a float's 53 bits."""
    values = pd.array(column, dtype="Int64")
    present = ~values.isna()
    return values.to_numpy(dtype=np.int64, na_value=0), np.asarray(present, dtype=bool)


def strings(column: pd.Series, rows: np.ndarray) -> list[Any]:
    """The values of a categorical (or object) column at `rows` as Python str (None where missing),
    through its codes: one str per category, not per row."""
    if isinstance(column.dtype, pd.CategoricalDtype):
        table = np.asarray([*map(str, column.cat.categories), None], dtype=object)
        codes = column.cat.codes.to_numpy()[rows]
        return table[codes].tolist()  # code -1 picks the trailing None
    values = column.to_numpy(dtype=object)[rows]
    return [None if v is None or v != v else str(v) for v in values.tolist()]


def codes(column: pd.Series, rows: np.ndarray) -> np.ndarray:
    """Integer codes of a categorical column at `rows` (-1 = missing); an object column is factorised."""
    if isinstance(column.dtype, pd.CategoricalDtype):
        return column.cat.codes.to_numpy()[rows].astype(np.int64)
    return pd.factorize(column.to_numpy(dtype=object)[rows])[0].astype(np.int64)


def us(ns: int) -> float:
    """Nanoseconds as microseconds (the format's unit), exact to the nanosecond."""
    return ns / 1000
