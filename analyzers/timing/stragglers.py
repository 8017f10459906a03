"""Slow ranks and slow links from timing, without trusting clocks across hosts.

In a blocking collective the early members wait for the last one, so each member's own duration
(completion minus enqueue, both on its own clock) already orders them: the last to arrive waits
least. A member's lateness in one collective is the longest duration there minus its own, and the
part of it its own compute explains is its own lateness. Ranks are then compared with robust
statistics over many collectives (median own lateness, a MAD-based score, and how often each held
the others up the most), so one hiccup does not make a straggler and a persistent 5% does.
Clocks are only used to report each rank's offset, estimated from the collectives themselves:
members leave a blocking collective at almost the same instant.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Any

import numpy as np
import pandas as pd

from ..constants import MIN_LATE_MS
from ..diagnosis.transfers import Transfers, pair_transfers
from ..keys import dense_ids, first_rows, fits_int32, group_ids, ids_within_ranks, is_value, pack_keys
from ..reading.sample import MIN_COMPUTE_NS, compute_gaps
from ..textutil import ranges

MIN_SCORE = 3.5  # robust z-score a persistent straggler must reach
MIN_VOTE_SHARE = 0.6  # ... and hold the most own lateness in at least this share of its collectives
# (of its transfers to one peer: a slow first pipeline stage is late on the send after its compute and
# not on the one right after it, so half; its median own lateness must still reach MIN_LATE_MS)
P2P_VOTE_SHARE = 0.5
# MIN_LATE_MS (constants): ... by at least this much (median), so scheduler jitter never qualifies
# ... 3 ms where collectives' ends are estimated (C++-issued ones on gloo: the last member's start): the
# precision of that estimate on a loaded host, where the autograd thread that issues DDP's buckets waits
# for a core (a healthy 4-rank DDP job on 2 cores had one rank ~2 ms late in 65% of its buckets, 2 runs of 10)
ESTIMATED_MIN_LATE_MS = 3.0
# Fewer complete instances than this (in all, or on a channel): no verdict on speed. At 5, a healthy
# 4-rank job on a loaded host named a straggler that had the most own lateness in 3 of 5 ops (by
# chance 1 in 10 per rank); 12 of 20 happens by chance 1 in 1,000 with 4 members.
MIN_INSTANCES = 20
SLOW_LINK_RATIO = 2.0
# Cost: a rank whose own work held the others up for at least this share of the analysed window is
# slow, however rarely (a 30 ms hiccup on every fourth 10 ms step costs the others ~40% of the job)...
MIN_COST_PCT = 2.0
MIN_COST_VOTES = 3  # ... in at least this many collectives (one long hiccup is a one-off, not a straggler)...
NOISE_RATIO = 3.0  # ... and at least this many times the cost of a typical rank (its lower quartile)...
MIN_VOTE_Z = 3.5  # ... holding the others up significantly more often than its share: where every rank
# hiccups now and then at random, each holds them up about 1/size of the time (z: its excess in standard
# deviations of that binomial count); more with more ranks (one in a thousand jobs by chance: FALSE_ALARM)
FALSE_ALARM = 0.001
PERSISTENT_SHARE = 0.6  # patterns: late in at least this share of its collectives
ONE_OFF_SHARE = 0.8  # ... most of the cost from a single collective
PERIODIC_SHARE = 0.75  # ... this share of the gaps between its late collectives equal one period
SHOWN_INSTANCES = 10  # collectives listed per straggler
SHOWN_COSTS = 100  # ranks listed in the report's `costs` (postmortem.rank_cost has them all)


@dataclass
class SlowResult:
    lateness: pd.DataFrame  # one row per member of each complete blocking collective or transfer
    stragglers: list[dict[str, Any]] = field(default_factory=list)
    slow_links: list[dict[str, Any]] = field(default_factory=list)
    links: pd.DataFrame = field(default_factory=pd.DataFrame)  # one row per (src, dst) with transfers
    clock_offsets_ms: dict[int, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    window_ms: float | None = None  # the analysed window the stragglers' `cost_pct` is a share of
    costs: list[dict[str, Any]] = field(default_factory=list)  # the report's `costs`: every rank that cost anything

    @property
    def link_matrix(self) -> pd.DataFrame:
        """Median transfer time (ms), sender rows × receiver columns. Built when asked: at 16k ranks
        in a pipeline it is ~12k × 12k cells (over a gigabyte), nearly all empty."""
        if self.links.empty:
            return pd.DataFrame()
        return self.links.pivot(index="src", columns="dst", values="transfer_ms")


def _ints(series: pd.Series, missing: int = -1) -> np.ndarray:
    return series.to_numpy(dtype="int64", na_value=missing)


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


def _ordered(rank: np.ndarray, t: np.ndarray) -> bool:
    """True when rows are already sorted by rank, then by time (checked in one pass, no sort)."""
    step_rank, step_t = np.diff(rank), np.diff(t)
    return bool(((step_rank > 0) | ((step_rank == 0) & (step_t >= 0))).all())


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


def _narrow(values: np.ndarray) -> type:
    """int32 when every value fits (ranks, sequence numbers, peers), else int64."""
    return np.int32 if fits_int32(values) else np.int64


def _values(column: pd.Series) -> np.ndarray:
    """An Int64 column's values without copying them (nulls hold arbitrary values: mask them first)."""
    array = column.array
    if isinstance(array, pd.arrays.IntegerArray) and array.dtype == "Int64":
        return array._data
    return column.to_numpy(dtype="int64", na_value=0)


