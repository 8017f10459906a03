"""Where each op lies on the timeline: measured times only (docs/timeline.md).

An op is a slice from its measured start to its measured end, or to its rank's dump time when it was
still pending then; an op whose end was not recorded is an instant at its start; an op without a
measured start (a C++-issued op whose times were only polled by the watchdog) is left out and
counted. Ops that overlap on one rank go to extra lanes, so that a viewer nests nothing wrongly.

Why apart: this is the one place that decides what is drawn and when; the text of the events, the
markers and the arrows only read the result.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..analysis import Analysis
from ..constants import PENDING_STATES
from ..keys import is_value
from .trace_columns import ints
from .trace_tracks import tid

END_PENDING = "the rank's dump time: the op was still pending when the rank dumped"
END_NOT_RECORDED = "not recorded in this dump: start only"
END_PENDING_UNDATED = "still pending when the rank dumped; the dump does not say when that was: start only"
END_NOTES = (END_PENDING, END_NOT_RECORDED, END_PENDING_UNDATED)


@dataclass
class Ops:
    """The drawn ops, one row each, in output order, with positions back into the entry table."""

    row: np.ndarray  # position in pm.entries(a)
    rank: np.ndarray
    ts: np.ndarray  # ns since t0
    dur: np.ndarray  # ns; 0 for instants
    instant: np.ndarray  # bool
    lane: np.ndarray
    end_note: np.ndarray  # object: None, END_PENDING, END_NOT_RECORDED or END_PENDING_UNDATED
    tid: np.ndarray  # the op's thread: its rank's lane


@dataclass(frozen=True)
class Counts:
    """What was drawn as what, and what was left out (the file's metadata and the CLI's line)."""

    slices: int  # measured start and end
    pending: int  # measured start, drawn to the dump time
    instants: int  # start only
    left_out: int  # no measured start
    no_wall_clock: int  # of those: a monotonic start the dump gives no wall-clock offset for
    left_out_ranks: list[int]
    older: int  # before each rank's `last_ops` newest entries


@dataclass
class Placement:
    """The drawn ops, their time origin and the facts the rest of the trace is placed by."""

    ops: Ops
    t0: int  # wall-clock ns that ts 0 stands for
    dump_at: dict[int, int]  # rank -> its dump's wall-clock time (ranks whose dump says it)
    lanes: dict[int, int]  # rank -> its highest lane (ranks with a drawn op)
    counts: Counts


def place_ops(a: Analysis, df: pd.DataFrame, ranks: list[int], last_ops: int | None) -> Placement:
    """Place the ops of the entry table `df` of `a` (ranks: every rank drawn); `last_ops`: only each
    rank's newest N entries."""
    rank = df["rank"].to_numpy().astype(np.int64)
    start, has_start = ints(df["t_enqueue_wall_ns"])
    end, has_end = ints(df["t_complete_wall_ns"])
    has_end &= has_start & (end >= start)
    pending = np.logical_or.reduce([is_value(df["state"], state) for state in PENDING_STATES])
    dump_at, dated = _dump_times(a, max(ranks, default=-1) + 1)
    pend_slice = pending & has_start & ~has_end & dated[rank] & (dump_at[rank] >= start)
    recent = _recent(df, last_ops)
    closed = has_end & has_start & recent
    pend_slice &= recent
    drawn = has_start & recent
    instant = drawn & ~closed & ~pend_slice
    unmeasured = ~has_start & recent
    stop = np.where(closed, end, np.where(pend_slice, dump_at[rank], start))
    dumped = {r: int(dump_at[r]) for r in np.flatnonzero(dated).tolist()}
    t0 = _t0(start[drawn], dumped)
    rows = np.flatnonzero(drawn)
    note = _end_notes(pend_slice, instant, pending)
    ts = start[rows] - t0
    dur = stop[rows] - start[rows]
    lane = _lanes(rank[rows], ts, dur, instant[rows])
    order = np.lexsort((-dur, ts))  # by start, the longer first: a viewer nests nothing wrongly
    rows = rows[order]
    ops = Ops(row=rows, rank=rank[rows], ts=ts[order], dur=dur[order], instant=instant[rows], lane=lane[order],
              end_note=note[rows], tid=tid(rank[rows], lane[order]))
    counts = Counts(slices=int((closed & drawn).sum()), pending=int(pend_slice.sum()), instants=int(instant.sum()),
                    left_out=int(unmeasured.sum()),
                    no_wall_clock=int((unmeasured & df["t_enqueue_ns"].notna().to_numpy()).sum()),
                    left_out_ranks=sorted(set(np.unique(rank[unmeasured]).tolist())), older=int((~recent).sum()))
    lanes = {int(r): int(k) for r, k in pd.Series(ops.lane).groupby(ops.rank).max().items()}
    return Placement(ops=ops, t0=t0, dump_at=dumped, lanes=lanes, counts=counts)


