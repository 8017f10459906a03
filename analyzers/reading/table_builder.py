"""The entry table grown batch by batch, as the reader processes send their batches.

Why: at 16k ranks the table is ~3 GB. Holding every batch until all were read and then
concatenating them made the parent hold each row twice (the batches, then the table), with the
category codes widened to 32 bits on the way, and fresh memory is what costs most where these jobs
are analysed on virtual machines: each new page is a hypervisor fault (~3 s per GB measured on the
benchmark machine, more than decoding the dumps). Copying each batch into columns of the final
dtype as it arrives (codes in the smallest integer type their categories allow) touches each row's
bytes once, while the readers are still busy, and lets each batch's memory serve the next one.

Columns the builder cannot grow in place (object columns: error, stack; anything unexpected) keep
their pieces and are concatenated at the end, as `columns.concat_columns` does.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from .codes import Coded
from .columns import (
    ENTRY_COLUMNS,
    NULLABLE_INT_COLUMNS,
    OBJECT_COLUMNS,
    SAMPLE_COLUMNS,
    WIDENED_COLUMNS,
    AllNull,
    Columns,
    concat_column,
)

GROWTH = 1.25  # capacity added when a batch does not fit: the estimate from the first batch was short
CODE_TYPES = (np.int8, np.int16, np.int32)


class _Grown:
    """One numeric column of a fixed dtype with spare capacity at the end (never touched: untouched
    pages of a large allocation cost neither time nor resident memory)."""

    def __init__(self, dtype: Any, capacity: int) -> None:
        self.values = np.empty(capacity, dtype=dtype)

    def fits(self, piece: Any) -> bool:
        """An integer or bool array this column's dtype holds (a batch may send narrower ints)."""
        return isinstance(piece, np.ndarray) and piece.dtype.kind == self.values.dtype.kind \
            and np.can_cast(piece.dtype, self.values.dtype, casting="same_kind")

    def reserve(self, rows: int) -> None:
        if rows > len(self.values):
            # in place (realloc: a large block is remapped, not copied); the added tail is zero-filled
            self.values.resize(max(rows, math.ceil(len(self.values) * GROWTH)), refcheck=False)

    def put(self, start: int, piece: np.ndarray) -> None:
        self.values[start:start + len(piece)] = piece

    def retype(self, dtype: Any, filled: int) -> None:
        """The same column in a wider dtype: only the rows written so far are copied (and touched)."""
        wider = np.empty(len(self.values), dtype=dtype)
        wider[:filled] = self.values[:filled]
        self.values = wider

    def done(self, rows: int) -> np.ndarray:
        self.values.resize(rows, refcheck=False)  # the unused tail handed back, no copy
        return self.values


class _GrownCodes:
    """A category column: the union of every batch's categories, and codes in the narrowest type
    that holds them (a wider type only once the union outgrows it)."""

    def __init__(self, capacity: int) -> None:
        self.codes = _Grown(np.int8, capacity)
        self.index: dict[str, int] = {}
        self._remaps: dict[int, tuple[list[str], np.ndarray]] = {}  # by id of a batch's category list

    def fits(self, piece: Any) -> bool:
        return isinstance(piece, Coded)

    def reserve(self, rows: int) -> None:
        self.codes.reserve(rows)

    def put(self, start: int, piece: Coded) -> None:
        known = self._remaps.get(id(piece.cats))
        if known is not None and known[0] is piece.cats:
            remap = known[1]
        else:
            remap = np.asarray([self.index.setdefault(c, len(self.index)) for c in piece.cats] + [-1], dtype=np.int64)
            self._remaps[id(piece.cats)] = (piece.cats, remap)  # the list is held: its id stays its own
        self._widen(len(self.index), start)
        if bool((remap[:-1] == np.arange(len(remap) - 1)).all()):
            self.codes.put(start, piece.codes)  # the batch's codes are the union's (the usual case)
        else:
            self.codes.put(start, remap[piece.codes])  # code -1 picks the trailing -1

    def _widen(self, categories: int, filled: int) -> None:
        current = self.codes.values.dtype
        for dtype in CODE_TYPES:
            if categories <= np.iinfo(dtype).max:
                if np.dtype(dtype).itemsize > current.itemsize:
                    self.codes.retype(dtype, filled)
                return
        raise ValueError(f"more than {np.iinfo(np.int32).max} distinct values in one column")

    def done(self, rows: int) -> Coded:
        return Coded(self.codes.done(rows), list(self.index))


