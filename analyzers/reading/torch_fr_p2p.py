"""Per-pair sequence numbers for PyTorch-schema send/recv entries: the k-th send a->b pairs with the
k-th recv b<-a.

Why apart: the recorders number transfers per group, or not at all, and their rings wrap independently
on each side; lining the two sides up takes two steps at different times (each rank's ring anchored on
its last completed transfer while it is read, `_pair_seq`; every pair renumbered from 1 once all ranks
are merged, `renumber_anchored_pairs`), and both must agree on PAIR_ANCHOR.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..keys import group_ids
from .codes import Coded

PAIR_ANCHOR = 1 << 20  # a pair's last completed transfer: see _pair_seq (rings hold far fewer entries; the
# loader renumbers the pairs from 1 once every rank is read: renumber_anchored_pairs)


def _pair_seq(pair: np.ndarray, done: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-pair sequence numbers of send/recv rows (k-th send a->b pairs with the k-th recv b<-a), and
    which rows were anchored. `pair`: each row's (group, op, peer) as one id.

    Counting from the oldest entry kept breaks once the ring wrapped: the two sides dropped different
    numbers of older ops. A completed transfer completed on both sides, so each side's last completed
    op of a pair is the same transfer: numbering every op of the pair from it (at PAIR_ANCHOR) lines the
    two sides up whatever each ring dropped. A pair with nothing completed on record (or a recorder
    that cannot see completion) is counted from its oldest entry kept.
    """
    position = _cumcount(pair) + 1
    last_done = np.zeros(int(pair.max()) + 1, dtype=np.int64)
    np.maximum.at(last_done, pair, np.where(done, position, 0))
    anchor = last_done[pair]
    anchored = anchor > 0
    return np.where(anchored, PAIR_ANCHOR + position - anchor, position), anchored


def renumber_anchored_pairs(table: dict[str, Any]) -> dict[str, Any]:
    """The merged columns (before they become the entry table) with PyTorch-format transfers numbered
    from 1 again, per pair; `seq` is changed in place.

    `_pair_seq` numbers a pair's transfers around PAIR_ANCHOR on each rank alone (so that both sides
    line up however their rings wrapped); the report would show those numbers ("send, seq 1048577").
    Once every rank is read, each pair (group, sender, receiver) is shifted by one amount on both
    sides, so its oldest transfer either side still holds is 1: the same alignment, numbers a person
    can read."""
    seq = table.get("seq")
    if not isinstance(seq, np.ndarray) or not len(seq):
        return table

    def equals(name: str, value: str) -> np.ndarray | None:
        column = table.get(name)
        if not isinstance(column, Coded) or value not in column.cats:
            return None
        return column.codes == column.cats.index(value)

    from_torch, p2p = equals("source", "torch_fr"), equals("kind", "p2p")
    if from_torch is None or p2p is None:
        return table
    rows = np.flatnonzero(from_torch & p2p & (seq > PAIR_ANCHOR // 2))
    if not len(rows):
        return table
    rank, peer = table["rank"][rows], table["peer"][rows]
    sends = equals("op", "send")
    send = sends[rows] if sends is not None else np.zeros(len(rows), dtype=bool)
    group = table["group"].codes[rows].astype(np.int64)
    pair = group_ids([group, np.where(send, rank, peer), np.where(send, peer, rank)])
    lowest = np.full(int(pair.max()) + 1, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(lowest, pair, seq[rows])
    seq[rows] -= lowest[pair] - 1
    return table


def _cumcount(key: np.ndarray) -> np.ndarray:
    """Each row's position (from 0) among the earlier rows with its key."""
    order = np.argsort(key, kind="stable")
    ordered = key[order]
    first = np.ones(len(key), dtype=bool)
    first[1:] = ordered[1:] != ordered[:-1]
    starts = np.flatnonzero(first)
    position = np.arange(len(key)) - starts[np.cumsum(first) - 1]
    out = np.empty(len(key), dtype=np.int64)
    out[order] = position
    return out