def _per_id(reduce: np.ufunc, ids: np.ndarray, values: np.ndarray) -> np.ndarray:
    """`reduce` (np.maximum, np.minimum, np.fmin) of `values` over the rows of each id, back on every
    row: a groupby-transform on small non-negative ids, as one scattered reduction."""
    out = np.zeros(int(ids.max()) + 1 if len(ids) else 0, dtype=values.dtype)
    out[ids] = values  # each id seeded with one of its members' own values (whichever write lands last)
    reduce.at(out, ids, values)
    return out[ids]


def _channels(group_code: np.ndarray, direction: np.ndarray, peer: np.ndarray, p2p: np.ndarray,
              groups: int) -> tuple[np.ndarray, np.ndarray]:
    """Each row's channel, numbered 0..k-1 in order of first appearance, and each channel's first
    row. A collective's channel is its group, so only the transfers' (group, direction, peer) are
    hashed: the collectives' tens of millions of rows are not."""
    raw = group_code.astype(np.int32, copy=True)  # channels are few: 32 bits for these millions of rows
    if len(p2p):
        raw[p2p] = groups + group_ids([group_code[p2p], direction[p2p], peer[p2p]])
    first = first_rows(raw)
    present = np.flatnonzero(first < len(raw))
    order = present[np.argsort(first[present], kind="stable")]  # raw ids in order of first appearance
    renumber = np.full(len(first), -1, dtype=np.int32)
    renumber[order] = np.arange(len(order))
    return renumber[raw], first[order]


def _channel_labels(names: np.ndarray, group_code: np.ndarray, direction: np.ndarray, peer: np.ndarray,
                    first: np.ndarray) -> pd.Index:
    """Each channel's label from its first row: `<group>`, `<group> send to <peer>`, `<group> recv from <peer>`."""
    return pd.Index([f"{names[group_code[i]]}" if direction[i] == 0 else
                     f"{names[group_code[i]]} {'send to' if direction[i] == 1 else 'recv from'} {peer[i]}"
                     for i in first], dtype=object)


def _instances(ops: pd.DataFrame, group_sizes: dict[str, int]) -> tuple[np.ndarray | None, np.ndarray, np.ndarray, pd.Index]:
    """Which ops belong to complete instances, and each one's instance and channel.

    An instance is (group, seq) for a collective, plus the pair for p2p; only complete ones count:
    every member of a collective, both sides of a transfer. Returns the kept rows of `ops` (a boolean
    mask, or None when every row is kept), their instance ids and channel codes, and the channel
    labels (made once per channel, not per row). Rows are selected by masks, not index arrays, and
    every full-length temporary is as narrow as its values allow: at 16k ranks each is ~30 million rows.
    """
    is_p2p = (ops["kind"].cat.codes == 1).to_numpy()
    p2p_all = np.flatnonzero(is_p2p)  # transfers: usually a small share of the rows
    is_send = is_value(ops["op"], "send")
    peer_all = ops["peer"].to_numpy()
    known = (is_send[p2p_all] | is_value(ops["op"], "recv")[p2p_all]) & (peer_all[p2p_all] >= 0)
    usable: np.ndarray | None = None  # None: every row (the usual case: no transfer with an unknown peer)
    if not known.all():
        usable = np.ones(len(is_p2p), dtype=bool)
        usable[p2p_all[~known]] = False
    del p2p_all, known

    def take(values: np.ndarray) -> np.ndarray:  # the usable rows (the column itself when that is all)
        return values if usable is None else values[usable]

    is_send, is_p2p, peer = take(is_send), take(is_p2p), take(peer_all)
    group_code = take(ops["group"].cat.codes.to_numpy())
    rank, seq = take(ops["rank"].to_numpy()), take(ops["seq"].to_numpy())
    p2p = np.flatnonzero(is_p2p)  # transfers: (group, src, dst, seq), hashed over these rows only
    # collectives: (group, seq), a small dense key space, over the collectives' rows (read in place
    # when there are no blocking transfers)
    if len(p2p):
        coll = ~is_p2p
        instance = np.empty(len(is_p2p), dtype=np.int64)
        instance[coll] = dense_ids([group_code[coll], seq[coll]])
        offset = int(instance[coll].max()) + 1 if coll.any() else 0
        del coll
        sends = is_send[p2p]
        src, dst = np.where(sends, rank[p2p], peer[p2p]), np.where(sends, peer[p2p], rank[p2p])
        instance[p2p] = offset + dense_ids([group_code[p2p], src, dst, seq[p2p]])
        del sends, src, dst
    else:
        instance = dense_ids([group_code, seq])
    del rank, seq  # tens of millions of rows: each temporary goes once it has served
    names = np.asarray(ops["group"].cat.categories.astype(str))
    sizes = np.array([group_sizes.get(str(g), 0) for g in names], dtype=np.int32)
    # complete instances, judged per instance (its member count against its group's size, 2 for a
    # transfer), so that no per-row count or size is made
    count = np.bincount(instance)
    required = np.zeros(len(count), dtype=np.int32)
    if len(sizes):
        required[instance] = sizes[group_code]
    required[instance[p2p]] = 2
    complete = (count == required) & (count >= 2)
    del count, required
    direction = np.zeros(len(is_p2p), dtype=np.int8)
    direction[p2p] = np.where(is_send[p2p], 1, 2)
    channel, first = _channels(group_code, direction, peer, p2p, len(names))
    labels = _channel_labels(names, group_code, direction, peer, first)
    del direction, group_code, peer
    if complete.all():  # every instance complete: the ids are 0..k-1 already
        return usable, instance, channel, labels
    keep = complete[instance]
    renumber = np.cumsum(complete) - 1  # the complete instances as 0..k-1, in their order
    if usable is not None:
        usable[usable] = keep  # the usable rows, narrowed to those kept
    return usable if usable is not None else keep, renumber[instance[keep]], channel[keep], labels


LATENESS_COLUMNS = ("rank", "group", "seq", "op", "t_enqueue_ns", "t_complete_ns")


