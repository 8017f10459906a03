"""Integer columns of a dump packed as hex deltas (docs/dump-format.md, "Packed integer columns").

Why: a 2,000-entry dump is mostly integers (ids, sequence numbers, nanosecond timestamps). As JSON
numbers every reader must parse each one into a Python int and then copy it into an array: at
16,384 ranks that was most of the analyzer's reading time. Packed, a column is one hex string
that a reader turns into an array in one call, and the differences between neighbours (ids step by
1, timestamps by microseconds) compress better than the numbers themselves. Hex, not base64:
Python decodes it ~2.5x faster and, gzipped, it is no bigger (measured on the 16k synthetic dumps).
Each column is in the narrowest integer type its differences fit, counted from the column's first
value (`start`): a timestamp (~10^11 ns after boot) or an id in the millions does not force its
whole column into 8 or 4 bytes for the sake of its first entry.

Standard library only for the recorder, which packs inside training processes (`pack`), and for
any script that reads a dump without numpy (`unpack`); `pack_array` packs the same way with numpy,
imported when called, for writers of synthetic jobs of many thousands of ranks (fixtures/synth.py).
"""

from __future__ import annotations

import sys
from array import array
from itertools import accumulate
from typing import Any

ENCODING = "delta"
# array typecodes of exactly 1, 2, 4 and 8 bytes on every CPython platform, narrowest first
_TYPECODES = {"<i1": "b", "<i2": "h", "<i4": "i", "<i8": "q"}
_INT64 = (-(2**63), 2**63 - 1)
_RANGES = [(dtype, -(2 ** (8 * size - 1)), 2 ** (8 * size - 1) - 1) for dtype, size in (("<i1", 1), ("<i2", 2), ("<i4", 4))]


def packable(values: list[Any]) -> bool:
    """Ints and nulls only, at least one int (bool is not packed: it is no number to a JSON reader)."""
    return all(type(v) is int or v is None for v in values) and any(v is not None for v in values)


def pack(values: list[int | None]) -> dict[str, Any] | list[int | None]:
    """`{"encoding": "delta", "dtype": "<i1"|"<i2"|"<i4"|"<i8", "start": int, "data": hex, "nulls": [positions]}`.

    data holds each value minus the one before it (the first minus `start`, the first value: 0),
    little-endian, in the narrowest of those types that holds every difference (ids step by 1: one
    byte); a null is stored as a difference of 0 and listed in `nulls` (left out when there are
    none). Values whose differences do not fit 64 bits stay a plain array, which every reader also
    takes.
    """
    nulls = [i for i, v in enumerate(values) if v is None]
    first = next((v for v in values if v is not None), 0)
    if not _INT64[0] <= first <= _INT64[1]:  # a `start` readers could not hold: the plain array
        return values
    if nulls:
        filled: list[int] = []
        last = first  # a null repeats the value before it (a leading null: `start`)
        for v in values:
            last = last if v is None else v
            filled.append(last)
    else:
        filled = values  # type: ignore[assignment]
    deltas = [b - a for a, b in zip([first, *filled], filled, strict=False)]
    dtype = narrowest(min(deltas), max(deltas)) if deltas else "<i1"
    try:
        data = array(_TYPECODES[dtype], deltas)
    except OverflowError:
        return values
    if sys.byteorder == "big":
        data.byteswap()
    column: dict[str, Any] = {"encoding": ENCODING, "dtype": dtype, "data": data.tobytes().hex(), "start": first}
    if nulls:
        column["nulls"] = nulls
    return column


def pack_array(values: Any, nulls: Any = None) -> dict[str, Any]:
    """`pack` of an integer numpy array (`nulls`: a boolean mask of null positions), the same column
    `pack` writes for the same values, computed with numpy (imported here: the recorder never calls it)."""
    import numpy as np

    values = np.asarray(values, dtype=np.int64)
    null_at = np.flatnonzero(nulls) if nulls is not None else np.zeros(0, dtype=np.int64)
    known = values if nulls is None else values[~np.asarray(nulls, dtype=bool)]
    first = int(known[0]) if len(known) else 0
    if len(null_at):  # a null repeats the value before it (a difference of 0; a leading null: `start`)
        last = np.maximum.accumulate(np.where(nulls, -1, np.arange(len(values))))
        values = np.where(last >= 0, values[np.maximum(last, 0)], first)
    deltas = np.diff(values, prepend=first)
    dtype = narrowest(int(deltas.min()), int(deltas.max())) if len(deltas) else "<i1"
    column: dict[str, Any] = {"encoding": ENCODING, "dtype": dtype, "data": deltas.astype(dtype).tobytes().hex(),
                              "start": first}
    if len(null_at):
        column["nulls"] = null_at.tolist()
    return column


def narrowest(low: int, high: int) -> str:
    """The narrowest packed dtype that holds every integer in [low, high] (`<i8` beyond 32 bits)."""
    return next((dtype for dtype, lo, hi in _RANGES if lo <= low and high <= hi), "<i8")


def is_packed(column: Any) -> bool:
    return isinstance(column, dict) and column.get("encoding") == ENCODING and "data" in column


def unpack(column: dict[str, Any]) -> list[int | None]:
    """The plain list back (standard library; the analyzer decodes with numpy instead)."""
    data = array(_TYPECODES[column["dtype"]])
    data.frombytes(bytes.fromhex(column["data"]))
    if sys.byteorder == "big":
        data.byteswap()
    values: list[int | None] = list(accumulate(data, initial=column.get("start", 0)))[1:]
    for i in column.get("nulls") or ():
        values[i] = None
    return values


def plain(column: Any) -> Any:
    """Any dump column as plain values: packed arrays (and packed codes of a dictionary-encoded
    column) unpacked, everything else as it is."""
    if is_packed(column):
        return unpack(column)
    if isinstance(column, dict) and is_packed(column.get("codes")):
        return {**column, "codes": unpack(column["codes"])}
    return column
