"""`flightrec export`: the unified entry table and the group table as Parquet files.

Why Parquet: a postmortem of a thousand-rank job is millions of rows; Parquet keeps the dtypes
(categorical strings, nullable integers, lists of stack frames) so `pandas.read_parquet` gives back
the same table the analyzer used, with its derived columns (docs/postmortem.md), in a fraction of
the time it takes to parse the dumps again.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from ..analysis import Analysis
from . import postmortem

EXPORT_SCHEMA = "flightrec-export/1"
META_KEY = b"flightrec"


@dataclass
class Exported:
    """What `export` wrote: the two files and their row counts."""

    entries_path: Path
    groups_path: Path
    entries: int
    groups: int


def groups_path_for(out: str | os.PathLike[str]) -> Path:
    """`trace.parquet` -> `trace.groups.parquet` (next to it; `.parquet` is added if missing)."""
    path = Path(out)
    stem = path.name[: -len(".parquet")] if path.name.endswith(".parquet") else path.name
    return path.with_name(f"{stem}.groups.parquet")


def group_table(a: Analysis) -> pd.DataFrame:
    """The group table with `ranks` as plain lists (Parquet list<int64>)."""
    groups = a.groups.copy()
    groups["group"] = groups["group"].astype(str)
    groups["ranks"] = [list(map(int, r)) for r in groups["ranks"]]
    groups["size"] = groups["size"].astype("int64")
    return groups


def export(a: Analysis, out: str | os.PathLike[str]) -> Exported:
    """Write the entries (with derived columns) to `out` and the groups next to it."""
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {"schema": EXPORT_SCHEMA, "folder": str(a.folder), "verdict": a.verdict, "summary": a.summary()}
    entries = as_list_columns(postmortem.entries(a).reset_index(drop=True))
    groups = group_table(a)
    groups_path = groups_path_for(path)
    _write(entries, path, meta | {"table": "entries"})
    _write(groups, groups_path, meta | {"table": "groups"})
    return Exported(path, groups_path, len(entries), len(groups))


SHAPE_COLUMNS = ("in_shapes", "out_shapes")
DTYPE_COLUMNS = ("in_dtypes", "out_dtypes")


def as_list_columns(entries: pd.DataFrame) -> pd.DataFrame:
    """Shapes as list<list<int64>> (one list of dimensions per tensor) and dtypes as list<string>, not
    text of Python lists: what a notebook filters and compares on. Each distinct value is parsed once."""
    out = entries.copy(deep=False)
    for name in SHAPE_COLUMNS:
        if name in out.columns:
            out[name] = _parsed(out[name], _shapes)
    for name in DTYPE_COLUMNS:
        if name in out.columns:
            out[name] = _parsed(out[name], _dtypes)
    return out


def _parsed(column: pd.Series, parse: Callable[[str], list | None]) -> pd.Series:
    codes, uniques = pd.factorize(column.astype(object), use_na_sentinel=True)
    table = np.empty(len(uniques) + 1, dtype=object)
    table[:-1] = [parse(str(u)) for u in uniques]
    table[-1] = None
    return pd.Series(table[codes], index=column.index, dtype=object)


def _shapes(text: str) -> list[list[int]] | None:
    """`[[2, 8], [4]]` -> [[2, 8], [4]]; anything else (a format that wrote no shapes) -> None."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if isinstance(value, list) and all(isinstance(t, list) and all(isinstance(d, int) for d in t) for t in value):
        return value
    return None


def _dtypes(text: str) -> list[str] | None:
    """`float32,int64` -> ["float32", "int64"]; empty -> None."""
    parts = [p for p in text.split(",") if p]
    return parts or None


def read_metadata(path: str | os.PathLike[str]) -> dict[str, str]:
    """The export's own metadata (schema, folder, verdict, summary, table) of a written file."""
    raw = pq.read_schema(path).metadata or {}
    return json.loads(raw.get(META_KEY, b"{}"))


def _write(frame: pd.DataFrame, path: Path, meta: dict[str, str]) -> None:
    table = pa.Table.from_pandas(frame, preserve_index=False)
    for i, column in enumerate(table.schema):  # an all-null categorical would come back as object
        if pa.types.is_dictionary(column.type) and pa.types.is_null(column.type.value_type):
            table = table.set_column(i, column.name, table.column(i).cast(pa.dictionary(pa.int32(), pa.string())))
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), META_KEY: json.dumps(meta).encode()})
    tmp = path.with_name(f".{path.name}.tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, path)