RunParts = Callable[[list[pd.DataFrame], dict[str, int]], list[pd.DataFrame]]


def collective_lateness(entries: pd.DataFrame, group_sizes: dict[str, int], run_parts: RunParts | None = None
                        ) -> pd.DataFrame:
    """Lateness of every member of every complete blocking collective and blocking transfer.

    `late_ns`: the longest wait in the instance minus the member's own (0 for the last to arrive).
    `own_late_ns`: the part of it the member's own work explains: no more than how much longer its
    gap before the op was than the shortest gap there. A rank that arrives late only because it
    was held up in an earlier op by someone else (a pipeline stage behind a slow one, the last
    stage draining) gets little of it; the slow rank gets all of it.

    `run_parts`: times the ops split by group elsewhere (`lateness_of_ops` on each part, e.g. as Dask
    tasks); the result is the same table.
    """
    ops = _blocking_ops(entries)
    if run_parts is not None and len(ops):
        return _lateness_by_group(ops, group_sizes, run_parts)
    return lateness_of_ops(ops, group_sizes)


def lateness_of_ops(ops: pd.DataFrame, group_sizes: dict[str, int]) -> pd.DataFrame:
    """`collective_lateness` of the blocking ops (`_blocking_ops`) of whole groups: every instance lies
    within one group, so the ops can be split by group and each part timed alone (a Dask task)."""
    rows, instance, channel, labels = _instances(ops, group_sizes) if len(ops) else (
        None, np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), pd.Index([], dtype=object))
    # the kept rows of each column (the column itself when every row is kept); ranks and sequence
    # numbers come in 32 bits where they fit (_blocking_ops), instances too: this table stays as long
    # as the analysis
    names = (*LATENESS_COLUMNS, "gap_ns", *(c for c in ("weight", "_at") if c in ops.columns))
    columns = {name: ops[name].array if rows is None else ops[name].array[rows] for name in names}
    del ops, rows
    gap = np.asarray(columns.pop("gap_ns"))
    done = pd.DataFrame(columns, copy=False)
    del columns
    done["instance"] = _int32(instance)
    if "weight" in done.columns and len(done):  # a complete instance stands for its members' largest stride
        done["weight"] = _per_id(np.maximum, instance, done["weight"].to_numpy())
    done["channel"] = pd.Categorical.from_codes(channel, categories=labels)  # one label per (group, direction, peer)
    del channel
    if not len(done):
        return done.assign(late_ns=np.zeros(0, dtype="int64"), own_late_ns=np.zeros(0), gap_known=np.zeros(0, dtype=bool),
                           last=np.zeros(0, dtype=bool))
    # each per-row temporary is ~240 MB at 16k ranks: made after the ops table is gone, reused in place
    duration = done["t_complete_ns"].to_numpy() - done["t_enqueue_ns"].to_numpy()
    last = duration == _per_id(np.minimum, instance, duration)
    late = _per_id(np.maximum, instance, duration)
    late -= duration  # the longest wait in the instance minus the member's own
    del duration
    excess = _per_id(np.fmin, instance, gap)  # fmin: a rank's first op (gap NaN) does not hide the others'
    np.subtract(gap, excess, out=excess)
    np.clip(excess, 0, None, out=excess)
    gap_known = ~np.isnan(gap)  # a rank's first op: start-up skew, not its own work, may explain it
    del gap
    done["late_ns"] = late
    excess[np.isnan(excess)] = np.inf
    done["own_late_ns"] = np.minimum(late, excess)
    done["gap_known"] = gap_known
    done["last"] = last
    return done


PARTS_PER_WORKER = 4  # group parts per cluster worker: the parts' sizes vary with their groups'


def _lateness_by_group(ops: pd.DataFrame, group_sizes: dict[str, int], run_parts: RunParts, parts: int = 8) -> pd.DataFrame:
    """`lateness_of_ops` over parts of whole groups, run by `run_parts`, joined back: rows in the ops'
    order, instances numbered in key order and channels in order of first appearance, as one pass
    over all the ops numbers them, so that the rest of the analysis cannot tell the difference."""
    codes = ops["group"].cat.codes.to_numpy()
    ops = ops.assign(_at=np.arange(len(ops)))
    pieces = run_parts([ops[np.isin(codes, chunk)].reset_index(drop=True) for chunk in _group_chunks(codes, parts)],
                       group_sizes)
    pieces = [p.drop(columns=["instance", "channel"]) for p in pieces if len(p)]
    if not pieces:
        return lateness_of_ops(ops.iloc[:0].drop(columns=["_at"]), group_sizes)
    done = pd.concat(pieces, ignore_index=True)
    done = done.iloc[np.argsort(done["_at"].to_numpy(), kind="stable")].reset_index(drop=True)
    at = done.pop("_at").to_numpy()
    is_p2p = (ops["kind"].cat.codes.to_numpy() == 1)[at]
    send = is_value(ops["op"], "send")[at]
    rank, peer = ops["rank"].to_numpy()[at].astype(np.int64), ops["peer"].to_numpy()[at].astype(np.int64)
    src = np.where(is_p2p, np.where(send, rank, peer), 0)
    dst = np.where(is_p2p, np.where(send, peer, rank), 0)
    instance = dense_ids([is_p2p.astype(np.int64), codes[at].astype(np.int64), src, dst,
                          ops["seq"].to_numpy()[at].astype(np.int64)])
    where = done.columns.get_loc("late_ns")  # the columns in `lateness_of_ops`' order
    done.insert(where, "instance", _int32(instance))
    channel, labels = _channel_of_rows(ops)
    done.insert(where + 1, "channel", pd.Categorical.from_codes(channel[at], categories=labels))
    if "weight" in done.columns:  # a complete instance stands for its members' largest stride
        done["weight"] = _per_id(np.maximum, instance, done["weight"].to_numpy())
    return done


