"""PyTorch flight-recorder pickles decoded straight into columns by the optional C decoder.

Why: unpickling a 2,000-entry ring into Python dicts and taking it apart field by field is most of
the time flightrec spends on a PyTorch-format job at 16,384 ranks. `_pickle_columns` (built with the
package when a C compiler is there) walks the pickle's opcodes into a compact tree and hands back
one column per entry field plus one code per distinct op. It admits exactly what safe_pickle admits
and returns None for anything else, so the restricted Python unpickler stays the reference: it
decides every file the C decoder declines, and explains what is wrong with it.

The columns behave as read-only sequences (what the Python path's per-field tuples are), so code
written for those still works; read_torch_fr reads their arrays directly where it can (a
ScalarColumn's values and missing mask, a CodedColumn's codes, the op codes).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from .. import testing

try:
    from .. import _pickle_columns as _c
except ImportError:  # no compiler at install time, or FLIGHTREC_BUILD_C=0: the Python unpickler reads
    _c = None



def available() -> bool:
    return _c is not None and not testing.PYTHON_UNPICKLER_ONLY


class Column(Sequence[Any]):
    """A field of every entry; indexing gives the value the Python unpickler would have given."""

    def __len__(self) -> int:
        raise NotImplementedError

    def tolist(self) -> list[Any]:
        raise NotImplementedError

    def take(self, order: np.ndarray) -> Column:
        raise NotImplementedError

    def __getitem__(self, i: Any) -> Any:
        return self.tolist()[i]

    def __iter__(self) -> Iterator[Any]:
        return iter(self.tolist())


class ScalarColumn(Column):
    """int, bool or float values with a missing mask (None, or the field absent from the entry)."""

    def __init__(self, values: np.ndarray, missing: np.ndarray) -> None:
        self.values = values
        self.missing = missing

    def __len__(self) -> int:
        return len(self.values)

    def tolist(self) -> list[Any]:
        out = np.asarray(self.values.tolist(), dtype=object)
        out[self.missing] = None
        return out.tolist()

    def take(self, order: np.ndarray) -> ScalarColumn:
        return ScalarColumn(self.values[order], self.missing[order])


class CodedColumn(Column):
    """Any other values: each row's code into the distinct values (-1: None or absent)."""

    def __init__(self, codes: np.ndarray, uniques: list[Any]) -> None:
        self.codes = codes
        self.uniques = uniques

    def __len__(self) -> int:
        return len(self.codes)

    def tolist(self) -> list[Any]:
        table = np.empty(len(self.uniques) + 1, dtype=object)
        table[:-1] = self.uniques
        return table[self.codes].tolist()

    def take(self, order: np.ndarray) -> CodedColumn:
        return CodedColumn(self.codes[order], self.uniques)


class OpColumn(CodedColumn):
    """An op field (group, name, sizes, ...): coded by the entry's op, so every op field of one ring
    shares its codes (`source` tells which ring's ops they are, through reordering)."""

    def __init__(self, codes: np.ndarray, uniques: list[Any], source: object) -> None:
        super().__init__(codes, uniques)
        self.source = source

    def take(self, order: np.ndarray) -> OpColumn:
        return OpColumn(self.codes[order], self.uniques, self.source)


class ColumnarEntries:
    """A ring's `entries` as columns: `fields` (name -> Column) for the per-entry fields, and for the
    op fields (group, name, sizes, dtypes, frames...) one code per entry (`op_codes`, numbered by first
    appearance) and each distinct op's values (`op_values`: name -> one value per op). `op_digests`: per
    op field, a hash of its values over the ops, so that rings whose ops hold the same values can share
    what is derived from them (a hint only: equal digests must still be checked by comparing values)."""

    def __init__(self, n: int, names: list[str], fields: dict[str, Column], op_codes: np.ndarray,
                 op_values: dict[str, list[Any]], op_digests: dict[str, int] | None = None) -> None:
        self.n = n
        self.op_digests = op_digests or {}
        self.names = names
        self.fields = fields
        self.op_codes = op_codes
        self.op_values = op_values

    def __len__(self) -> int:
        return self.n

    def column(self, name: str) -> Column:
        """Any field, op fields included (as a coded column over the ops)."""
        if name in self.op_values:
            return OpColumn(self.op_codes, self.op_values[name], self)
        return self.fields[name]


def decode(data: bytes, op_fields: tuple[str, ...]) -> dict[str, Any] | None:
    """The pickle's top-level dict with `entries` as ColumnarEntries (when it is a list of records), or
    None when the C decoder is absent or declines: then the restricted Python unpickler must read it."""
    if not available():
        return None
    got = _c.decode(data, op_fields)  # type: ignore[union-attr]
    if got is None:
        return None
    top, entries = got
    if entries is not None:
        n, names, raw, codes, op_values, digests = entries
        fields = {name: _column(spec, n) for name, spec in raw.items()}
        top["entries"] = ColumnarEntries(n, names, fields, np.frombuffer(codes, dtype=np.int32).astype(np.int64),
                                         op_values, digests)
    return top


def _column(spec: tuple[Any, ...], n: int) -> Column:
    kind, a, b = spec
    if kind == "c":
        return CodedColumn(np.frombuffer(a, dtype=np.int32).astype(np.int64), b)
    dtype = {"i": np.int64, "f": np.float64, "b": np.bool_}[kind]
    return ScalarColumn(np.frombuffer(a, dtype=dtype), np.frombuffer(b, dtype=np.bool_))
