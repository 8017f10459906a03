"""Sends whose payload (shapes, dtypes) differs from their matching receive's.

Why apart from the collective vote: a p2p pair has no majority, only two sides, and the dumps cannot
tell which side is wrong, so both are named; the pairs come from the one send-to-receive join
(transfers.py) that the link timing shares.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .mismatch import Mismatch, code_text
from .transfers import Transfers


def p2p_mismatches(entries: pd.DataFrame, transfers: Transfers) -> list[Mismatch]:
    """Sends whose payload (shapes, dtypes) differs from their matching receive's.

    Compared as integer codes at the matched pairs' rows: at scale there are millions of transfers
    and a handful of distinct payloads, and strings are made only for the pairs that differ.
    """
    if not len(transfers):
        return []
    send, recv = transfers.send, transfers.recv
    payload: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    labels: dict[str, pd.Index] = {}
    for name, (ins, outs) in {"shapes": ("in_shapes", "out_shapes"), "dtypes": ("in_dtypes", "out_dtypes")}.items():
        a, b = pd.Categorical(entries[ins]), pd.Categorical(entries[outs])
        remap_in, remap_out, cats = _shared_codes(a, b)
        empty = np.flatnonzero(cats == "[]") if name == "shapes" else np.empty(0, dtype=np.int64)
        # a send's payload is its input, a receive's its output
        payload[name] = (_carried(remap_in[a.codes[send]], remap_out[b.codes[send]], empty),
                         _carried(remap_out[b.codes[recv]], remap_in[a.codes[recv]], empty))
        labels[name] = cats
    group = pd.Categorical(entries["group"])
    rank = entries["rank"].to_numpy()
    seq = entries["seq"].to_numpy()
    out: list[Mismatch] = []
    for name in ("shapes", "dtypes"):
        sent, received = payload[name]
        for i in np.flatnonzero(sent != received):  # only the pairs that differ
            s_row, r_row = int(send[i]), int(recv[i])
            sv, rv = code_text(labels[name], int(sent[i])), code_text(labels[name], int(received[i]))
            src, dst = int(rank[s_row]), int(rank[r_row])
            out.append(
                Mismatch(
                    group=str(group[s_row]),
                    seq=int(seq[s_row]),
                    field=name,
                    ranks=sorted({src, dst}),
                    values={f"send {sv}": [src], f"recv {rv}": [dst]},
                    expected=sv,
                    op="send/recv",
                    kind="p2p",
                    extra={"src": src, "dst": dst},
                )
            )
    return out


def _shared_codes(a: pd.Categorical, b: pd.Categorical) -> tuple[np.ndarray, np.ndarray, pd.Index]:
    """One set of categories for two categoricals, and each one's code -> shared code table (its
    last slot, for code -1, is -1), so codes gathered at any rows compare as ints."""
    cats = a.categories.append(b.categories).unique()
    return np.append(cats.get_indexer(a.categories), -1), np.append(cats.get_indexer(b.categories), -1), cats


def _carried(own: np.ndarray, other: np.ndarray, empty: np.ndarray) -> np.ndarray:
    """The payload codes an op carries: its own side's, or the other side's where its own is empty."""
    return np.where((own < 0) | np.isin(own, empty), other, own)