def _group_chunks(codes: np.ndarray, parts: int) -> list[np.ndarray]:
    """Group codes in `parts` runs of about equal rows (a group is never split)."""
    counts = np.bincount(codes[codes >= 0]) if len(codes) else np.zeros(0, dtype=np.int64)
    present = np.flatnonzero(counts)
    if not len(present):
        return []
    edges = np.searchsorted(np.cumsum(counts[present]), np.linspace(0, counts.sum(), parts + 1)[1:-1], side="right")
    return [c for c in np.split(present, np.unique(edges)) if len(c)]


def _channel_of_rows(ops: pd.DataFrame) -> tuple[np.ndarray, pd.Index]:
    """Each op's channel as `_instances` numbers it (over the usable rows: transfers with a known peer), -1 elsewhere."""
    is_p2p = (ops["kind"].cat.codes == 1).to_numpy()
    is_send, peer = is_value(ops["op"], "send"), ops["peer"].to_numpy()
    usable = ~is_p2p | ((is_send | is_value(ops["op"], "recv")) & (peer >= 0))
    group_code = ops["group"].cat.codes.to_numpy()[usable]
    p2p = np.flatnonzero(is_p2p[usable])
    direction = np.zeros(int(usable.sum()), dtype=np.int8)
    direction[p2p] = np.where(is_send[usable][p2p], 1, 2)
    names = np.asarray(ops["group"].cat.categories.astype(str))
    peer = peer[usable]
    channel, first = _channels(group_code, direction, peer, p2p, len(names))
    labels = _channel_labels(names, group_code, direction, peer, first)
    out = np.full(len(ops), -1, dtype=np.int32)
    out[usable] = channel
    return out, labels


def clock_offsets(lateness: pd.DataFrame, wall_offsets: dict[int, int]) -> dict[int, float]:
    """Each rank's clock relative to the others (ms), from when members left the same collective.

    Wall times are taken relative to the earliest exit before they become floats, so the
    median keeps nanosecond precision (a float64 of ~1.7e18 ns would not).
    """
    if lateness.empty or not wall_offsets:
        return {}
    rank = lateness["rank"].to_numpy()
    offset = np.zeros(int(rank.max()) + 1, dtype=np.int64)
    known = {r: o for r, o in wall_offsets.items() if 0 <= r < len(offset)}
    offset[list(known)] = list(known.values())
    wall = lateness["t_complete_ns"].to_numpy().astype(np.int64) + offset[rank]
    wall = (wall - wall.min()).astype("float64")
    instance = lateness["instance"].to_numpy()
    median = pd.Series(wall).groupby(instance).median().to_numpy()  # instances are 0..k-1
    dev = pd.Series(wall - median[instance]).groupby(rank).median()
    return {int(r): round(float(v) / 1e6, 3) for r, v in dev.items()}


@dataclass
class _Holds:
    """Who held each timed instance up and for how long: computed once per analysis for the cost rules
    (rank_costs, _above_chance, cost_pattern), each a pass over every member of every instance."""

    instance: np.ndarray
    rank: np.ndarray
    own: np.ndarray
    held: np.ndarray  # its own lateness, no more than the longest wait it caused there
    vote: np.ndarray  # the most own lateness of its instance, > 0 and at least a quarter of its raw lateness
    gap_known: np.ndarray  # not the rank's first timed op (whose lateness may be start-up skew)
    transfer: np.ndarray  # a send/recv, not a collective
    weight: np.ndarray | None = None  # a sampled read's: how many instances each stands for (costs scale by it)

    def cost(self, rows: np.ndarray) -> np.ndarray:
        """`held` of `rows` (a mask), scaled by the weight when sampled."""
        return self.held[rows] if self.weight is None else self.held[rows] * self.weight[rows]

    @property
    def counted(self) -> np.ndarray:
        """The rows cost counts: collectives after the rank's first timed op."""
        return ~self.transfer & self.gap_known


def _holds(lateness: pd.DataFrame) -> _Holds:
    instance = lateness["instance"].to_numpy()
    late, own = lateness["late_ns"].to_numpy(), lateness["own_late_ns"].to_numpy()
    most = own == _per_id(np.maximum, instance, own)  # no member's own work was longer
    return _Holds(instance=instance, rank=lateness["rank"].to_numpy().astype(np.int64), own=own,
                  held=np.minimum(own, _per_id(np.maximum, instance, late)),
                  vote=most & (own > 0) & (own >= 0.25 * late), gap_known=_gap_known(lateness),
                  transfer=_is_transfer(lateness["channel"]),
                  weight=lateness["weight"].to_numpy() if "weight" in lateness.columns else None)


def _vote_z(h: _Holds, live: np.ndarray, width: int) -> np.ndarray:
    """Per rank id: how far its count of held-up instances among `live` rows exceeds chance, in standard
    deviations. Under shared noise each member of an instance someone held up is the one with
    probability 1/size."""
    size = np.bincount(h.instance[live], minlength=int(h.instance.max()) + 1)
    anyone = np.bincount(h.instance[h.vote & live], minlength=len(size)) > 0
    p = np.where(live & anyone[h.instance], 1.0 / np.maximum(size[h.instance], 1), 0.0)
    votes = np.bincount(h.rank[h.vote & live], minlength=width)
    expected = np.bincount(h.rank, weights=p, minlength=width)
    variance = np.bincount(h.rank, weights=p * (1 - p), minlength=width)
    return (votes - expected) / np.sqrt(np.maximum(variance, 1e-9))


