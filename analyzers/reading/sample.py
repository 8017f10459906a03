"""What a sampled read keeps of each ring, and the compute gap before each blocking op.

Why: at 131,072 ranks x 2,000 entries the entry table would hold 262 million rows (~60 GB). The hang
diagnosis needs each rank's recent ops (the dump's `recent`, flightrec/format/dump_file.py); the timing pass
needs a bounded sample of complete instances. Per channel (a group's collectives; one direction to one
peer) a rank keeps the blocking ops whose sequence number is a multiple of its stride, the power of two
that leaves about SAMPLE_PER_CHANNEL of them. Every member decides alone from its own count, and the
strides of two members differ by a power of two at most, so the multiples of the larger are kept by
all: those instances are complete, and spread evenly over the ring's time.

The gap before an op (the rank's own compute, what can make it late by itself) needs the ops before
it, so it is computed here on the whole ring and kept as a column (`gap_ns`). `weight` is the stride:
how many instances a kept one stands for (costs are sums, scaled by it); 0 for an op kept only because
it is recent.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..constants import MIN_LATE_MS
from ..keys import dense_ids
from .codes import Coded
from .columns import AllNull, Columns, take_rows

SAMPLE_PER_CHANNEL = 32  # timed instances kept per rank and channel (the error this adds: docs/scale.md)
# A gap between two blocking ops shorter than this is overhead, not compute: it could never make a
# rank late enough to count, and as an instance's shortest gap, scheduler noise of a loaded host
# (0.1-0.3 ms between a send and the next op) would credit every other member with its whole compute.
MIN_COMPUTE_NS = int(MIN_LATE_MS * 1e6)


def sample(table: Columns, recent: np.ndarray) -> tuple[Columns, np.ndarray]:
    """The rows of `table` (a batch of whole rings, rows by rank) to keep: the `recent` ones and the
    sampled blocking ops, with SAMPLE_COLUMNS added. Returns them and the boolean mask of kept rows."""
    n = len(table["rank"])
    rank, seq = np.asarray(table["rank"], dtype=np.int64), np.asarray(table["seq"], dtype=np.int64)
    enq, enq_known = _ints(table["t_enqueue_ns"], n)
    comp, comp_known = _ints(table["t_complete_ns"], n)
    completed = _is(table["state"], "completed", n)
    if "t_dev_start_ns" in table and "t_dev_end_ns" in table:  # timed on the device (timing/blocking_ops.device_times)
        dev_start, start_known = _ints(table["t_dev_start_ns"], n)
        dev_end, end_known = _ints(table["t_dev_end_ns"], n)
        on_device = start_known & end_known & completed
        if on_device.any():
            enq, comp = np.where(on_device, dev_start, enq), np.where(on_device, dev_end, comp)
            enq_known, comp_known = enq_known | on_device, comp_known | on_device
    is_coll, is_p2p = _is(table["kind"], "coll", n), _is(table["kind"], "p2p", n)
    is_async = np.asarray(table["is_async"], dtype=bool)
    blocking = (is_coll | is_p2p) & completed & (seq >= 0) & ~is_async & enq_known & comp_known
    rows = np.flatnonzero(blocking)
    r, e = rank[rows], enq[rows]
    if len(rows) > 1 and not bool(((np.diff(r) > 0) | ((np.diff(r) == 0) & (np.diff(e) >= 0))).all()):
        rows = rows[np.lexsort((e, r))]  # by rank, then enqueue time (record order usually is)
    gap = np.full(n, np.nan)
    gap[rows] = compute_gaps(rank[rows], enq[rows], comp[rows])
    send = _is(table["op"], "send", n)
    direction = np.where(is_p2p, np.where(send, 1, 2), 0)[rows]
    peer = np.where(is_p2p, np.asarray(table["peer"], dtype=np.int64), -1)[rows]
    group = np.asarray(table["group"].codes[rows], dtype=np.int64)  # a text column: Coded (columns.py)
    channel = dense_ids([rank[rows], group, direction, peer])
    count = np.bincount(channel) if len(channel) else np.zeros(0, dtype=np.int64)
    stride = (2 ** np.ceil(np.log2(np.maximum(count / SAMPLE_PER_CHANNEL, 1)))).astype(np.int64)[channel]
    taken = seq[rows] % stride == 0
    weight = np.zeros(n, dtype=np.int32)
    weight[rows[taken]] = stride[taken]
    keep = recent | (weight > 0)
    out = take_rows(table, keep)
    out["recent"], out["gap_ns"], out["weight"] = recent[keep], gap[keep], weight[keep]
    return out, keep


def _ints(column: object, n: int) -> tuple[np.ndarray, np.ndarray]:
    """A nullable integer column's values and where they are known (columns.nullable_ints' types)."""
    if isinstance(column, AllNull):
        return np.zeros(n, dtype=np.int64), np.zeros(n, dtype=bool)
    if isinstance(column, pd.arrays.IntegerArray):
        return column._data.astype(np.int64, copy=False), ~column._mask
    return np.asarray(column, dtype=np.int64), np.ones(n, dtype=bool)  # no nulls


def _is(column: object, value: str, n: int) -> np.ndarray:
    """`column == value` for a coded text column (on its codes)."""
    if isinstance(column, Coded):
        cats = list(column.cats)
        return column.codes == cats.index(value) if value in cats else np.zeros(n, dtype=bool)
    return np.asarray(column) == value


def compute_gaps(rank: np.ndarray, enq: np.ndarray, comp: np.ndarray) -> np.ndarray:
    """Each op's compute gap (ns; NaN for a rank's first op): rows by rank, then enqueue time."""
    starts = np.zeros(len(rank), dtype=np.int64)  # each row's first row of its rank
    if len(rank):
        cuts = np.flatnonzero(np.diff(rank)) + 1
        starts[cuts] = cuts
        starts = np.maximum.accumulate(starts)
    busy = _running_max(comp, starts)
    gap = np.empty(len(rank), dtype="float64")
    gap[0:1] = np.nan
    np.subtract(enq[1:], busy[:-1], out=gap[1:], casting="unsafe")
    gap[starts == np.arange(len(rank))] = np.nan  # a rank's first op: gap unknown
    # Back-to-back ops (a receive then a send) have no compute between them: such an op is
    # preceded by the rank's latest real compute, so that is the gap it is judged by.
    latest = np.full(len(gap), -1, dtype=np.int64)
    real = np.flatnonzero(gap >= MIN_COMPUTE_NS)
    latest[real] = real
    latest = np.maximum.accumulate(latest) if len(latest) else latest  # the latest real compute so far...
    own = latest >= starts  # ... on the same rank
    return np.where(own, gap[np.maximum(latest, 0)], gap)


def _running_max(values: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Cumulative max restarting at each rank's first row (`starts`): one accumulate over values
    lifted by segment, so no segment can see the one before it; a group-by when that overflows."""
    if not len(values):
        return values
    low, high = int(values.min()), int(values.max())
    segment = np.cumsum(starts == np.arange(len(starts))) - 1
    width = high - low + 1
    if width * (int(segment[-1]) + 1) >= 1 << 62:
        return pd.Series(values).groupby(segment, sort=False).cummax().to_numpy()
    lift = segment * width - low
    return np.maximum.accumulate(values + lift) - lift