class _GrownNullable:
    """An Int64 column as its values and its mask (an all-null batch only marks its rows)."""

    def __init__(self, capacity: int) -> None:
        self.values = _Grown(np.int64, capacity)
        self.mask = _Grown(np.bool_, capacity)

    def fits(self, piece: Any) -> bool:
        return isinstance(piece, (pd.arrays.IntegerArray, AllNull))

    def reserve(self, rows: int) -> None:
        self.values.reserve(rows)
        self.mask.reserve(rows)

    def put(self, start: int, piece: Any) -> None:
        if isinstance(piece, AllNull):
            self.values.values[start:start + len(piece)] = 0
            self.mask.values[start:start + len(piece)] = True
            return
        array = piece if isinstance(piece, pd.arrays.IntegerArray) else pd.array(piece, dtype="Int64")
        self.values.put(start, array._data)
        self.mask.put(start, array._mask)

    def done(self, rows: int) -> Any:
        return pd.arrays.IntegerArray(self.values.done(rows), self.mask.done(rows))


class _Pieces:
    """A column kept as its batches' pieces, joined at the end (object columns, and any column whose
    pieces the builder cannot copy into one array)."""

    def __init__(self, name: str, pieces: list[Any] | None = None) -> None:
        self.name = name
        self.pieces = pieces or []

    def fits(self, piece: Any) -> bool:
        return True

    def reserve(self, rows: int) -> None:
        pass

    def put(self, start: int, piece: Any) -> None:
        self.pieces.append(piece)

    def done(self, rows: int) -> Any:
        return concat_column(self.name, self.pieces)


class TableBuilder:
    """Appends batches of columns (what `read_batch` sends) into one table; `finish` gives the columns
    `concat_columns` would have made of them, in the order they came."""

    def __init__(self) -> None:
        self.rows = 0
        self._batches = 1
        self._columns: dict[str, Any] = {}

    def expect(self, batches: int) -> None:
        """How many batches are coming (before the first is appended): the first one's size then
        sizes the columns for all."""
        self._batches = max(batches, 1)

    def append(self, cols: Columns) -> tuple[int, int]:
        """Copy one batch's columns in; returns its rows in the table (start, stop)."""
        n = len(cols["rank"])
        start, stop = self.rows, self.rows + n
        if not self._columns:  # a sampled read's batches carry SAMPLE_COLUMNS too (every batch, or none)
            self._columns = {name: self._column(name, cols[name], n) for name in (*ENTRY_COLUMNS, *SAMPLE_COLUMNS)
                             if name in cols}
        for name in self._columns:
            column, piece = self._columns[name], cols[name]
            if not column.fits(piece):
                column = self._columns[name] = self._as_pieces(name, column)
            column.reserve(stop)
            column.put(start, piece)
        self.rows = stop
        return start, stop

    def finish(self) -> Columns:
        """The table's columns (each column's spare capacity handed back); the builder is empty after."""
        columns, self._columns = self._columns, {}
        if not columns:
            return {}
        return {name: column.done(self.rows) for name, column in columns.items()}

    def _column(self, name: str, piece: Any, n: int) -> Any:
        capacity = math.ceil(n * self._batches * 1.05) + 1
        if isinstance(piece, Coded):
            return _GrownCodes(capacity)
        if name in NULLABLE_INT_COLUMNS and isinstance(piece, pd.arrays.IntegerArray):
            return _GrownNullable(capacity)
        # all-null so far (device times on CPU): stays a length unless a batch has values (then pieces)
        if name in OBJECT_COLUMNS or not isinstance(piece, np.ndarray) or piece.dtype.kind not in "biu":
            return _Pieces(name)
        return _Grown(np.int64 if name in WIDENED_COLUMNS else piece.dtype, capacity)

    def _as_pieces(self, name: str, column: Any) -> _Pieces:
        """A grown column turned back into pieces (its rows so far as the first one)."""
        return _Pieces(name, [column.done(self.rows)] if self.rows else [])
