"""Slow point-to-point links: each (sender, receiver) pair's median transfer time, and the pairs far
slower than the others.

Why apart from the slow ranks: a link is judged on the transfers alone (the later side of each, which
waited least), not on who held whom up; its table is kept (`SlowResult.links`, the sender x receiver
matrix built from it only when asked).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ..constants import MIN_LATE_MS
from ..diagnosis.transfers import Transfers, pair_transfers
from ..keys import is_value
from .arrays import _gather

SLOW_LINK_RATIO = 2.0


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


def slow_links(links: pd.DataFrame) -> list[dict[str, Any]]:
    """The links (`p2p_links`) at least SLOW_LINK_RATIO times slower than the median of the others and
    at least MIN_LATE_MS long, slowest relative to the others first."""
    found: list[dict[str, Any]] = []
    if len(links) < 2:
        return found
    ratio = links["transfer_ms"].to_numpy() / np.maximum(_median_of_the_others(links["transfer_ms"].to_numpy()), 1e-3)
    slow = links[(ratio >= SLOW_LINK_RATIO) & (links["transfer_ms"].to_numpy() >= MIN_LATE_MS)]
    for row, r in zip(slow.itertuples(index=False), ratio[slow.index.to_numpy()], strict=True):  # only slow links
        found.append({"src": int(row.src), "dst": int(row.dst),
                      "transfer_ms_median": round(float(row.transfer_ms), 3),
                      "ratio": round(float(r), 2), "count": int(row.count)})
    found.sort(key=lambda link: -link["ratio"])
    return found


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
