"""Each send joined to its receive, once per analysis (the payload check and the link timing share it)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..keys import is_value, pack_keys

TRANSFER_KEY = ("group", "src", "dst", "seq")


@dataclass
class Transfers:
    """Every send of the entry table matched to its receive, as two row positions per pair.

    Why one object: the payload check (matching) and the link timing (stragglers) need the same
    join, which at 16k ranks in a pipeline is millions of rows and a second or more per join.
    """

    send: np.ndarray  # row positions in the entry table
    recv: np.ndarray

    def __len__(self) -> int:
        return len(self.send)


def pair_transfers(entries: pd.DataFrame) -> Transfers:
    """Each send (kind p2p, op send, known peer and seq) joined to its receive on (group, src, dst,
    seq): one packed int64 key when it fits, several times cheaper than merging on four columns."""
    if "peer" not in entries.columns or entries.empty:
        return Transfers(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
    seq, peer = entries["seq"].to_numpy(), entries["peer"].to_numpy()
    rows = np.flatnonzero(is_value(entries["kind"], "p2p") & (seq > 0) & (peer >= 0))
    if not len(rows):
        return Transfers(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
    is_send = is_value(entries["op"], "send")[rows]
    rank, peer = entries["rank"].to_numpy()[rows], peer[rows]
    table = pd.DataFrame({
        "group": pd.Categorical(entries["group"]).codes[rows], "seq": seq[rows],
        "src": np.where(is_send, rank, peer), "dst": np.where(is_send, peer, rank), "row": rows,
    })
    packed = pack_keys([table[c].to_numpy() for c in TRANSFER_KEY])
    if packed is not None:
        pairs = _join_on_unique(packed[is_send], packed[~is_send])
        if pairs is not None:
            return Transfers(rows[is_send][pairs[0]], rows[~is_send][pairs[1]])
    on = ["key"] if packed is not None else list(TRANSFER_KEY)
    if packed is not None:
        table = table[["row"]].assign(key=packed)
    pairs = table[is_send].merge(table.loc[~is_send, [*on, "row"]], on=on, suffixes=("_s", "_r"))
    return Transfers(pairs["row_s"].to_numpy(), pairs["row_r"].to_numpy())


def _join_on_unique(left: np.ndarray, right: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Inner join of two int64 key arrays as (left positions, right positions), in left order (as
    pandas' merge gives), by sorting `right` and searching it: no hash table over millions of keys.
    None when a key repeats in `right` (the caller then merges)."""
    order = np.argsort(right, kind="stable")
    ordered = right[order]
    if len(ordered) > 1 and bool((ordered[1:] == ordered[:-1]).any()):
        return None
    at = np.minimum(np.searchsorted(ordered, left), max(len(ordered) - 1, 0))
    hit = np.flatnonzero(ordered[at] == left) if len(ordered) else np.zeros(0, dtype=np.int64)
    return hit, order[at[hit]]
