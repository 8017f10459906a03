"""The timed ops: each rank's completed blocking ops, with the compute gap before each.

Why its own module: it is the one pass of the timing that reads the entry table (~30 columns, tens of
millions of rows at 16k ranks), so it reads it a slice of whole ranks at a time (SLICE_ROWS) and writes
a narrow table everything after it works from (timing/lateness.py).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..keys import is_value
from ..reading.sample import compute_gaps
from .arrays import _codes, _gather, _narrow


def _ordered(rank: np.ndarray, t: np.ndarray) -> bool:
    """True when rows are already sorted by rank, then by time (checked in one pass, no sort)."""
    step_rank, step_t = np.diff(rank), np.diff(t)
    return bool(((step_rank > 0) | ((step_rank == 0) & (step_t >= 0))).all())


def device_times(entries: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """Ops timed on their device (NCCL, HCCL: `t_dev_start_ns`/`t_dev_end_ns`) are timed by those.

    On a stream backend the host's call returns before the op runs, and the op completes when a poll
    finds it done: its host times say neither when the rank arrived nor when it left (`t_complete_ns`
    is null). The device start event marks when the rank's stream reached the op (its arrival, after its
    own compute) and the end event when that stream could go on (for a blocking call, the op's end),
    both on the host's monotonic clock: the same pair a gloo op's enqueue and completion are. Returns
    the entries (a new frame only when some carry device times) and how many ops took them."""
    if entries.empty or "t_dev_end_ns" not in entries.columns or "t_dev_start_ns" not in entries.columns:
        return entries, 0
    start, end = entries["t_dev_start_ns"], entries["t_dev_end_ns"]
    timed = ~start.isna().to_numpy() & ~end.isna().to_numpy() & is_value(entries["state"], "completed")
    count = int(timed.sum())
    if not count:
        return entries, 0
    enq, comp = entries["t_enqueue_ns"].array.copy(), entries["t_complete_ns"].array.copy()
    enq[timed], comp[timed] = start.array[timed], end.array[timed]
    return entries.assign(t_enqueue_ns=enq, t_complete_ns=comp), count


def _blocking_ops(entries: pd.DataFrame) -> pd.DataFrame:
    """Completed blocking ops with timing, each with the compute gap before it on its own rank.

    The gap (enqueue minus the latest completion of the rank's earlier blocking ops, one clock) is
    the time the rank spent on its own work before arriving: what can make it late by itself.
    Built from numpy columns, a slice of whole ranks at a time (`_rank_slices`): at 16k ranks this
    table has tens of millions of rows, the entry table has ~30 columns it must not copy, and each
    full-length temporary would be a quarter of a gigabyte of fresh memory (slow to fault in on a VM).
    """
    is_coll, is_p2p = is_value(entries["kind"], "coll"), is_value(entries["kind"], "p2p")
    enq_col, comp_col = entries["t_enqueue_ns"], entries["t_complete_ns"]
    seq_all = _gather(entries["seq"])
    mask = ((is_coll | is_p2p) & is_value(entries["state"], "completed") & (seq_all >= 0)
            & ~entries["is_async"].to_numpy(dtype=bool, na_value=False)
            & ~enq_col.isna().to_numpy() & ~comp_col.isna().to_numpy())
    del is_coll
    rank_all, enq_all, comp_all = _gather(entries["rank"]), _values(enq_col), _values(comp_col)
    peer_all = _gather(entries["peer"]) if "peer" in entries.columns else np.full(len(entries), -1, dtype=np.int64)
    group_all, group_names = _codes(entries["group"])
    op_all, op_names = _codes(entries["op"])
    # a sampled read (reading/sample.py) brings each op's gap, taken on the whole ring, and its weight
    given_gap = entries["gap_ns"].to_numpy() if "gap_ns" in entries.columns else None
    weight_all = entries["weight"].to_numpy() if "weight" in entries.columns else None
    n = int(mask.sum())
    out = {"rank": np.empty(n, dtype=_narrow(rank_all)), "seq": np.empty(n, dtype=_narrow(seq_all)),
           "peer": np.empty(n, dtype=_narrow(peer_all)), "group": np.empty(n, dtype=group_all.dtype),
           "op": np.empty(n, dtype=op_all.dtype), "kind": np.empty(n, dtype=np.int8),
           "t_enqueue_ns": np.empty(n, dtype=np.int64), "t_complete_ns": np.empty(n, dtype=np.int64),
           "gap_ns": np.empty(n, dtype=np.float64)}
    gathered = [("seq", seq_all), ("peer", peer_all), ("group", group_all), ("op", op_all), ("kind", is_p2p)]
    if weight_all is not None:
        out["weight"] = np.empty(n, dtype=np.int32)
        gathered.append(("weight", weight_all))
    at = 0
    for a, b in _rank_slices(rank_all):
        rows = np.flatnonzero(mask[a:b]) + a
        rank, enq = rank_all[rows], enq_all[rows]
        if len(rows) > 1 and not _ordered(rank, enq):  # entries come by rank in record order: usually sorted
            order = np.lexsort((enq, rank))
            rows, rank, enq = rows[order], rank[order], enq[order]
        comp = comp_all[rows]
        done = slice(at, at + len(rows))
        out["gap_ns"][done] = given_gap[rows] if given_gap is not None else compute_gaps(rank, enq, comp)
        out["rank"][done], out["t_enqueue_ns"][done], out["t_complete_ns"][done] = rank, enq, comp
        for name, column in gathered:
            out[name][done] = column[rows]
        at += len(rows)
    # ranks, sequence numbers and peers in 32 bits where they fit, and no duration column (the
    # complete-and-enqueue difference, taken where it is used): at 16k ranks this table has ~30
    # million rows and is alive at the analysis' memory peak
    return pd.DataFrame({
        "rank": out["rank"],
        "group": pd.Categorical.from_codes(out["group"], categories=group_names),
        "seq": out["seq"],
        "kind": pd.Categorical.from_codes(out["kind"], categories=pd.Index(["coll", "p2p"], dtype=object)),
        "op": pd.Categorical.from_codes(out["op"], categories=op_names),
        "peer": out["peer"],
        "t_enqueue_ns": out["t_enqueue_ns"], "t_complete_ns": out["t_complete_ns"],
        "gap_ns": out["gap_ns"],
        **({"weight": out["weight"]} if weight_all is not None else {}),
    }, copy=False)


SLICE_ROWS = 1 << 20  # rows per slice of ranks: its temporaries (~8 MB each) come from the heap and are reused


def _rank_slices(rank: np.ndarray) -> list[tuple[int, int]]:
    """Row ranges of whole ranks, about SLICE_ROWS each (one range when rows are not by rank)."""
    n = len(rank)
    if n <= SLICE_ROWS or not bool((rank[1:] >= rank[:-1]).all()):
        return [(0, n)]
    cuts = np.searchsorted(rank, rank[np.arange(SLICE_ROWS, n, SLICE_ROWS)], side="left")
    bounds = [0, *sorted({int(c) for c in cuts} - {0}), n]
    return list(zip(bounds[:-1], bounds[1:], strict=True))


def _values(column: pd.Series) -> np.ndarray:
    """An Int64 column's values without copying them (nulls hold arbitrary values: mask them first)."""
    array = column.array
    if isinstance(array, pd.arrays.IntegerArray) and array.dtype == "Int64":
        return array._data
    return column.to_numpy(dtype="int64", na_value=0)