def rank_scores(lateness: pd.DataFrame, min_late_ms: float = MIN_LATE_MS, holds: _Holds | None = None) -> pd.DataFrame:
    """Per rank: its worst channel's median own lateness, votes and share, and a robust (MAD) score.

    A channel is one collective group or one direction to one peer: a slow pipeline stage is late
    on the sends that follow its compute and never on its receives, so taking the median over all
    of its ops would hide it. A vote is an instance where the rank has the most own lateness and
    its own work explains at least a quarter of its wait; lateness counts only in votes, so being
    held up by others (the last pipeline stage draining into a global all_reduce) is never the
    rank's own. Not "arrived last": on a busy host members leave a collective up to milliseconds
    apart, which reorders arrivals at the next one, but not the extra work each did in between.
    """
    h = holds if holds is not None else _holds(lateness)
    own, vote = h.own, h.vote
    rank, channel = lateness["rank"].to_numpy(), lateness["channel"].cat.codes.to_numpy()
    key = ids_within_ranks(rank, channel)  # per (rank, channel)
    first = first_rows(key)
    n = np.bincount(key)
    votes = np.bincount(key[vote], minlength=len(n))
    per_channel = pd.DataFrame({
        "rank": rank[first],
        "channel": pd.Categorical.from_codes(channel[first], dtype=lateness["channel"].dtype),
        "late_ns": _median_with_zeros(key[vote], own[vote], n),
        "votes": votes,
        "n": n,
    }).sort_values(["rank", "channel"], kind="stable")  # (rank, channel) order, as a group-by gives
    per_channel = per_channel[per_channel["n"] >= MIN_INSTANCES]
    if per_channel.empty:
        return pd.DataFrame(columns=["late_ms_median", "votes", "n", "vote_share", "min_share", "score", "channels"])
    per_channel["vote_share"] = per_channel["votes"] / per_channel["n"]
    per_channel["min_share"] = np.where(_is_transfer(per_channel["channel"]), P2P_VOTE_SHARE, MIN_VOTE_SHARE)
    per_channel["qualifies"] = (per_channel["late_ns"] / 1e6 >= min_late_ms) & (per_channel["vote_share"] >= per_channel["min_share"])
    # the worst channel that qualifies stands for the rank (else its worst): a slow stage late on
    # three channels must not be judged by the one where noise left it a vote short
    worst = per_channel.sort_values(["rank", "qualifies", "late_ns", "vote_share"], ascending=[True, False, False, False])
    per = worst.groupby("rank").head(1).set_index("rank")
    per["late_ms_median"] = per["late_ns"] / 1e6
    center = float(per["late_ms_median"].median())
    mad = float((per["late_ms_median"] - center).abs().median()) * 1.4826
    spread = max(mad, 0.1)  # ms: a floor so near-identical ranks do not divide by ~0
    per["score"] = (per["late_ms_median"] - center) / spread
    slow_channels = per_channel[per_channel["qualifies"]]
    slow_channels = slow_channels.sort_values("late_ns", ascending=False)  # worst channel first
    per["channels"] = slow_channels.assign(channel=slow_channels["channel"].astype(str)).groupby(
        "rank", sort=False)["channel"].agg(list)
    per["channels"] = per["channels"].apply(lambda c: c if isinstance(c, list) else [])
    return per


def rank_costs(lateness: pd.DataFrame, holds: _Holds | None = None) -> pd.DataFrame:
    """Per rank: what its own work cost the others (`cost_ns`: the summed time it held up the
    collectives where it had the most own lateness), in how many (`votes`) of its `n` timed ops,
    the analysed window (`window_ns`), its median own lateness where it held them up, and how far
    above chance it did (`vote_z`, see _vote_z). `holds`: _holds(lateness), when the caller has it.

    Why cost and not a median: a rank 30 ms slow on every fourth step has a median lateness of zero,
    yet the others wait for it a quarter of the time; two equally slow ranks each hold half the votes.
    Counted over collectives only: on transfers a pipeline's fill and drain make some stage hold up
    its neighbour in every step by design (the bubble), which is no rank's fault; slow stages are
    found by their share of a transfer channel (rank_scores).
    """
    cols = ["cost_ns", "votes", "n", "window_ns", "late_ns_when_late", "vote_z"]
    if lateness.empty:
        return pd.DataFrame(columns=cols)
    h = holds if holds is not None else _holds(lateness)
    vote = h.vote & h.counted
    rank = h.rank
    width = int(rank.max()) + 1
    enq, comp = lateness["t_enqueue_ns"].to_numpy(), lateness["t_complete_ns"].to_numpy()
    n = np.bincount(rank, minlength=width)
    present = np.flatnonzero(n)
    first = np.full(width, np.iinfo(np.int64).max, dtype=np.int64)
    last = np.full(width, np.iinfo(np.int64).min, dtype=np.int64)
    np.minimum.at(first, rank, enq.astype(np.int64))  # scattered reductions: no group-by over every row
    np.maximum.at(last, rank, comp.astype(np.int64))
    window = float(np.median(last[present] - first[present]))
    out = pd.DataFrame(index=pd.Index(present, name="rank"))
    out["n"] = n[present]
    out["window_ns"] = window
    out["cost_ns"] = np.bincount(rank[vote], weights=h.cost(vote), minlength=width)[present]
    out["votes"] = np.bincount(rank[vote], minlength=width)[present].astype(int)
    voted = pd.Series(h.own[vote]).groupby(rank[vote]).median()  # the voting rows only: few
    out["late_ns_when_late"] = voted.reindex(out.index, fill_value=0.0)
    out["vote_z"] = _vote_z(h, h.counted, width)[present]
    return out