def _dump_times(a: Analysis, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Each rank's dump time (wall-clock ns) by rank, and whether its dump gives one."""
    dump_at = np.zeros(size, dtype=np.int64)
    dated = np.zeros(size, dtype=bool)
    for r, d in a.dumps.items():
        t = d.meta.get("dump_time_ns")
        if isinstance(t, int) and not isinstance(t, bool) and t > 0:
            dump_at[r], dated[r] = t, True
    return dump_at, dated


def _recent(df: pd.DataFrame, last_ops: int | None) -> np.ndarray:
    """The rows among each rank's `last_ops` newest entries (the table keeps each rank's in record order)."""
    if last_ops is None:
        return np.ones(len(df), dtype=bool)
    return (df.groupby("rank", sort=False).cumcount(ascending=False) < last_ops).to_numpy()


def _t0(drawn_starts: np.ndarray, dump_at: dict[int, int]) -> int:
    """The earliest drawn time, or of a marker (dump times) when nothing else is dated; 0 if nothing is."""
    candidates = [int(drawn_starts.min())] if len(drawn_starts) else []
    candidates += list(dump_at.values())
    return min(candidates) if candidates else 0


def _end_notes(pend_slice: np.ndarray, instant: np.ndarray, pending: np.ndarray) -> np.ndarray:
    """Per row, what the end of its event stands for when it is not a recorded end (None where it is)."""
    note = np.full(len(pend_slice), None, dtype=object)
    note[pend_slice] = END_PENDING
    note[instant & pending] = END_PENDING_UNDATED
    note[instant & ~pending] = END_NOT_RECORDED
    return note


def _lanes(rank: np.ndarray, ts: np.ndarray, dur: np.ndarray, instant: np.ndarray) -> np.ndarray:
    """A lane per op so that the slices of one lane never overlap: trace viewers nest slices of one
    thread by time, and two ops that overlap (async ops, a batch of isend/irecv, an op pending while
    the rank goes on) are not inside one another. Lane 0 where nothing overlaps (checked column-wise);
    first fit, in start order, on the ranks where something does. Instants stay in lane 0."""
    lane = np.zeros(len(rank), dtype=np.int64)
    spans = np.flatnonzero(~instant)
    if not len(spans):
        return lane
    order = spans[np.lexsort((-dur[spans], ts[spans], rank[spans]))]
    r, s = rank[order], ts[order]
    e = s + dur[order]
    reach = pd.Series(e).groupby(r).cummax().to_numpy()  # the latest end so far, per rank
    same = np.r_[False, r[1:] == r[:-1]]
    clash = same & (s < np.r_[0, reach[:-1]])
    for bad in np.unique(r[clash]).tolist():
        at = np.flatnonzero(r == bad)
        ends: list[int] = []
        for i, start, stop in zip(at.tolist(), s[at].tolist(), e[at].tolist(), strict=True):
            for k, busy_until in enumerate(ends):
                if start >= busy_until:
                    ends[k] = stop
                    lane[order[i]] = k
                    break
            else:
                ends.append(stop)
                lane[order[i]] = len(ends) - 1
    return lane
