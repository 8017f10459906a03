"""Call sites in the user's code, for dumps whose recorder placed an op at a library frame.

Why: flightrec dumps from before 2026-12 (and ops issued where no user frame was on the stack) place
an FSDP2 op at `torch/utils/_contextlib.py:124 in decorate_context`, the same line for every op of the
job. Where the dump also holds a stack of that op (its entry's `stack`, FLIGHTREC_STACKS=1, or the
thread that is inside it now, `threads[].in_op`), the innermost frame of the user's code in that
stack is the line to act on. Library frames stay in the stacks, for `-v`.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .. import stackview
from .rankdump import RankDump


def to_user_sites(entries: pd.DataFrame, dumps: dict[int, RankDump]) -> pd.DataFrame:
    """`entries` with each library call site replaced by its stack's innermost user frame, where known."""
    if entries.empty or "site" not in entries.columns:
        return entries
    site = entries["site"]
    if not isinstance(site.dtype, pd.CategoricalDtype):
        return entries
    library = np.array([isinstance(c, str) and bool(c) and not stackview.is_user_frame(c) for c in site.cat.categories],
                       dtype=bool)
    codes = site.cat.codes.to_numpy()
    rows = np.flatnonzero((codes >= 0) & library[np.maximum(codes, 0)]) if library.any() else np.empty(0, dtype=np.int64)
    if rows.size == 0:
        return entries
    found = _from_entry_stacks(entries, rows) | _from_threads(entries, rows, dumps)
    if not found:
        return entries
    values = site.astype(object).to_numpy(copy=True)
    where = np.fromiter(found.keys(), dtype=np.int64, count=len(found))
    values[where] = np.array(list(found.values()), dtype=object)
    entries["site"] = pd.Categorical(values)
    return entries


def _from_entry_stacks(entries: pd.DataFrame, rows: np.ndarray) -> dict[int, str]:
    """Row position -> the innermost user frame of that entry's own stack (FLIGHTREC_STACKS=1)."""
    if "stack" not in entries.columns:
        return {}
    rows = rows[entries["stack"].notna().to_numpy()[rows]]  # only FLIGHTREC_STACKS=1 dumps have them
    out: dict[int, str] = {}
    seen: dict[tuple[str, ...], str | None] = {}  # a training loop repeats a few stacks
    for row, stack in zip(rows, entries["stack"].to_numpy()[rows], strict=True):
        key = tuple(str(f) for f in stack)
        if key not in seen:
            user = stackview.innermost_user(key)
            seen[key] = user[0] if user is not None else None
        if seen[key] is not None:
            out[int(row)] = seen[key]  # type: ignore[assignment]
    return out


def _from_threads(entries: pd.DataFrame, rows: np.ndarray, dumps: dict[int, RankDump]) -> dict[int, str]:
    """Row position -> the innermost user frame of the thread that is inside that op now (`in_op`: its
    id; -1, an op the C hot path does not name: that thread's newest pending op)."""
    inside: dict[tuple[int, int], str] = {}
    unnamed: dict[tuple[int, str], str] = {}
    for rank, dump in dumps.items():
        for t in dump.threads:
            op = t.get("in_op") if isinstance(t, dict) else None
            if not isinstance(op, int):
                continue
            user = stackview.innermost_user([str(f) for f in t.get("stack") or []])
            if user is not None and op >= 0:
                inside[(int(rank), op)] = user[0]
            elif user is not None:
                unnamed[(int(rank), str(t.get("name")))] = user[0]
    if unnamed:
        inside |= _newest_pending(entries, rows, unnamed)
    if not inside:
        return {}
    at = pd.MultiIndex.from_tuples(list(inside)).get_indexer(
        pd.MultiIndex.from_arrays([entries["rank"].to_numpy()[rows], entries["id"].to_numpy()[rows]]))
    hit = at >= 0
    values = np.array(list(inside.values()), dtype=object)
    return dict(zip(rows[hit].tolist(), values[at[hit]].tolist(), strict=True))


def _newest_pending(entries: pd.DataFrame, rows: np.ndarray, unnamed: dict[tuple[int, str], str]) -> dict[tuple[int, int], str]:
    """(rank, id) of each (rank, thread)'s newest pending op among `rows` -> that thread's user frame."""
    part = entries.iloc[rows][["rank", "id", "thread", "state"]]
    part = part.loc[part["state"].astype(str).isin(("started", "enqueued"))]
    if part.empty:
        return {}
    newest = part.assign(thread=part["thread"].astype(str)).groupby(["rank", "thread"], observed=True)["id"].max()
    return {(int(r), int(i)): unnamed[(int(r), t)] for (r, t), i in newest.items() if (int(r), t) in unnamed}