def _above_chance(h: _Holds, candidates: set[int], z_min: float) -> set[int]:
    """The candidates that hold the others up more often than chance, found step by step: the most
    significant first, then the others over the collectives it did not hold up (two equally slow ranks
    split the votes, so against all collectives the second looks barely above its share)."""
    remaining = np.ones(int(h.instance.max()) + 1 if len(h.instance) else 0, dtype=bool)
    width = int(h.rank.max()) + 1 if len(h.rank) else 0
    chosen: set[int] = set()
    while True:
        z = _vote_z(h, h.counted & remaining[h.instance], width)
        passing = [r for r in candidates - chosen if z[r] >= z_min]
        if not passing:
            return chosen
        best = max(float(z[r]) for r in passing)
        now = {r for r in passing if z[r] == best}  # equals: all of them, never the lowest rank
        chosen |= now
        remaining[h.instance[h.vote & h.counted & np.isin(h.rank, list(now))]] = False


def cost_pattern(lateness: pd.DataFrame, rank: int, holds: _Holds | None = None) -> dict[str, Any]:
    """A slow rank's cost (`cost_ns`, and `by_group` in ms) and how it is spread (`pattern`:
    `persistent`, `periodic` with its `period` counted in the rank's own collectives, `intermittent` or
    `one-off`); the first collectives involved (`instances`, `group:seq`); and the `share` of its
    collectives where it held the others up by more than jitter. Per straggler only: a handful of
    ranks, not every rank of the job. `holds`: _holds(lateness), when the caller has it."""
    h = holds if holds is not None else _holds(lateness)
    mine = h.rank == rank
    vote = (h.vote & h.gap_known)[mine]
    coll = ~h.transfer[mine]
    if (vote & coll).any():  # else a slow pipeline stage, found on its transfers: its cost is theirs
        vote &= coll
    held_all = h.held[mine]
    costs = h.cost(mine)
    cost = float(costs[vote].sum())
    groups = lateness["group"].astype(str).to_numpy()[mine]
    by_group = pd.Series(costs[vote]).groupby(groups[vote]).sum().sort_values(ascending=False)
    vote &= held_all >= MIN_COMPUTE_NS  # the pattern of the holds that matter, not of jitter's
    held = held_all[vote]
    rank_instances = h.instance[mine]
    part = pd.DataFrame({"instance": rank_instances[vote], "held": held,
                         "group": lateness["group"].to_numpy()[mine][vote], "seq": lateness["seq"].to_numpy()[mine][vote]})
    # the share of its collectives it held up; a sampled read counts each kept one for its stride
    weight = np.ones(int(mine.sum())) if h.weight is None else h.weight[mine].astype(np.float64)
    share = float(weight[vote].sum()) / max(float(weight.sum()), 1.0)
    pattern, period, involved = _pattern(part, share, np.sort(rank_instances))
    return {"cost_ns": cost, "pattern": pattern, "period": period, "instances": involved,
            "share": share,
            "by_group": {str(g): round(float(v) / 1e6, 3) for g, v in by_group.items()}}


def _pattern(part: pd.DataFrame, share: float, rank_instances: np.ndarray) -> tuple[str, int | None, list[str]]:
    if part.empty:
        return "intermittent", None, []
    part = part.sort_values("instance")
    shown = [f"{g}:{int(s)}" for g, s in zip(part["group"].astype(str), part["seq"], strict=True)][:SHOWN_INSTANCES]
    held = part["held"].to_numpy()
    if len(part) == 1 or (held.sum() > 0 and held.max() >= ONE_OFF_SHARE * held.sum()):
        return "one-off", None, shown
    if share >= PERSISTENT_SHARE:
        return "persistent", None, shown
    position = np.searchsorted(rank_instances, part["instance"].to_numpy())  # its k-th collective
    gaps = np.diff(position)
    if len(gaps) >= 2:
        values, counts = np.unique(gaps, return_counts=True)
        top = int(np.argmax(counts))
        if values[top] > 1 and counts[top] >= PERIODIC_SHARE * len(gaps):
            return "periodic", int(values[top]), shown
    return "intermittent", None, shown


def _gap_known(lateness: pd.DataFrame) -> np.ndarray:
    if "gap_known" in lateness.columns:
        return lateness["gap_known"].to_numpy(dtype=bool)
    return np.ones(len(lateness), dtype=bool)


def _is_transfer(channel: pd.Series) -> np.ndarray:
    """Channels of transfers (`<group> send to <peer>`, `<group> recv from <peer>`), not collectives."""
    labels = np.asarray([" send to " in str(c) or " recv from " in str(c) for c in channel.cat.categories] + [False])
    codes = channel.cat.codes.to_numpy()
    return labels[np.where(codes >= 0, codes, len(labels) - 1)]


