"""The lateness table: every member of every complete blocking collective and transfer, with how late
it was (`late_ns`) and how much of that its own work explains (`own_late_ns`).

Why its own module: everything the timing concludes (scores, costs, patterns, clock offsets) is read
off this one table, and it is the one part that can be computed elsewhere: the ops split by whole groups,
each part timed alone (a Dask task), joined back numbered exactly as one pass numbers them.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from ..keys import dense_ids, first_rows, group_ids, is_value
from .arrays import _int32, _per_id
from .blocking_ops import _blocking_ops


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
