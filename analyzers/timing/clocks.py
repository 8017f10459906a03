"""Where the timing uses clocks across hosts, and only there.

Why apart: lateness is measured on each rank's own clock (timing/lateness.py) and never needs the
others'; wall clocks serve only to report each rank's offset (members leave a blocking collective at
almost the same instant) and to estimate the end of ops that have none recorded (C++-issued ones on
gloo), whose precision is then the hosts' clock offsets.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..keys import group_ids, is_value
from .arrays import _codes, _gather, _per_id


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