def _median_with_zeros(key: np.ndarray, values: np.ndarray, n: np.ndarray) -> np.ndarray:
    """Per key 0..k-1: the median of its `values` (all > 0) together with `n[key]` minus their
    count zeros. Only the few voting rows are sorted: the zeros are known to come first."""
    order = _order_by(key, values)
    key, values = key[order], values[order]
    count = np.bincount(key, minlength=len(n))
    start = np.concatenate([[0], np.cumsum(count)[:-1]])
    zeros = n - count

    def at(i: np.ndarray) -> np.ndarray:  # the i-th smallest of each key's n values
        inside = i >= zeros
        where = np.where(inside, start + i - zeros, 0)
        return np.where(inside, values[np.minimum(where, max(len(values) - 1, 0))] if len(values) else 0.0, 0.0)

    return (at((n - 1) // 2) + at(n // 2)) / 2


def _order_by(key: np.ndarray, values: np.ndarray) -> np.ndarray:
    """`np.lexsort((values, key))`. Lateness is whole nanoseconds: then both go into one int64 and
    one argsort (~10x faster than lexsort's two passes over millions of votes at 16k ranks)."""
    whole = bool(np.isfinite(values).all()) and bool((values == np.floor(values)).all()) if len(values) else False
    packed = pack_keys([key, values.astype(np.int64)]) if whole and float(np.abs(values).max()) < 2.0**62 else None
    return np.lexsort((values, key)) if packed is None else np.argsort(packed, kind="stable")


def p2p_links(entries: pd.DataFrame, transfers: Transfers | None = None) -> pd.DataFrame:
    """Per (src, dst): median transfer time of completed, matched sends and receives (ms).
    `transfers`: the table's sends joined to their receives, when the caller has them already."""
    none = pd.DataFrame(columns=["src", "dst", "transfer_ms", "count"])
    pairs = pair_transfers(entries) if transfers is None else transfers
    if not len(pairs):
        return none
    rows = np.concatenate([pairs.send, pairs.recv])  # only the paired rows' columns are gathered
    enq, comp = _gather(entries["t_enqueue_ns"], rows), _gather(entries["t_complete_ns"], rows)
    timed = is_value(entries["state"], "completed")[rows] & (enq >= 0) & (comp >= 0)
    duration = comp - enq
    n = len(pairs)
    both = timed[:n] & timed[n:]
    if not both.any():
        return none
    rank = _gather(entries["rank"], rows)
    # the side that arrived later waited least: its duration is closest to the transfer itself
    links = pd.DataFrame({"src": rank[:n][both], "dst": rank[n:][both],
                          "transfer_ms": np.minimum(duration[:n], duration[n:])[both] / 1e6})
    return links.groupby(["src", "dst"]).agg(transfer_ms=("transfer_ms", "median"), count=("transfer_ms", "size")).reset_index()


def _median_of_the_others(values: np.ndarray) -> np.ndarray:
    """For each value, the median of all the other values (exact, one sort for all)."""
    order = np.argsort(values, kind="stable")
    v = values[order]
    n = len(v)
    position = np.empty(n, dtype="int64")
    position[order] = np.arange(n)

    def rest(j: int) -> np.ndarray:  # the j-th smallest value once each element is left out
        return np.where(j < position, v[min(j, n - 1)], v[min(j + 1, n - 1)])

    m = (n - 1) // 2
    return rest(m) if (n - 1) % 2 else (rest(m - 1) + rest(m)) / 2


def _estimated_completions(entries: pd.DataFrame, wall_offsets: dict[int, int]) -> tuple[pd.DataFrame, int]:
    """Completed blocking collectives with a measured enqueue but no completion time (C++-issued ones on
    gloo: PyTorch's recorder stamps their creation, nobody their end) get an estimated end: the last
    member's enqueue, on wall clocks. The op cannot end before its last member arrives, and ends soon
    after on a collective that only waited for it: the estimate is short by the transfer and off by
    the hosts' clock offsets. Returns the entries (a new frame only when some were estimated) and how
    many were."""
    if entries.empty or not wall_offsets:
        return entries, 0
    enq_col, comp_col = entries["t_enqueue_ns"], entries["t_complete_ns"]
    if "source" not in entries.columns:
        return entries, 0
    need = (is_value(entries["kind"], "coll") & is_value(entries["state"], "completed") & is_value(entries["source"], "c++")
            & ~entries["is_async"].to_numpy(dtype=bool, na_value=False)
            & ~enq_col.isna().to_numpy() & comp_col.isna().to_numpy() & (_gather(entries["seq"]) > 0))
    rows = np.flatnonzero(need)
    if not len(rows):
        return entries, 0
    rank = _gather(entries["rank"], rows)
    offset = np.zeros(int(rank.max()) + 1, dtype=np.int64)
    known = np.zeros(len(offset), dtype=bool)
    for r, o in wall_offsets.items():
        if 0 <= r < len(offset):
            offset[r], known[r] = o, True
    keep = known[rank]  # a rank whose clock cannot be put on the wall clock is left out
    rows, rank = rows[keep], rank[keep]
    if not len(rows):
        return entries, 0
    group, _ = _codes(entries["group"])
    instance = group_ids([group[rows].astype(np.int64), _gather(entries["seq"], rows)])
    wall = _gather(enq_col, rows) + offset[rank]
    latest = _per_id(np.maximum, instance, wall)
    filled = comp_col.array.copy()
    filled[rows] = latest - offset[rank]
    return entries.assign(t_complete_ns=filled), len(rows)


def find_slow(entries: pd.DataFrame, group_sizes: dict[str, int], wall_offsets: dict[int, int],
              members: dict[str, list[int]] | None = None, transfers: Transfers | None = None,
              run_parts: RunParts | None = None) -> SlowResult:
    entries, estimated = _estimated_completions(entries, wall_offsets)
    lateness = collective_lateness(entries, group_sizes, run_parts)
    result = SlowResult(lateness=lateness, clock_offsets_ms=clock_offsets(lateness, wall_offsets))
    untimed = int(entries["is_async"].to_numpy(dtype=bool, na_value=False).sum()) if len(entries) else 0
    if untimed:
        result.notes.append(f"{untimed} async ops are left out of the timing: their completion says when the backend "
                            "finished, not how long a rank waited for its peers (that shows in the op it next blocks in)")
    links = p2p_links(entries, transfers)
    result.links = links
    if len(links) >= 2:
        ratio = links["transfer_ms"].to_numpy() / np.maximum(_median_of_the_others(links["transfer_ms"].to_numpy()), 1e-3)
        slow = links[(ratio >= SLOW_LINK_RATIO) & (links["transfer_ms"].to_numpy() >= MIN_LATE_MS)]
        for row, r in zip(slow.itertuples(index=False), ratio[slow.index.to_numpy()], strict=True):  # only slow links
            result.slow_links.append({"src": int(row.src), "dst": int(row.dst),
                                      "transfer_ms_median": round(float(row.transfer_ms), 3),
                                      "ratio": round(float(r), 2), "count": int(row.count)})
        result.slow_links.sort(key=lambda link: -link["ratio"])
    instances = int(lateness["instance"].max()) + 1 if len(lateness) else 0  # numbered 0..k-1 (_instances)
    if instances < MIN_INSTANCES:
        if instances:
            result.notes.append(f"only {instances} complete blocking ops have timing: too few to tell slow ranks "
                                f"({MIN_INSTANCES} needed)")
        return result
    min_late = ESTIMATED_MIN_LATE_MS if estimated else MIN_LATE_MS
    holds = _holds(lateness)
    per = rank_scores(lateness, min_late, holds)
    persistent = per[(per["score"] >= MIN_SCORE) & (per["vote_share"] >= per["min_share"])
                     & (per["late_ms_median"] >= min_late)]
    costs = rank_costs(lateness, holds)
    baseline = float(costs["cost_ns"].quantile(0.25)) if len(costs) else 0.0
    window = float(costs["window_ns"].iloc[0]) if len(costs) else 0.0
    costly = costs[(costs["cost_ns"] >= MIN_COST_PCT / 100 * window) & (costs["votes"] >= MIN_COST_VOTES)
                   & (costs["n"] >= MIN_INSTANCES)
                   & (costs["cost_ns"] >= NOISE_RATIO * baseline) & (costs["late_ns_when_late"] >= min_late * 1e6)]
    z_min = max(MIN_VOTE_Z, NormalDist().inv_cdf(1 - FALSE_ALARM / max(len(costs), 1)))
    top = costs[costs["cost_ns"] > 0].sort_values("cost_ns", ascending=False, kind="stable").head(SHOWN_COSTS)
    result.costs = [{"rank": int(r), "cost_ms": round(float(c) / 1e6, 3),
                     "cost_pct": round(100 * float(c) / window, 2) if window > 0 else None, "held_up": int(v)}
                    for r, c, v in zip(top.index, top["cost_ns"], top["votes"], strict=True)]
    significant = _above_chance(holds, set(costly.index), z_min) if len(costly) else set()
    for rank in sorted(set(persistent.index) | significant):
        row = per.loc[rank] if rank in per.index else None
        channels = list(row["channels"]) if row is not None else []
        how = cost_pattern(lateness, int(rank), holds)
        cost, pattern, involved = how["cost_ns"], how["pattern"], how["instances"]
        if rank not in persistent.index and pattern == "one-off":
            continue  # one long stall is not a slow rank (its cost shows in `lateness`)
        result.stragglers.append({
            "rank": int(rank), "cost_ms": round(cost / 1e6, 3),
            "cost_pct": round(100 * cost / window, 2) if window > 0 else None,
            "pattern": pattern, "period": how["period"], "late_share": round(how["share"], 3),
            "cost_by_group_ms": how["by_group"],
            "late_ms_when_late": round(float(costs.at[rank, "late_ns_when_late"]) / 1e6, 3),
            "score": round(float(row["score"]), 2) if row is not None else None,
            "late_ms_median": round(float(row["late_ms_median"]), 3) if row is not None else 0.0,
            "votes": int(row["votes"] if row is not None else costs.at[rank, "votes"]),
            "collectives": int(row["n"] if row is not None else costs.at[rank, "n"]),
            "groups": sorted({c.split(" ", 1)[0] for c in channels} | {i.split(":", 1)[0] for i in involved}),
            "channels": channels, "instances": involved,
        })
    result.stragglers.sort(key=lambda s: -s["cost_ms"])  # what each cost the others, most first
    if estimated:
        _estimated_note(result, estimated, rank_scores(lateness, MIN_LATE_MS, holds))
    result.window_ms = round(window / 1e6, 3)
    _attribute_groups(result.stragglers, members or {})
    return result


def _estimated_note(result: SlowResult, estimated: int, exact: pd.DataFrame) -> None:
    """Say once, short, that C++-issued ops' ends are estimated, only where it changes the answer: a slow
    rank's figures rest on them, or a rank that the bar for measured ends (`exact`: scored at MIN_LATE_MS)
    would call persistently slow stays under the raised one."""
    late = exact["late_ms_median"].to_numpy(dtype=float) if len(exact) else np.zeros(0)
    would = ((exact["score"] >= MIN_SCORE) & (exact["vote_share"] >= exact["min_share"])).to_numpy(dtype=bool) \
        if len(exact) else np.zeros(0, dtype=bool)
    near = [int(r) for r in exact.index[would & (late >= MIN_LATE_MS) & (late < ESTIMATED_MIN_LATE_MS)]]
    if not result.stragglers and not near:
        return
    why = (f"; rank(s) {ranges(near)} were {MIN_LATE_MS:g}-{ESTIMATED_MIN_LATE_MS:g} ms late, under that bar"
           if near else "")
    result.notes.append(f"{estimated} C++-issued collectives (DDP) have no recorded end: their end is estimated, "
                        f"and a rank must be {ESTIMATED_MIN_LATE_MS:g} ms late to count as slow{why}")


def _attribute_groups(stragglers: list[dict[str, Any]], members: dict[str, list[int]]) -> None:
    """A group whose every member is slow (a slow TP group, a slow node) is named as the scope.

    Its members are then late together towards everyone outside it, which a single slow rank
    never is; `scope` says which reading the evidence supports.
    """
    slow = {s["rank"] for s in stragglers}
    world = len({r for ranks in members.values() for r in ranks})
    whole = sorted((len(ranks), name) for name, ranks in members.items()
                   if 2 <= len(ranks) < world and set(ranks) <= slow)
    for straggler in stragglers:
        scope = next((name for _, name in whole if straggler["rank"] in members[name]), None)
        straggler["scope"] = f"group {scope}" if scope is not None else "rank"
